//! The figures of `cargo xtask bench slowloris` ([`super::slowloris`]):
//! each window as measured, each condition over its windows, and the
//! targets: prepare under the attack at most [`TARGET`] times the quiet
//! figure (p50), every probe answered, the driver's RSS bounded.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::measure::{Stats, unix_now};
use local_cluster::versions::KubernetesVersion;

/// What to run.
#[derive(Debug, Clone)]
pub struct SlowlorisOptions {
    /// Rounds; each runs every condition once.
    pub rounds: usize,
    /// Bursts per condition per round.
    pub bursts: usize,
    /// Claims per burst, one call each.
    pub claims: usize,
    /// New slow connections per second.
    pub rate: f64,
    /// How long the attack runs before the first burst of its window.
    pub settle: Duration,
    pub kubernetes_version: KubernetesVersion,
    /// Where the release `efa-driver` is.
    pub bin_dir: std::path::PathBuf,
}

/// The most `slowloris / quiet` may be, on the p50 of prepare calls.
pub const TARGET: f64 = 1.1;

/// What runs beside the bursts (the prober and the sampler always do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// No attack.
    Quiet,
    /// The attack on the driver's ops port.
    Slowloris,
    /// The same attack on a listener of the bench's own.
    Sink,
}

impl Condition {
    pub const ALL: [Condition; 3] = [Condition::Quiet, Condition::Slowloris, Condition::Sink];

    pub fn label(self) -> &'static str {
        match self {
            Condition::Quiet => "quiet",
            Condition::Slowloris => "slowloris",
            Condition::Sink => "sink",
        }
    }
}

/// What the attacking client did over one window.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct AttackFigures {
    pub target_per_s: f64,
    /// Connections established per second of the attack.
    pub opened_per_s: f64,
    pub window_s: f64,
    pub opened: u64,
    pub connect_failed: u64,
    /// Connections the server closed (evicted, timed out) while held.
    pub closed_by_server: u64,
    /// Connections not opened because the client held its maximum.
    pub skipped: u64,
    /// The most connections the client held open at once.
    pub peak_held: u64,
}

/// One condition's window in one round.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Window {
    pub round: usize,
    pub condition: Condition,
    pub prepare_ms: Vec<f64>,
    pub spans_ms: Vec<f64>,
    /// The driver's highest RSS sampled over the window, KiB.
    pub peak_rss_kib: u64,
    /// The driver's most open file descriptors sampled over the window.
    pub peak_fds: u64,
    /// The driver's CPU time per second of the window (attack settling
    /// included), ms; clock ticks of 10 ms.
    pub driver_cpu_ms_per_s: f64,
    pub probes_ok: u64,
    pub probes_failed: u64,
    /// Each answered probe's time, ms.
    pub probe_ms: Vec<f64>,
    pub load_1m: f64,
    pub attack: Option<AttackFigures>,
}

impl Window {
    /// One line for the progress log.
    pub fn summary(&self) -> String {
        let calls = Stats::of(&self.prepare_ms);
        let probes = Stats::of(&self.probe_ms);
        let attack = self.attack.as_ref().map_or(String::new(), |a| {
            format!(
                "; attack {:.0} conn/s, {} closed by the server, peak held {}, {} connect failures",
                a.opened_per_s, a.closed_by_server, a.peak_held, a.connect_failed
            )
        });
        format!(
            "round {:>2} {:<9} prepare p50 {:>6.2} ms p99 {:>6.2} ms; driver peak RSS {:.1} MiB, fds {}, CPU {:.1} ms/s; probes {} ok {} failed (p50 {:.1} ms, max {:.1} ms); load {:.2}{attack}",
            self.round + 1,
            self.condition.label(),
            calls.p50,
            calls.p99,
            self.peak_rss_kib as f64 / 1024.0,
            self.peak_fds,
            self.driver_cpu_ms_per_s,
            self.probes_ok,
            self.probes_failed,
            probes.p50,
            probes.max,
            self.load_1m
        )
    }
}

/// One condition over all its windows.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ConditionFigures {
    pub condition: Condition,
    pub prepare_ms: Stats,
    pub span_ms: Stats,
    /// The highest of the windows' peak RSS, KiB.
    pub peak_rss_kib: u64,
    pub peak_fds: u64,
    /// Mean over the windows.
    pub driver_cpu_ms_per_s: f64,
    pub probes_ok: u64,
    pub probes_failed: u64,
    pub probe_ms: Stats,
    pub load_1m: Stats,
    /// Mean over the windows; 0 without an attack.
    pub attack_opened_per_s: f64,
    pub attack_peak_held: u64,
    pub attack_closed_by_server: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SlowlorisReport {
    pub node: String,
    pub driver: String,
    /// The driver binary that ran.
    pub binary: String,
    pub rounds: usize,
    pub bursts_per_window: usize,
    pub claims_per_burst: usize,
    pub rate_per_s: f64,
    pub settle_s: f64,
    pub conditions: Vec<ConditionFigures>,
    /// `slowloris / quiet` on the prepare p50.
    pub prepare_p50_ratio: f64,
    pub prepare_p99_ratio: f64,
    /// `slowloris / sink` on the prepare p50 and p99: the driver's own
    /// handling of the attack.
    pub over_sink_p50_ratio: f64,
    pub over_sink_p99_ratio: f64,
    pub target: f64,
    pub target_met: bool,
    /// The driver's `VmHWM` at the end, KiB.
    pub driver_hwm_kib: Option<u64>,
    pub windows: Vec<Window>,
    pub finished_unix: f64,
    pub run_dir: String,
}

