//! The driver benchmark's result: JSON for the history, a table for people.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::breakdown::Breakdown;
use super::burst::Burst;
use super::idle::IdleCost;
use super::measure::{RequestCounts, Stats};
use super::rounds::Round;

/// A process gets a row of its own in the burst table from this much CPU
/// (p50 per burst, either driver's) up; the node's total row counts all.
const PROCESS_ROW_FLOOR_MS: f64 = 20.0;

/// Everything measured of one driver.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct DriverFigures {
    pub label: String,
    pub driver: String,
    pub binary_bytes: u64,
    /// Process spawn → its pool complete in the API (watch event), ms.
    pub start_to_pool_ms: f64,
    /// Kubelet-measured NodePrepareResources, ms (single-call rounds).
    pub prepare_ms: Stats,
    /// Kubelet-measured NodeUnprepareResources, ms (single-call rounds).
    pub unprepare_ms: Stats,
    /// Rounds in which kubelet called prepare or unprepare more than once.
    pub rounds_with_retries: usize,
    /// Pod observed scheduled → observed Running, ms.
    pub scheduled_to_running_ms: Stats,
    pub rss_idle_kib: u64,
    pub rss_after_kib: u64,
    /// `VmHWM`: the peak resident set over the whole run.
    pub rss_peak_kib: u64,
    /// Requests of the driver's identity in the steady window.
    pub steady_requests: RequestCounts,
    /// CPU time and wake-ups over the steady window (`None`: the process's
    /// `/proc` entries could not be read). Reports before this field: absent.
    #[serde(default)]
    pub idle_cost: Option<IdleCost>,
    /// The API server's time for each claim GET of the rounds (audit log:
    /// received → response complete), ms. Reports before this field: absent.
    #[serde(default)]
    pub claim_get_server_ms: Stats,
    /// Kubelet's prepare figure split with the driver's own timing lines.
    #[serde(default)]
    pub breakdown: Option<Breakdown>,
}

/// The driver benchmark's output (`.e2e/bench-<version>.json`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BenchReport {
    pub kubernetes_version: String,
    pub node: String,
    pub instance_type: String,
    pub rounds: usize,
    pub steady_secs: u64,
    pub finished_unix: f64,
    pub ours: DriverFigures,
    pub reference: DriverFigures,
    pub rounds_detail: Vec<Round>,
    /// The bursts ([`super::burst`]). Reports before this field: absent.
    #[serde(default)]
    pub bursts: Vec<Burst>,
    pub run_dir: String,
}

