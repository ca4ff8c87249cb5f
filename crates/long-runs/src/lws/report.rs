//! What `cargo xtask lws` saw: the figures (seconds from the
//! LeaderWorkerSet's creation, polled every 200 ms), each pod's node and the
//! variables its container saw, and the checks that failed.

use std::collections::BTreeMap;

use serde::Serialize;

/// One pod of the group, as it ran.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GroupPod {
    pub name: String,
    /// `leader` or `worker`.
    pub role: String,
    pub node: String,
    /// The node's `neuron.amazonaws.com/ultraserver-server-id-4`.
    pub ultraserver_id: String,
    /// The container's `NEURON_RT_ULTRASERVER_*` and `LWS_*` variables.
    pub env: BTreeMap<String, String>,
}

/// The run's figures and checks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LwsReport {
    pub kubernetes: String,
    pub lws_version: String,
    pub example: String,
    /// How long the testbed (control plane, 4 kubelets, their Neuron
    /// drivers) took to come up, and the controller to serve its webhooks.
    pub testbed_up_s: f64,
    pub controller_up_s: f64,
    /// From the LeaderWorkerSet's creation: the leader pod created, bound,
    /// all 4 pods created, all bound, all Running.
    pub leader_created_s: Option<f64>,
    pub leader_bound_s: Option<f64>,
    pub all_created_s: Option<f64>,
    pub all_bound_s: Option<f64>,
    pub all_running_s: Option<f64>,
    /// From the LeaderWorkerSet's (foreground) deletion: the first pod
    /// marked for deletion, and no pod of it left.
    pub deletion_started_s: Option<f64>,
    pub gone_s: Option<f64>,
    pub pods: Vec<GroupPod>,
    /// The pod affinity the webhook wrote into the leader (its topology
    /// keys), and the node selector the controller gave the workers.
    pub leader_affinity_keys: Vec<String>,
    pub worker_node_selector: BTreeMap<String, String>,
    /// Checks that failed, each with what was seen.
    pub failures: Vec<String>,
    pub seconds: f64,
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "never".into(), |s| format!("{s:.1} s"))
}

impl LwsReport {
    /// Markdown rows, for docs/multi-node.md.
    pub fn table(&self) -> Vec<String> {
        let mut rows = vec![
            format!(
                "LeaderWorkerSet {} on Kubernetes {}, {}",
                self.lws_version, self.kubernetes, self.example
            ),
            String::new(),
            "| step (from the LeaderWorkerSet's creation) | time |".into(),
            "|---|---|".into(),
            format!("| leader pod created | {} |", secs(self.leader_created_s)),
            format!("| leader pod bound | {} |", secs(self.leader_bound_s)),
            format!("| all 4 pods created | {} |", secs(self.all_created_s)),
            format!("| all 4 pods bound | {} |", secs(self.all_bound_s)),
            format!("| all 4 pods Running | {} |", secs(self.all_running_s)),
            format!(
                "| LeaderWorkerSet deleted: first pod marked for deletion | {} |",
                secs(self.deletion_started_s)
            ),
            format!(
                "| LeaderWorkerSet deleted: no pod left | {} |",
                secs(self.gone_s)
            ),
            String::new(),
            "| pod | role | node | UltraServer | NEURON_RT_ULTRASERVER_NODE_ID | LWS_WORKER_INDEX | LWS_LEADER_ADDRESS |".into(),
            "|---|---|---|---|---|---|---|".into(),
        ];
        let get = |p: &GroupPod, k: &str| p.env.get(k).cloned().unwrap_or_else(|| "-".into());
        for p in &self.pods {
            rows.push(format!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                p.name,
                p.role,
                p.node,
                p.ultraserver_id,
                get(p, "NEURON_RT_ULTRASERVER_NODE_ID"),
                get(p, "LWS_WORKER_INDEX"),
                get(p, "LWS_LEADER_ADDRESS"),
            ));
        }
        rows.push(String::new());
        rows.push(format!(
            "testbed up in {:.0} s, controller serving in {:.1} s; leader affinity on {:?}, workers' node selector {:?}; run {:.0} s",
            self.testbed_up_s,
            self.controller_up_s,
            self.leader_affinity_keys,
            self.worker_node_selector,
            self.seconds
        ));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_missing_steps_and_variables() {
        let report = LwsReport {
            leader_created_s: Some(0.21),
            pods: vec![GroupPod {
                name: "g-0".into(),
                role: "leader".into(),
                env: BTreeMap::from([("LWS_WORKER_INDEX".into(), "0".into())]),
                ..GroupPod::default()
            }],
            ..LwsReport::default()
        };
        let table = report.table().join("\n");
        assert!(table.contains("| leader pod created | 0.2 s |"), "{table}");
        assert!(table.contains("| all 4 pods Running | never |"), "{table}");
        assert!(
            table.contains("| g-0 | leader |  |  | - | 0 | - |"),
            "{table}"
        );
    }
}
