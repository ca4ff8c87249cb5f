//! The figures of `cargo xtask bench probes` ([`super::probes`]): each
//! window as measured, each condition over all its windows, the ratios
//! between conditions, and the target (a probe storm costs prepare at most
//! [`TARGET`] times what the same storm on a do-nothing path costs).

use std::path::Path;

use serde::Serialize;

use super::measure::{Stats, unix_now};
use super::probe_storm::StormFigures;
use local_cluster::versions::KubernetesVersion;

/// A path of the ops server that answers without doing anything.
pub const NOTHING_PATH: &str = "/nothing";
/// The probe paths the storm of condition `probes` takes in turn.
pub const PROBE_PATHS: &[&str] = &["/healthz", "/readyz"];

/// What to run.
#[derive(Debug, Clone)]
pub struct ProbesOptions {
    /// Rounds; each runs every condition once.
    pub rounds: usize,
    /// Bursts per condition per round.
    pub bursts: usize,
    /// Claims per burst, one call each.
    pub claims: usize,
    /// Storm requests per second.
    pub rate: f64,
    pub kubernetes_version: KubernetesVersion,
    /// Where the release `efa-driver` is.
    pub bin_dir: std::path::PathBuf,
}

/// The most `probes / nothing` may be, on the p50 of prepare calls.
pub const TARGET: f64 = 1.1;

/// What runs beside the bursts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// No storm.
    None,
    /// The storm to `/healthz` and `/readyz`.
    Probes,
    /// The same storm to a path that does nothing.
    Nothing,
}

impl Condition {
    pub const ALL: [Condition; 3] = [Condition::None, Condition::Probes, Condition::Nothing];

    /// The paths its storm takes in turn; `None` without a storm.
    pub fn paths(self) -> Option<&'static [&'static str]> {
        match self {
            Condition::None => None,
            Condition::Probes => Some(PROBE_PATHS),
            Condition::Nothing => Some(&[NOTHING_PATH]),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Condition::None => "none",
            Condition::Probes => "probes",
            Condition::Nothing => "nothing",
        }
    }
}

/// One condition's window in one round.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Window {
    pub round: usize,
    pub condition: Condition,
    /// Every prepare call of the window's bursts, ms.
    pub prepare_ms: Vec<f64>,
    /// Each burst's first call → last answer, ms.
    pub spans_ms: Vec<f64>,
    /// The driver's CPU time per second of the window (storm settling
    /// included), ms; clock ticks of 10 ms, so coarse over short windows.
    pub driver_cpu_ms_per_s: f64,
    /// The machine's 1-minute load average at the end of the window.
    pub load_1m: f64,
    /// What the storm did; `None` without one.
    pub storm: Option<StormFigures>,
}

