//! `cargo xtask bench scheduler`'s result: JSON for the history
//! (`.e2e/bench-scheduler-<version>.json`), a table for people.

use serde::Serialize;

/// p50 and p99 of a histogram's observations in a window, milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Latency {
    /// Observations in the window.
    pub n: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

impl Latency {
    pub fn of(h: &super::metrics::Histogram) -> Latency {
        let ms = |v: Option<f64>| v.map(|s| s * 1e3);
        Latency {
            n: h.count.max(0.0) as u64,
            p50_ms: ms(h.quantile(0.5)),
            p99_ms: ms(h.quantile(0.99)),
            mean_ms: (h.count > 0.0).then(|| h.sum / h.count * 1e3),
        }
    }
}

/// One claim kind on one shape and fleet size: `pods` pods created at once.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Phase {
    pub claim: String,
    pub pods: usize,
    /// Pods bound (spec.nodeName set) within the phase's time limit.
    pub bound: usize,
    /// First pod create → last pod created, seconds.
    pub create_s: f64,
    /// First pod create → last pod bound (from the watch), seconds.
    pub bind_s: f64,
    pub pods_per_s: f64,
    /// `scheduler_pod_scheduling_sli_duration_seconds`: queue entry → bound,
    /// every attempt included (backoff excluded only where the scheduler excludes it).
    pub sli: Latency,
    /// `scheduler_scheduling_attempt_duration_seconds{result="scheduled"}`:
    /// one successful attempt, its binding included (and so the wait for
    /// the scheduler's client rate limit).
    pub attempt: Latency,
    /// `scheduler_framework_extension_point_duration_seconds{extension_point="Filter"}`:
    /// the Filter phase of one cycle over every node, plugins in parallel:
    /// the scheduler's compute per pod, no API call in it. Its buckets end
    /// at 204.8 ms (a quantile there means "at least"); the mean is exact.
    #[serde(default)]
    pub filter: Latency,
    /// `scheduler_plugin_execution_duration_seconds` of DynamicResources'
    /// Filter (sampled by the scheduler: about 10 % of cycles).
    pub dra_filter: Latency,
    /// Scheduling attempts per result (`scheduled`, `unschedulable`, `error`).
    pub attempts_scheduled: u64,
    pub attempts_unschedulable: u64,
    pub attempts_error: u64,
    pub apiserver_cpu_s: f64,
    pub scheduler_cpu_s: f64,
    pub apiserver_rss_kib: u64,
    pub scheduler_rss_kib: u64,
}

/// One shape at one fleet size, on a control plane of its own.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ShapeRun {
    pub shape: String,
    pub nodes: usize,
    pub slices_per_node: usize,
    pub devices_per_node: usize,
    pub counter_sets_per_node: usize,
    /// JSON size of one node's slice specs.
    pub slice_bytes_per_node: usize,
    /// Nodes and their slices created (admin client, 16 at a time), seconds.
    pub publish_s: f64,
    pub publish_apiserver_cpu_s: f64,
    /// `etcd_mvcc_db_total_size_in_bytes` at start, after the slices, at the end.
    pub etcd_db_bytes_start: u64,
    pub etcd_db_bytes_after_slices: u64,
    pub etcd_db_bytes_end: u64,
    /// `..._in_use_in_bytes` after the slices (what is live, not yet compacted).
    pub etcd_in_use_bytes_after_slices: u64,
    pub apiserver_rss_kib_after_slices: u64,
    pub apiserver_peak_rss_kib: u64,
    pub scheduler_rss_kib_after_slices: u64,
    pub scheduler_peak_rss_kib: u64,
    pub phases: Vec<Phase>,
    /// `--gang`: the PodGroup against independent pods (no claim phases then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangRun>,
    /// Warnings about the run (a phase that did not bind every pod, counters
    /// the API server dropped).
    pub notes: Vec<String>,
    pub run_dir: String,
}

