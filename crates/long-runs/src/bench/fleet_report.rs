//! The fleet simulation's result: JSON for the history, a table for people.

use serde::Serialize;

use super::measure::RequestCounts;

/// The re-list storm after an API server restart.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Storm {
    /// Restart (SIGTERM sent) → the new API server ready, seconds.
    pub back_s: f64,
    /// The fleet's requests per second, second 0 being the restart.
    pub per_second: Vec<u64>,
    pub peak_rps: u64,
    /// Seconds after the restart by which half / 95 % / all of the fleet's
    /// requests had arrived.
    pub p50_s: f64,
    pub p95_s: f64,
    pub last_s: f64,
    pub requests: RequestCounts,
    /// CPU time of the new API server process (its start included), seconds.
    pub apiserver_cpu_s: f64,
    /// Complete pools in the API at the end of the window.
    pub pools_complete_after: usize,
}

impl Storm {
    /// From the fleet's request times (seconds after the restart).
    pub fn from_offsets(
        back_s: f64,
        offsets: &[f64],
        requests: RequestCounts,
        apiserver_cpu_s: f64,
        pools_complete_after: usize,
    ) -> Storm {
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
            apiserver_cpu_s,
            pools_complete_after,
        }
    }
}

/// One fleet size.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct FleetSize {
    pub nodes: usize,
    /// Spawn of the publishers → every pool complete (watch event), seconds.
    pub publish_s: f64,
    pub publish_apiserver_cpu_s: f64,
    pub publish_requests: RequestCounts,
    pub steady_apiserver_cpu_s: f64,
    pub steady_requests: RequestCounts,
    pub storm: Storm,
}

/// `cargo xtask bench fleet`'s output (`.e2e/bench-fleet-<version>.json`).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct FleetReport {
    pub kubernetes_version: String,
    pub devices_per_node: usize,
    pub steady_secs: u64,
    pub storm_window_secs: u64,
    pub sizes: Vec<FleetSize>,
    pub run_dir: String,
}

impl FleetReport {
    /// The table `cargo xtask bench fleet` prints.
    pub fn table(&self) -> Vec<String> {
        let mut out = vec![
            format!(
                "Kubernetes {}, {} devices per node, steady window {} s, storm window {} s",
                self.kubernetes_version,
                self.devices_per_node,
                self.steady_secs,
                self.storm_window_secs
            ),
            format!(
                "{:>6} {:>10} {:>10} {:>16} {:>14} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8}",
                "nodes",
                "publish s",
                "api CPU s",
                "requests r/w/wr",
                "steady r/w/wr",
                "steady CPU",
                "back s",
                "storm req",
                "peak/s",
                "p95 s",
                "storm CPU",
                "pools ok"
            ),
        ];
        let rww = |c: &RequestCounts| format!("{}/{}/{}", c.reads, c.watches, c.writes);
        for s in &self.sizes {
            out.push(format!(
                "{:>6} {:>10.2} {:>10.2} {:>16} {:>14} {:>10.2} {:>9.2} {:>9} {:>8} {:>8.1} {:>9.2} {:>8}",
                s.nodes,
                s.publish_s,
                s.publish_apiserver_cpu_s,
                rww(&s.publish_requests),
                rww(&s.steady_requests),
                s.steady_apiserver_cpu_s,
                s.storm.back_s,
                s.storm.requests.total(),
                s.storm.peak_rps,
                s.storm.p95_s,
                s.storm.apiserver_cpu_s,
                s.storm.pools_complete_after
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
            2.0,
            5,
        );
        assert_eq!(s.per_second, vec![2, 3, 0, 1]);
        assert_eq!(s.peak_rps, 3);
        assert_eq!(s.last_s, 3.5);
        assert_eq!(s.p50_s, 1.1);
        let empty = Storm::from_offsets(0.0, &[], RequestCounts::default(), 0.0, 0);
        assert!(empty.per_second.is_empty());
        assert_eq!(empty.p95_s, 0.0);
    }
}
