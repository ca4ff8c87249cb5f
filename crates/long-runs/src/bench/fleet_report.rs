//! The fleet simulation's result: JSON for the history, tables for people.

use serde::Serialize;

use super::fleet::shape::PoolSize;
use super::measure::RequestCounts;

/// The re-list storm after an API server restart.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Storm {
    /// Restart (SIGTERM sent) → the new API server ready, seconds.
    pub back_s: f64,
    /// The fleet's requests per second, second 0 being the restart.
    pub per_second: Vec<u64>,
    pub peak_rps: u64,
    /// Seconds after the restart by which half / 95 % / all of the fleet's
    /// requests had arrived; the last one is when the fleet was steady
    /// again (nothing more from it until the end of the window).
    pub p50_s: f64,
    pub p95_s: f64,
    pub last_s: f64,
    pub requests: RequestCounts,
    /// CPU time of the new API server process until it was ready (its
    /// start, the fleet's slices read into the watch cache), seconds.
    pub apiserver_start_cpu_s: f64,
    /// CPU time of the new API server process over the whole window, its
    /// start included, seconds.
    pub apiserver_cpu_s: f64,
    /// Peak resident memory of the new API server process (`VmHWM`) at the
    /// end of the window, KiB.
    pub apiserver_peak_rss_kib: u64,
    /// Complete pools in the API at the end of the window (all drivers).
    pub pools_complete_after: usize,
}

impl Storm {
    /// From the fleet's request times (seconds after the restart); the
    /// API server's figures are filled in by the caller.
    pub fn from_offsets(back_s: f64, offsets: &[f64], requests: RequestCounts) -> Storm {
        let mut sorted: Vec<f64> = offsets.iter().map(|o| o.max(0.0)).collect();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if sorted.is_empty() {
                0.0
            } else {
                let r = (q * sorted.len() as f64).ceil() as usize;
                sorted[r.clamp(1, sorted.len()) - 1]
            }
        };
        let seconds = sorted.last().map_or(0, |l| *l as usize + 1);
        let mut per_second = vec![0u64; seconds];
        for o in &sorted {
            per_second[*o as usize] += 1;
        }
        Storm {
            back_s,
            peak_rps: per_second.iter().copied().max().unwrap_or(0),
            per_second,
            p50_s: at(0.5),
            p95_s: at(0.95),
            last_s: sorted.last().copied().unwrap_or(0.0),
            requests,
            ..Storm::default()
        }
    }

    /// The fleet's requests per second from the API server's return to the
    /// last request (the storm's mean rate).
    pub fn mean_rps(&self) -> f64 {
        let span = (self.last_s - self.back_s).max(1.0);
        self.requests.total() as f64 / span
    }
}

/// One fleet size of one shape.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct FleetSize {
    pub nodes: usize,
    /// Spawn of the publishers → every pool complete (watch event), seconds.
    pub publish_s: f64,
    pub publish_apiserver_cpu_s: f64,
    pub publish_requests: RequestCounts,
    /// The API server's resident memory with the Nodes created and no
    /// slice yet, KiB (a fresh API server process per size).
    pub apiserver_rss_before_kib: u64,
    /// Its peak (`VmHWM`) once every pool is complete, KiB.
    pub apiserver_peak_rss_kib: u64,
    pub steady_apiserver_cpu_s: f64,
    pub steady_requests: RequestCounts,
    /// Resident memory at the end of the steady window, KiB.
    pub steady_apiserver_rss_kib: u64,
    /// Peak resident memory of the simulating process (`VmHWM`, so over
    /// this and every earlier size) at the end of the steady window, KiB.
    #[serde(default)]
    pub fleet_peak_rss_kib: u64,
    pub storm: Storm,
}

impl FleetSize {
    fn per_node(&self, count: u64) -> f64 {
        count as f64 / self.nodes.max(1) as f64
    }
}

/// Every size of one node shape.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ShapeRun {
    pub shape: String,
    /// What each node publishes.
    pub pools: Vec<PoolSize>,
    pub sizes: Vec<FleetSize>,
}

/// `cargo xtask bench fleet`'s output (`.e2e/bench-fleet-<version>.json`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct FleetReport {
    pub kubernetes_version: String,
    pub steady_secs: u64,
    pub storm_window_secs: u64,
    pub shapes: Vec<ShapeRun>,
    pub run_dir: String,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn rww(c: &RequestCounts) -> String {
    format!("{}/{}/{}", c.reads, c.watches, c.writes)
}

impl FleetReport {
    /// The tables `cargo xtask bench fleet` prints, one pair per shape.
    pub fn table(&self) -> Vec<String> {
        let mut out = vec![format!(
            "Kubernetes {}, steady window {} s, storm window {} s",
            self.kubernetes_version, self.steady_secs, self.storm_window_secs
        )];
        for run in &self.shapes {
            out.extend(run.table());
        }
        out
    }
}