/// `--gang` ([`super::gang`]): one way of scheduling the pods, over the
/// repetitions.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct GangTimes {
    /// First create → last pod bound, seconds, per repetition (to the last
    /// pod that bound, when not all did).
    pub bind_s: Vec<f64>,
    /// Pods bound within the phase's time limit, per repetition.
    pub bound: Vec<usize>,
    pub median_bind_s: Option<f64>,
    /// Every pod bound in every repetition.
    pub all_bound: bool,
}

/// The gang against independent pods on one shape and fleet size.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct GangRun {
    /// The whole-node claim each pod holds.
    pub claim: String,
    pub pods: usize,
    pub repetitions: usize,
    /// The API server kept every gang pod's `spec.schedulingGroup`.
    pub scheduling_group_kept: bool,
    pub gang: GangTimes,
    pub independent: GangTimes,
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

impl GangTimes {
    pub(super) fn push(&mut self, bind_s: f64, bound: usize, pods: usize) {
        self.all_bound = (self.bind_s.is_empty() || self.all_bound) && bound == pods;
        self.bind_s.push(bind_s);
        self.bound.push(bound);
        self.median_bind_s = median(&self.bind_s);
    }
}

/// The scheduler's CPU profile during one shape's phases.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Profile {
    pub shape: String,
    pub nodes: usize,
    pub seconds: u64,
    pub file: String,
    /// `go tool pprof -top` lines (by own time).
    pub top: Vec<String>,
    /// `go tool pprof -top -cum` lines (by time spent in a function and
    /// what it calls): where the scheduler's own code spends.
    #[serde(default)]
    pub top_cum: Vec<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SchedulerReport {
    pub kubernetes_version: String,
    pub finished_unix: f64,
    pub runs: Vec<ShapeRun>,
    pub profiles: Vec<Profile>,
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

impl SchedulerReport {
    /// The run of `shape` at `nodes`.
    pub fn run(&self, shape: &str, nodes: usize) -> Option<&ShapeRun> {
        self.runs
            .iter()
            .find(|r| r.shape == shape && r.nodes == nodes)
    }

    /// The table `cargo xtask bench scheduler` prints.
    pub fn table(&self) -> Vec<String> {
        let mut out = vec![format!("Kubernetes {}", self.kubernetes_version)];
        out.push(format!(
            "{:<11} {:>5} {:>6} {:>7} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "shape",
            "nodes",
            "slices",
            "devices",
            "ctrs",
            "KiB/node",
            "publish s",
            "etcd MiB",
            "api MiB",
            "api peak",
            "sched MiB"
        ));
        let mib = |b: u64| b as f64 / 1048576.0;
        for r in &self.runs {
            out.push(format!(
                "{:<11} {:>5} {:>6} {:>7} {:>5} {:>8.1} {:>9.1} {:>9.1} {:>9.0} {:>9.0} {:>9.0}",
                r.shape,
                r.nodes,
                r.slices_per_node,
                r.devices_per_node,
                r.counter_sets_per_node,
                r.slice_bytes_per_node as f64 / 1024.0,
                r.publish_s,
                mib(r.etcd_db_bytes_end),
                r.apiserver_rss_kib_after_slices as f64 / 1024.0,
                r.apiserver_peak_rss_kib as f64 / 1024.0,
                r.scheduler_peak_rss_kib as f64 / 1024.0,
            ));
        }
        out.push(format!(
            "{:<11} {:>5} {:<14} {:>5} {:>6} {:>7} {:>7} {:>15} {:>15} {:>13} {:>13} {:>7} {:>7} {:>7}",
            "shape",
            "nodes",
            "claim",
            "pods",
            "bound",
            "bind s",
            "pods/s",
            "sli p50/p99 ms",
            "attempt p50/99",
            "filter p50/avg",
            "dra filter",
            "unsched",
            "api cpu",
            "sch cpu"
        ));
        for r in &self.runs {
            for p in &r.phases {
                out.push(format!(
                    "{:<11} {:>5} {:<14} {:>5} {:>6} {:>7.2} {:>7.1} {:>15} {:>15} {:>13} {:>13} {:>7} {:>7.1} {:>7.1}",
                    r.shape,
                    r.nodes,
                    p.claim,
                    p.pods,
                    p.bound,
                    p.bind_s,
                    p.pods_per_s,
                    format!("{}/{}", opt(p.sli.p50_ms), opt(p.sli.p99_ms)),
                    format!("{}/{}", opt(p.attempt.p50_ms), opt(p.attempt.p99_ms)),
                    format!("{}/{}", opt(p.filter.p50_ms), opt(p.filter.mean_ms)),
                    format!("{}/{}", opt(p.dra_filter.p50_ms), opt(p.dra_filter.p99_ms)),
                    p.attempts_unschedulable,
                    p.apiserver_cpu_s,
                    p.scheduler_cpu_s,
                ));
            }
        }
        if self.runs.iter().all(|r| r.phases.is_empty()) {
            // `--gang`: no claim phases, so no header for them.
            out.pop();
        }
        out.extend(self.comparison());
        out.extend(self.gang_lines());
        for r in &self.runs {
            for n in &r.notes {
                out.push(format!("note: {} at {} nodes: {n}", r.shape, r.nodes));
            }
        }
        for p in &self.profiles {
            out.push(format!(
                "kube-scheduler CPU profile, {} at {} nodes, {} s ({}):",
                p.shape, p.nodes, p.seconds, p.file
            ));
            out.extend(p.top.iter().map(|l| format!("  {l}")));
            out.push("  by cumulative time:".into());
            out.extend(p.top_cum.iter().map(|l| format!("  {l}")));
        }
        out
    }

    /// trn2 with cores and AWS's shape against whole chips only: the time
    /// to bind the same pods, per claim and in all.
    pub fn comparison(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut sizes: Vec<usize> = self.runs.iter().map(|r| r.nodes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for n in sizes {
            let Some(chips) = self.run("trn2-chips", n) else {
                continue;
            };
            for other in ["trn2-cores", "trn2-aws"] {
                let Some(o) = self.run(other, n) else {
                    continue;
                };
                let mut parts = Vec::new();
                let (mut bind_o, mut bind_c, mut cpu_o, mut cpu_c) = (0.0, 0.0, 0.0, 0.0);
                for p in &o.phases {
                    if let Some(c) = chips.phases.iter().find(|c| c.claim == p.claim) {
                        parts.push(format!(
                            "{} {} (filter mean {})",
                            p.claim,
                            ratio(p.bind_s, c.bind_s),
                            match (p.filter.mean_ms, c.filter.mean_ms) {
                                (Some(a), Some(b)) => ratio(a, b),
                                _ => "-".into(),
                            }
                        ));
                        bind_o += p.bind_s;
                        bind_c += c.bind_s;
                        cpu_o += p.scheduler_cpu_s;
                        cpu_c += c.scheduler_cpu_s;
                    }
                }
                out.push(format!(
                    "{n} nodes: {other} / trn2-chips: time to bind {} in all, scheduler CPU {} ({})",
                    ratio(bind_o, bind_c),
                    ratio(cpu_o, cpu_c),
                    parts.join(", ")
                ));
            }
        }
        out
    }
}

impl SchedulerReport {
    /// `--gang`: per shape and size, the gang's and the independent pods'
    /// times to bind, every repetition and the median.
    pub fn gang_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.runs {
            let Some(g) = &r.gang else { continue };
            for (what, t) in [("gang", &g.gang), ("independent", &g.independent)] {
                let each: Vec<String> = (t.bind_s.iter().zip(&t.bound))
                    .map(|(s, b)| format!("{s:.2} s ({b}/{})", g.pods))
                    .collect();
                out.push(format!(
                    "{} at {} nodes, {} pods of {}, {what}: median {} s, all bound: {}; {}{}",
                    r.shape,
                    r.nodes,
                    g.pods,
                    g.claim,
                    opt2(t.median_bind_s),
                    t.all_bound,
                    each.join(", "),
                    if what == "gang" && !g.scheduling_group_kept {
                        "; schedulingGroup DROPPED by the API server"
                    } else {
                        ""
                    }
                ));
            }
        }
        out
    }
}

fn opt2(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