impl SlowlorisReport {
    pub fn new(
        options: &SlowlorisOptions,
        driver: &str,
        binary: &str,
        windows: Vec<Window>,
        driver_hwm_kib: Option<u64>,
        run_dir: &Path,
    ) -> SlowlorisReport {
        let conditions: Vec<ConditionFigures> = Condition::ALL
            .iter()
            .map(|c| condition_figures(*c, &windows))
            .collect();
        let r = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
        let (quiet, attack, sink) = (&conditions[0], &conditions[1], &conditions[2]);
        let p50 = r(attack.prepare_ms.p50, quiet.prepare_ms.p50);
        SlowlorisReport {
            node: super::probes::NODE.into(),
            driver: driver.into(),
            binary: binary.into(),
            rounds: options.rounds,
            bursts_per_window: options.bursts,
            claims_per_burst: options.claims,
            rate_per_s: options.rate,
            settle_s: options.settle.as_secs_f64(),
            prepare_p50_ratio: p50,
            prepare_p99_ratio: r(attack.prepare_ms.p99, quiet.prepare_ms.p99),
            over_sink_p50_ratio: r(attack.prepare_ms.p50, sink.prepare_ms.p50),
            over_sink_p99_ratio: r(attack.prepare_ms.p99, sink.prepare_ms.p99),
            target: TARGET,
            target_met: p50 <= TARGET && attack.probes_failed == 0,
            conditions,
            driver_hwm_kib,
            windows,
            finished_unix: unix_now(),
            run_dir: run_dir.display().to_string(),
        }
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "slow connections against prepare: {} on {} ({}), bursts of {} claims, {} rounds x {} bursts per condition, attack {:.0} connections/s (1 byte each, held), {:.0} s before the bursts",
                self.driver,
                self.node,
                self.binary,
                self.claims_per_burst,
                self.rounds,
                self.bursts_per_window,
                self.rate_per_s,
                self.settle_s
            ),
            "| condition | calls | prepare p50 | prepare p99 | driver peak RSS | driver peak fds | driver CPU | /healthz ok / failed | probe p50 / max | attack: opened/s, peak held, closed by server | load 1m |".into(),
            "|---|---|---|---|---|---|---|---|---|---|---|".into(),
        ];
        for c in &self.conditions {
            let attack = if c.condition == Condition::Quiet {
                "-".to_owned()
            } else {
                format!(
                    "{:.0}/s, {}, {}",
                    c.attack_opened_per_s, c.attack_peak_held, c.attack_closed_by_server
                )
            };
            lines.push(format!(
                "| {} | {} | {:.2} ms | {:.2} ms | {:.1} MiB | {} | {:.1} ms/s | {} / {} | {:.1} / {:.1} ms | {attack} | {:.2} |",
                c.condition.label(),
                c.prepare_ms.n,
                c.prepare_ms.p50,
                c.prepare_ms.p99,
                c.peak_rss_kib as f64 / 1024.0,
                c.peak_fds,
                c.driver_cpu_ms_per_s,
                c.probes_ok,
                c.probes_failed,
                c.probe_ms.p50,
                c.probe_ms.max,
                c.load_1m.mean,
            ));
        }
        lines.push(format!(
            "slowloris / quiet: prepare p50 {:.3}, p99 {:.3}; slowloris / sink: p50 {:.3}, p99 {:.3} (target slowloris / quiet p50 <= {} and no failed probe: {}); driver VmHWM {}",
            self.prepare_p50_ratio,
            self.prepare_p99_ratio,
            self.over_sink_p50_ratio,
            self.over_sink_p99_ratio,
            self.target,
            if self.target_met { "met" } else { "NOT met" },
            self.driver_hwm_kib
                .map_or("?".to_owned(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
        ));
        lines
    }
}

fn condition_figures(condition: Condition, windows: &[Window]) -> ConditionFigures {
    let of: Vec<&Window> = windows
        .iter()
        .filter(|w| w.condition == condition)
        .collect();
    let all = |f: fn(&Window) -> &Vec<f64>| -> Vec<f64> {
        of.iter().flat_map(|w| f(w).iter().copied()).collect()
    };
    let attacks: Vec<&AttackFigures> = of.iter().filter_map(|w| w.attack.as_ref()).collect();
    ConditionFigures {
        condition,
        prepare_ms: Stats::of(&all(|w| &w.prepare_ms)),
        span_ms: Stats::of(&all(|w| &w.spans_ms)),
        peak_rss_kib: of.iter().map(|w| w.peak_rss_kib).max().unwrap_or(0),
        peak_fds: of.iter().map(|w| w.peak_fds).max().unwrap_or(0),
        driver_cpu_ms_per_s: if of.is_empty() {
            0.0
        } else {
            of.iter().map(|w| w.driver_cpu_ms_per_s).sum::<f64>() / of.len() as f64
        },
        probes_ok: of.iter().map(|w| w.probes_ok).sum(),
        probes_failed: of.iter().map(|w| w.probes_failed).sum(),
        probe_ms: Stats::of(&all(|w| &w.probe_ms)),
        load_1m: Stats::of(&of.iter().map(|w| w.load_1m).collect::<Vec<_>>()),
        attack_opened_per_s: if attacks.is_empty() {
            0.0
        } else {
            attacks.iter().map(|a| a.opened_per_s).sum::<f64>() / attacks.len() as f64
        },
        attack_peak_held: attacks.iter().map(|a| a.peak_held).max().unwrap_or(0),
        attack_closed_by_server: attacks.iter().map(|a| a.closed_by_server).sum(),
    }
}