fn ratio(ours: f64, reference: f64) -> String {
    if reference > 0.0 {
        format!("{:.2}x", ours / reference)
    } else {
        "-".into()
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl BenchReport {
    /// The table `cargo xtask bench` prints.
    pub fn table(&self) -> Vec<String> {
        let (o, r) = (&self.ours, &self.reference);
        let mut rows: Vec<(String, String, String, String)> = Vec::new();
        let mut row = |name: &str, a: f64, b: f64, unit: &str, digits: usize| {
            rows.push((
                name.to_string(),
                format!("{a:.digits$} {unit}"),
                format!("{b:.digits$} {unit}"),
                ratio(a, b),
            ));
        };
        for (name, a, b) in [
            ("NodePrepareResources", &o.prepare_ms, &r.prepare_ms),
            ("NodeUnprepareResources", &o.unprepare_ms, &r.unprepare_ms),
        ] {
            row(&format!("{name} mean"), a.mean, b.mean, "ms", 2);
            row(&format!("{name} p50"), a.p50, b.p50, "ms", 2);
            row(&format!("{name} p99"), a.p99, b.p99, "ms", 2);
        }
        let (a, b) = (&o.claim_get_server_ms, &r.claim_get_server_ms);
        row("claim GET in the API server mean", a.mean, b.mean, "ms", 2);
        row("claim GET in the API server p50", a.p50, b.p50, "ms", 2);
        if let (Some(a), Some(b)) = (&o.breakdown, &r.breakdown) {
            for (name, a, b) in [
                (
                    "prepare: claim GET (driver's client)",
                    &a.claim_get_ms,
                    &b.claim_get_ms,
                ),
                (
                    "prepare: driver's work after the GET",
                    &a.after_get_ms,
                    &b.after_get_ms,
                ),
                (
                    "prepare: kubelet minus driver (gRPC)",
                    &a.outside_ms,
                    &b.outside_ms,
                ),
            ] {
                row(&format!("{name} mean"), a.mean, b.mean, "ms", 2);
            }
        }
        let (a, b) = (&o.scheduled_to_running_ms, &r.scheduled_to_running_ms);
        row("pod scheduled -> running mean", a.mean, b.mean, "ms", 0);
        row("pod scheduled -> running p50", a.p50, b.p50, "ms", 0);
        row("pod scheduled -> running p99", a.p99, b.p99, "ms", 0);
        row(
            "RSS idle",
            mib(o.rss_idle_kib),
            mib(r.rss_idle_kib),
            "MiB",
            1,
        );
        row(
            "RSS after the rounds",
            mib(o.rss_after_kib),
            mib(r.rss_after_kib),
            "MiB",
            1,
        );
        row(
            "RSS peak (VmHWM)",
            mib(o.rss_peak_kib),
            mib(r.rss_peak_kib),
            "MiB",
            1,
        );
        row(
            "start -> complete pool",
            o.start_to_pool_ms,
            r.start_to_pool_ms,
            "ms",
            0,
        );
        row(
            "binary",
            o.binary_bytes as f64 / 1048576.0,
            r.binary_bytes as f64 / 1048576.0,
            "MiB",
            1,
        );
        if let (Some(a), Some(b)) = (&o.idle_cost, &r.idle_cost) {
            row(
                if a.cpu_exact && b.cpu_exact {
                    "CPU at rest per minute"
                } else {
                    "CPU at rest per minute (clock ticks)"
                },
                a.cpu_ms_per_min,
                b.cpu_ms_per_min,
                "ms",
                1,
            );
            row(
                "wake-ups at rest per minute",
                a.wakeups_per_min,
                b.wakeups_per_min,
                "",
                0,
            );
        }
        let (a, b) = (&o.steady_requests, &r.steady_requests);
        let w = self.steady_secs;
        rows.push((
            format!("API requests in {w} s idle (read/watch/write)"),
            format!("{}/{}/{}", a.reads, a.watches, a.writes),
            format!("{}/{}/{}", b.reads, b.watches, b.writes),
            "-".into(),
        ));
        let mut out = vec![format!(
            "Kubernetes {}, node {} ({}), {} rounds per driver (samples: ours {}, reference {}; rounds with a retried call: {} / {})",
            self.kubernetes_version,
            self.node,
            self.instance_type,
            self.rounds,
            o.prepare_ms.n,
            r.prepare_ms.n,
            o.rounds_with_retries,
            r.rounds_with_retries
        )];
        out.push(format!(
            "{:<46} {:>16} {:>16} {:>8}",
            "figure", "ours (release)", "Go reference", "ours/Go"
        ));
        for (name, a, b, q) in rows {
            out.push(format!("{name:<46} {a:>16} {b:>16} {q:>8}"));
        }
        out
    }
}

/// The bursts of one driver and size, summed over their repetitions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BurstFigures {
    pub bursts: usize,
    /// Every prepare call of those bursts (kubelet's log), ms.
    pub prepare_call_ms: Stats,
    /// First call → last answer, per burst, ms.
    pub prepare_span_ms: Stats,
    pub unprepare_call_ms: Stats,
    pub unprepare_span_ms: Stats,
    pub created_to_last_running_ms: Stats,
    pub deleted_to_last_gone_ms: Stats,
    /// Per burst with the figure: how busy the machine's CPUs were from
    /// creation to the last Running, 0..1.
    pub node_busy_share: Stats,
    /// Per burst with the figure: the driver's CPU time in that window, ms.
    pub driver_cpu_ms: Stats,
    /// Every claim GET of those bursts as the API server timed it, ms.
    pub claim_get_server_ms: Stats,
    /// Per burst with the figure: the machine's busy CPU time from
    /// creation to the last Running, ms.
    pub node_busy_ms: Stats,
    /// Per process name, per burst that measured processes (a name absent
    /// from one of them counts 0 there): its CPU time in that window, ms.
    pub cpu_by_process_ms: BTreeMap<String, Stats>,
}

impl BurstFigures {
    pub fn of(bursts: &[&Burst]) -> BurstFigures {
        let all = |f: fn(&Burst) -> &Vec<f64>| {
            Stats::of(
                &bursts
                    .iter()
                    .flat_map(|b| f(b).iter().copied())
                    .collect::<Vec<_>>(),
            )
        };
        let each =
            |f: fn(&Burst) -> f64| Stats::of(&bursts.iter().map(|b| f(b)).collect::<Vec<_>>());
        // Per burst that has the figure (reports from before have none).
        let measured = |f: fn(&Burst) -> Option<f64>| {
            Stats::of(&bursts.iter().filter_map(|b| f(b)).collect::<Vec<_>>())
        };
        BurstFigures {
            bursts: bursts.len(),
            prepare_call_ms: all(|b| &b.prepare_call_ms),
            prepare_span_ms: each(|b| b.prepare_span_ms),
            unprepare_call_ms: all(|b| &b.unprepare_call_ms),
            unprepare_span_ms: each(|b| b.unprepare_span_ms),
            created_to_last_running_ms: each(|b| b.created_to_last_running_ms),
            deleted_to_last_gone_ms: each(|b| b.deleted_to_last_gone_ms),
            node_busy_share: Stats::of(
                &bursts
                    .iter()
                    .filter_map(|b| {
                        let capacity = b.created_to_last_running_ms * b.node_cpus as f64;
                        b.node_busy_ms
                            .filter(|_| capacity > 0.0)
                            .map(|busy| busy / capacity)
                    })
                    .collect::<Vec<_>>(),
            ),
            driver_cpu_ms: measured(|b| b.driver_cpu_ms),
            claim_get_server_ms: all(|b| &b.claim_get_server_ms),
            node_busy_ms: measured(|b| b.node_busy_ms),
            cpu_by_process_ms: by_process(bursts),
        }
    }
}

/// Per process name, its CPU time in each burst that measured processes.
fn by_process(bursts: &[&Burst]) -> BTreeMap<String, Stats> {
    let measured: Vec<&&Burst> = bursts
        .iter()
        .filter(|b| !b.cpu_by_process_ms.is_empty())
        .collect();
    let names: BTreeSet<&String> = measured
        .iter()
        .flat_map(|b| b.cpu_by_process_ms.keys())
        .collect();
    names
        .into_iter()
        .map(|name| {
            let each: Vec<f64> = measured
                .iter()
                .map(|b| b.cpu_by_process_ms.get(name).copied().unwrap_or(0.0))
                .collect();
            (name.clone(), Stats::of(&each))
        })
        .collect()
}

/// The process names worth a row in a size's table: those with at least
/// `floor_ms` of CPU p50 for either driver, the busiest (both together) first.
fn busy_processes(o: &BurstFigures, r: &BurstFigures, floor_ms: f64) -> Vec<String> {
    let p50 = |f: &BurstFigures, name: &str| f.cpu_by_process_ms.get(name).map_or(0.0, |s| s.p50);
    let names: BTreeSet<&String> = o
        .cpu_by_process_ms
        .keys()
        .chain(r.cpu_by_process_ms.keys())
        .collect();
    let mut busy: Vec<(f64, String)> = names
        .into_iter()
        .filter(|n| p50(o, n).max(p50(r, n)) >= floor_ms)
        .map(|n| (p50(o, n) + p50(r, n), n.clone()))
        .collect();
    busy.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    busy.into_iter().map(|(_, n)| n).collect()
}

impl BenchReport {
    /// Burst figures of `driver` at size `pods`.
    pub fn burst_figures(&self, driver: &str, pods: usize) -> BurstFigures {
        let mine: Vec<&Burst> = self
            .bursts
            .iter()
            .filter(|b| b.driver == driver && b.pods == pods)
            .collect();
        BurstFigures::of(&mine)
    }

    /// The bursts' table: per size, ours against the reference (medians
    /// over the repetitions for spans, all calls for call latencies).
    pub fn burst_table(&self) -> Vec<String> {
        let mut sizes: Vec<usize> = self.bursts.iter().map(|b| b.pods).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut out = Vec::new();
        if sizes.is_empty() {
            return out;
        }
        out.push(format!(
            "{:<46} {:>16} {:>16} {:>8}",
            "burst figure (kubelet's log)", "ours (release)", "Go reference", "ours/Go"
        ));
        for pods in sizes {
            let o = self.burst_figures(&self.ours.driver, pods);
            let r = self.burst_figures(&self.reference.driver, pods);
            let mut row = |name: String, a: f64, b: f64| {
                out.push(format!(
                    "{name:<46} {:>16} {:>16} {:>8}",
                    format!("{a:.1} ms"),
                    format!("{b:.1} ms"),
                    ratio(a, b)
                ));
            };
            row(
                format!("N={pods} prepare call p50"),
                o.prepare_call_ms.p50,
                r.prepare_call_ms.p50,
            );
            row(
                format!("N={pods} prepare call p99"),
                o.prepare_call_ms.p99,
                r.prepare_call_ms.p99,
            );
            row(
                format!("N={pods} prepare call max"),
                o.prepare_call_ms.max,
                r.prepare_call_ms.max,
            );
            if o.claim_get_server_ms.n > 0 && r.claim_get_server_ms.n > 0 {
                row(
                    format!("N={pods} claim GET in the API server p50"),
                    o.claim_get_server_ms.p50,
                    r.claim_get_server_ms.p50,
                );
            }
            row(
                format!("N={pods} first call -> last answer p50"),
                o.prepare_span_ms.p50,
                r.prepare_span_ms.p50,
            );
            row(
                format!("N={pods} created -> last Running p50"),
                o.created_to_last_running_ms.p50,
                r.created_to_last_running_ms.p50,
            );
            row(
                format!("N={pods} unprepare call p50"),
                o.unprepare_call_ms.p50,
                r.unprepare_call_ms.p50,
            );
            row(
                format!("N={pods} unprepare call max"),
                o.unprepare_call_ms.max,
                r.unprepare_call_ms.max,
            );
            row(
                format!("N={pods} unprepare first -> last p50"),
                o.unprepare_span_ms.p50,
                r.unprepare_span_ms.p50,
            );
            row(
                format!("N={pods} deleted -> last gone p50"),
                o.deleted_to_last_gone_ms.p50,
                r.deleted_to_last_gone_ms.p50,
            );
            if o.driver_cpu_ms.n > 0 && r.driver_cpu_ms.n > 0 {
                row(
                    format!("N={pods} driver CPU till last Running p50"),
                    o.driver_cpu_ms.p50,
                    r.driver_cpu_ms.p50,
                );
            }
            if o.node_busy_ms.n > 0 && r.node_busy_ms.n > 0 {
                row(
                    format!("N={pods} node CPU till last Running p50"),
                    o.node_busy_ms.p50,
                    r.node_busy_ms.p50,
                );
            }
            for name in busy_processes(&o, &r, PROCESS_ROW_FLOOR_MS) {
                let p50 = |f: &BurstFigures| f.cpu_by_process_ms.get(&name).map_or(0.0, |s| s.p50);
                row(format!("N={pods}   of it {name} p50"), p50(&o), p50(&r));
            }
            if o.node_busy_share.n > 0 && r.node_busy_share.n > 0 {
                out.push(format!(
                    "{:<46} {:>16} {:>16} {:>8}",
                    format!("N={pods} node CPUs busy till last Running p50"),
                    format!("{:.0}%", o.node_busy_share.p50 * 100.0),
                    format!("{:.0}%", r.node_busy_share.p50 * 100.0),
                    ratio(o.node_busy_share.p50, r.node_busy_share.p50)
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst as a report written before the optional fields read.
    fn older_burst() -> Burst {
        serde_json::from_value(serde_json::json!({
            "driver": "d", "pods": 16, "index": 0, "prepare_call_ms": [],
            "prepare_span_ms": 0.0, "prepare_hist_calls": 0, "prepare_hist_s": 0.0,
            "unprepare_call_ms": [], "unprepare_span_ms": 0.0, "unprepare_hist_calls": 0,
            "unprepare_hist_s": 0.0, "created_to_last_running_ms": 0.0,
            "deleted_to_last_gone_ms": 0.0
        }))
        .unwrap()
    }

    #[test]
    fn bursts_pool_their_claim_gets_and_older_reports_have_none() {
        let burst = |gets: &[f64]| {
            let mut b = older_burst();
            assert!(b.claim_get_server_ms.is_empty() && b.created_unix.is_none());
            b.claim_get_server_ms = gets.to_vec();
            b
        };
        let (a, b) = (burst(&[1.0, 9.0]), burst(&[3.0]));
        let f = BurstFigures::of(&[&a, &b]);
        assert_eq!(f.claim_get_server_ms.n, 3);
        assert_eq!(f.claim_get_server_ms.max, 9.0);
        assert_eq!(BurstFigures::of(&[]).claim_get_server_ms.n, 0);
    }

    #[test]
    fn process_cpu_counts_an_absent_name_as_zero_and_rows_go_busiest_first() {
        let burst = |cpu: &[(&str, f64)]| {
            let mut b = older_burst();
            assert!(b.cpu_by_process_ms.is_empty(), "older reports have none");
            b.cpu_by_process_ms = cpu.iter().map(|(n, ms)| (n.to_string(), *ms)).collect();
            b
        };
        let (a, b, unmeasured) = (
            burst(&[("etcd", 30.0), ("kubelet", 100.0)]),
            burst(&[("kubelet", 300.0)]),
            burst(&[]),
        );
        let ours = BurstFigures::of(&[&a, &b, &unmeasured]);
        let etcd = &ours.cpu_by_process_ms["etcd"];
        assert_eq!((etcd.n, etcd.min, etcd.max), (2, 0.0, 30.0));
        assert_eq!(ours.cpu_by_process_ms["kubelet"].n, 2);
        let reference = BurstFigures::of(&[&burst(&[("runc", 25.0), ("etcd", 5.0)])]);
        // kubelet's p50 (the lower of two: 100 ms) is the busiest; etcd's (0 / 5 ms) is below the floor.
        assert_eq!(busy_processes(&ours, &reference, 20.0), ["kubelet", "runc"]);
    }

    #[test]
    fn ratio_is_ours_over_reference() {
        assert_eq!(ratio(5.0, 10.0), "0.50x");
        assert_eq!(ratio(1.0, 0.0), "-");
    }
}