impl ShapeRun {
    fn table(&self) -> Vec<String> {
        let mut out = vec![String::new(), format!("== {}", self.shape)];
        for p in &self.pools {
            out.push(format!(
                "per node, {}: {} devices, {} counter sets, {} slices, {:.1} KiB of JSON",
                p.driver,
                p.devices,
                p.counter_sets,
                p.slices,
                p.json_bytes as f64 / 1024.0
            ));
        }
        out.push(format!(
            "{:>6} {:>9} {:>9} {:>8} {:>14} {:>8} {:>26} {:>13} {:>10} {:>9}",
            "nodes",
            "publish s",
            "api CPU s",
            "ms/node",
            "req r/w/wr",
            "req/node",
            "RSS MiB before/peak/steady",
            "steady r/w/wr",
            "steady CPU",
            "fleet MiB"
        ));
        for s in &self.sizes {
            out.push(format!(
                "{:>6} {:>9.2} {:>9.2} {:>8.1} {:>14} {:>8.2} {:>26} {:>13} {:>10.2} {:>9.0}",
                s.nodes,
                s.publish_s,
                s.publish_apiserver_cpu_s,
                s.publish_apiserver_cpu_s * 1e3 / s.nodes.max(1) as f64,
                rww(&s.publish_requests),
                s.per_node(s.publish_requests.total()),
                format!(
                    "{:.0}/{:.0}/{:.0}",
                    mib(s.apiserver_rss_before_kib),
                    mib(s.apiserver_peak_rss_kib),
                    mib(s.steady_apiserver_rss_kib)
                ),
                rww(&s.steady_requests),
                s.steady_apiserver_cpu_s,
                mib(s.fleet_peak_rss_kib)
            ));
        }
        for s in &self.sizes {
            let verbs: Vec<String> = s
                .publish_requests
                .by_verb
                .iter()
                .map(|(verb, n)| format!("{verb} {:.2}", s.per_node(*n)))
                .collect();
            out.push(format!(
                "publish, {} nodes, requests per node: {}",
                s.nodes,
                verbs.join(", ")
            ));
        }
        out.push(format!(
            "{:>6} {:>7} {:>11} {:>10} {:>9} {:>7} {:>7} {:>6} {:>14} {:>10} {:>9} {:>9}",
            "nodes",
            "back s",
            "start CPU s",
            "storm req",
            "r/w/wr",
            "peak/s",
            "mean/s",
            "p95 s",
            "steady again s",
            "window CPU",
            "peak MiB",
            "pools ok"
        ));
        for s in &self.sizes {
            let storm = &s.storm;
            out.push(format!(
                "{:>6} {:>7.2} {:>11.2} {:>10} {:>9} {:>7} {:>7.0} {:>6.1} {:>14.1} {:>10.2} {:>9.0} {:>9}",
                s.nodes,
                storm.back_s,
                storm.apiserver_start_cpu_s,
                storm.requests.total(),
                rww(&storm.requests),
                storm.peak_rps,
                storm.mean_rps(),
                storm.p95_s,
                storm.last_s,
                storm.apiserver_cpu_s,
                mib(storm.apiserver_peak_rss_kib),
                storm.pools_complete_after
            ));
        }
        for s in &self.sizes {
            out.push(format!(
                "storm, {} nodes, fleet requests per second from the restart: {:?}",
                s.nodes, s.storm.per_second
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storm_buckets_by_second_from_the_restart() {
        let s = Storm::from_offsets(
            1.5,
            &[-0.1, 0.2, 1.1, 1.2, 1.9, 3.5],
            RequestCounts::default(),
        );
        assert_eq!(s.per_second, vec![2, 3, 0, 1]);
        assert_eq!(s.peak_rps, 3);
        assert_eq!(s.last_s, 3.5);
        assert_eq!(s.p50_s, 1.1);
        let empty = Storm::from_offsets(0.0, &[], RequestCounts::default());
        assert!(empty.per_second.is_empty());
        assert_eq!(empty.p95_s, 0.0);
        assert_eq!(empty.mean_rps(), 0.0);
    }

    #[test]
    fn storm_rate_runs_from_the_servers_return_to_the_last_request() {
        let requests = RequestCounts {
            reads: 100,
            watches: 200,
            ..RequestCounts::default()
        };
        let s = Storm::from_offsets(10.0, &[10.5, 13.0, 16.0], requests);
        assert_eq!(s.mean_rps(), 50.0);
    }

    #[test]
    fn tables_give_requests_per_node_by_verb() {
        let publish = RequestCounts {
            reads: 4,
            watches: 2,
            writes: 6,
            by_verb: [("create resourceslices".into(), 6), ("get nodes".into(), 2)].into(),
        };
        let run = ShapeRun {
            shape: "trn2-cores".into(),
            pools: vec![],
            sizes: vec![FleetSize {
                nodes: 2,
                publish_s: 1.0,
                publish_apiserver_cpu_s: 0.5,
                publish_requests: publish,
                apiserver_rss_before_kib: 1024,
                apiserver_peak_rss_kib: 2048,
                steady_apiserver_cpu_s: 0.1,
                steady_requests: RequestCounts::default(),
                steady_apiserver_rss_kib: 2048,
                fleet_peak_rss_kib: 4096,
                storm: Storm::default(),
            }],
        };
        let lines = run.table();
        assert!(
            lines.contains(
                &"publish, 2 nodes, requests per node: create resourceslices 3.00, get nodes 1.00"
                    .to_string()
            ),
            "{lines:#?}"
        );
        assert!(lines.iter().any(|l| l.contains("1/2/2")), "{lines:#?}");
    }
}