impl Window {
    /// One line for the progress log.
    pub fn summary(&self) -> String {
        let calls = Stats::of(&self.prepare_ms);
        let spans = Stats::of(&self.spans_ms);
        let storm = self.storm.as_ref().map_or(String::new(), |s| {
            format!(
                "; storm {:.0}/s answered, {} failed, {} skipped",
                s.answered_per_s, s.failed, s.skipped
            )
        });
        format!(
            "round {:>2} {:<8} prepare p50 {:>6.2} ms p99 {:>6.2} ms, span p50 {:>6.1} ms; driver CPU {:>5.1} ms/s; load {:.2}{storm}",
            self.round + 1,
            self.condition.label(),
            calls.p50,
            calls.p99,
            spans.p50,
            self.driver_cpu_ms_per_s,
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
    pub driver_cpu_ms_per_s: f64,
    pub load_1m: Stats,
    /// Mean answered storm rate over the windows; 0 without a storm.
    pub storm_answered_per_s: f64,
    pub storm_failed: u64,
    pub storm_skipped: u64,
}

/// `a / b` of the same figure under two conditions.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Ratios {
    pub prepare_p50: f64,
    pub prepare_p99: f64,
    pub prepare_mean: f64,
    pub span_p50: f64,
}

impl Ratios {
    fn of(a: &ConditionFigures, b: &ConditionFigures) -> Ratios {
        let r = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
        Ratios {
            prepare_p50: r(a.prepare_ms.p50, b.prepare_ms.p50),
            prepare_p99: r(a.prepare_ms.p99, b.prepare_ms.p99),
            prepare_mean: r(a.prepare_ms.mean, b.prepare_ms.mean),
            span_p50: r(a.span_ms.p50, b.span_ms.p50),
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ProbesReport {
    pub node: String,
    pub driver: String,
    pub rounds: usize,
    pub bursts_per_window: usize,
    pub claims_per_burst: usize,
    pub storm_rate_per_s: f64,
    pub probe_paths: Vec<String>,
    pub nothing_path: String,
    pub conditions: Vec<ConditionFigures>,
    /// `probes / none`, `nothing / none`, `probes / nothing`.
    pub probes_over_none: Ratios,
    pub nothing_over_none: Ratios,
    pub probes_over_nothing: Ratios,
    /// The median over rounds of each round's `probes / nothing` on the
    /// prepare p50 (the two windows of a round are seconds apart).
    pub probes_over_nothing_per_round_median: f64,
    pub target: f64,
    /// `probes_over_nothing.prepare_p50 <= target`.
    pub target_met: bool,
    pub windows: Vec<Window>,
    pub finished_unix: f64,
    pub run_dir: String,
}

impl ProbesReport {
    pub fn new(
        options: &ProbesOptions,
        node: &str,
        driver: &str,
        windows: Vec<Window>,
        run_dir: &Path,
    ) -> ProbesReport {
        let conditions: Vec<ConditionFigures> = Condition::ALL
            .iter()
            .map(|c| condition_figures(*c, &windows))
            .collect();
        let [none, probes, nothing] = [&conditions[0], &conditions[1], &conditions[2]];
        let probes_over_nothing = Ratios::of(probes, nothing);
        let per_round: Vec<f64> = (0..options.rounds)
            .filter_map(|round| {
                let p50 = |c: Condition| {
                    let calls: Vec<f64> = windows
                        .iter()
                        .filter(|w| w.round == round && w.condition == c)
                        .flat_map(|w| w.prepare_ms.iter().copied())
                        .collect();
                    Some(Stats::of(&calls).p50).filter(|p| *p > 0.0)
                };
                Some(p50(Condition::Probes)? / p50(Condition::Nothing)?)
            })
            .collect();
        ProbesReport {
            node: node.into(),
            driver: driver.into(),
            rounds: options.rounds,
            bursts_per_window: options.bursts,
            claims_per_burst: options.claims,
            storm_rate_per_s: options.rate,
            probe_paths: PROBE_PATHS.iter().map(|p| (*p).to_owned()).collect(),
            nothing_path: NOTHING_PATH.into(),
            probes_over_none: Ratios::of(probes, none),
            nothing_over_none: Ratios::of(nothing, none),
            probes_over_nothing,
            probes_over_nothing_per_round_median: Stats::of(&per_round).p50,
            target: TARGET,
            target_met: probes_over_nothing.prepare_p50 <= TARGET,
            conditions,
            windows,
            finished_unix: unix_now(),
            run_dir: run_dir.display().to_string(),
        }
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "probe storm against prepare: {} on {}, bursts of {} claims, {} rounds x {} bursts per condition, storm {:.0} requests/s ({} in turn; do-nothing path {})",
                self.driver,
                self.node,
                self.claims_per_burst,
                self.rounds,
                self.bursts_per_window,
                self.storm_rate_per_s,
                self.probe_paths.join(" + "),
                self.nothing_path
            ),
            "| condition | calls | prepare p50 | prepare p99 | mean | burst span p50 | driver CPU | storm answered | load 1m (min-max) |".into(),
            "|---|---|---|---|---|---|---|---|---|".into(),
        ];
        for c in &self.conditions {
            let storm = if c.condition == Condition::None {
                "-".to_owned()
            } else {
                format!(
                    "{:.0}/s ({} failed, {} skipped)",
                    c.storm_answered_per_s, c.storm_failed, c.storm_skipped
                )
            };
            lines.push(format!(
                "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {:.1} ms/s | {storm} | {:.2} ({:.2}-{:.2}) |",
                c.condition.label(),
                c.prepare_ms.n,
                c.prepare_ms.p50,
                c.prepare_ms.p99,
                c.prepare_ms.mean,
                c.span_ms.p50,
                c.driver_cpu_ms_per_s,
                c.load_1m.mean,
                c.load_1m.min,
                c.load_1m.max
            ));
        }
        let ratio = |name: &str, r: &Ratios| {
            format!(
                "{name}: prepare p50 {:.2}x, p99 {:.2}x, mean {:.2}x, span p50 {:.2}x",
                r.prepare_p50, r.prepare_p99, r.prepare_mean, r.span_p50
            )
        };
        lines.push(ratio("probes / none", &self.probes_over_none));
        lines.push(ratio("nothing / none", &self.nothing_over_none));
        lines.push(ratio("probes / nothing", &self.probes_over_nothing));
        lines.push(format!(
            "probes / nothing per round (median of {} rounds): {:.2}x",
            self.rounds, self.probes_over_nothing_per_round_median
        ));
        lines.push(format!(
            "target probes / nothing <= {:.2}x on the prepare p50: {}",
            self.target,
            if self.target_met { "met" } else { "NOT met" }
        ));
        lines
    }
}

fn condition_figures(condition: Condition, windows: &[Window]) -> ConditionFigures {
    let mine: Vec<&Window> = windows
        .iter()
        .filter(|w| w.condition == condition)
        .collect();
    let all = |f: fn(&Window) -> &Vec<f64>| -> Vec<f64> {
        mine.iter().flat_map(|w| f(w).iter().copied()).collect()
    };
    let mean = |values: Vec<f64>| {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        Stats::of(&values).mean
    };
    let storms: Vec<&StormFigures> = mine.iter().filter_map(|w| w.storm.as_ref()).collect();
    ConditionFigures {
        condition,
        prepare_ms: Stats::of(&all(|w| &w.prepare_ms)),
        span_ms: Stats::of(&all(|w| &w.spans_ms)),
        driver_cpu_ms_per_s: mean(mine.iter().map(|w| w.driver_cpu_ms_per_s).collect()),
        load_1m: Stats::of(
            &mine
                .iter()
                .map(|w| w.load_1m)
                .filter(|v| v.is_finite())
                .collect::<Vec<_>>(),
        ),
        storm_answered_per_s: mean(storms.iter().map(|s| s.answered_per_s).collect()),
        storm_failed: storms.iter().map(|s| s.failed).sum(),
        storm_skipped: storms.iter().map(|s| s.skipped).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(round: usize, condition: Condition, calls: &[f64]) -> Window {
        Window {
            round,
            condition,
            prepare_ms: calls.to_vec(),
            spans_ms: vec![calls.iter().copied().fold(0.0, f64::max)],
            driver_cpu_ms_per_s: 10.0,
            load_1m: 2.0,
            storm: None,
        }
    }

    fn options(rounds: usize) -> ProbesOptions {
        ProbesOptions {
            rounds,
            bursts: 1,
            claims: 2,
            rate: 800.0,
            kubernetes_version: local_cluster::versions::KubernetesVersion::parse("v1.37.2")
                .unwrap(),
            bin_dir: "/nonexistent".into(),
        }
    }

    #[test]
    fn ratios_and_target_from_the_windows() {
        let windows = vec![
            window(0, Condition::None, &[10.0, 10.0]),
            window(0, Condition::Probes, &[21.0, 21.0]),
            window(0, Condition::Nothing, &[20.0, 20.0]),
            window(1, Condition::Nothing, &[20.0, 20.0]),
            window(1, Condition::None, &[10.0, 10.0]),
            window(1, Condition::Probes, &[30.0, 30.0]),
        ];
        let report = ProbesReport::new(&options(2), "p5", "efa", windows, Path::new("/run"));
        assert_eq!(report.conditions[1].prepare_ms.n, 4);
        assert!((report.nothing_over_none.prepare_p50 - 2.0).abs() < 1e-9);
        assert!((report.probes_over_none.prepare_p50 - 2.1).abs() < 1e-9);
        assert!((report.probes_over_nothing.prepare_p50 - 1.05).abs() < 1e-9);
        assert!(report.target_met);
        // Per round: 1.05 and 1.5; the p50 of two is the lower.
        assert!((report.probes_over_nothing_per_round_median - 1.05).abs() < 1e-9);
        assert!(report.table().iter().any(|l| l.contains("met")));
    }

    #[test]
    fn a_storm_that_costs_more_than_the_target_is_not_met() {
        let windows = vec![
            window(0, Condition::None, &[10.0]),
            window(0, Condition::Probes, &[20.0]),
            window(0, Condition::Nothing, &[12.0]),
        ];
        let report = ProbesReport::new(&options(1), "p5", "efa", windows, Path::new("/run"));
        assert!(!report.target_met);
        assert!(report.table().iter().any(|l| l.contains("NOT met")));
    }
}
