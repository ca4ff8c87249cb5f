//! The end-to-end scenarios, shared by every way of bringing a cluster up.
//!
//! Each scenario is an async function of a [`Testbed`]; they run one after
//! the other on one cluster (bring-up is the expensive part), each in its
//! own namespace, and each removes its pods before returning so the next
//! starts from idle drivers. Where a scenario uses a manifest of `examples/`
//! it applies the file as written, except that pods are adapted to the
//! testbed ([`Testbed::adapt_pod`]) and sometimes pinned to a node.
//!
//! Errors are `anyhow` on purpose: a scenario is a test body, its error is
//! the failure message for a human (what was expected, what was seen, where
//! the logs are), like a test's panic.
//!
//! | name | issue 5 # | what |
//! |---|---|---|
//! | `s01_slices` | 1 | pools, counts, attributes; drift repair; restart writes nothing |
//! | `s02_single_efa` | 2 | template → one EFA, the container sees exactly its uverbs |
//! | `s03_gpu_efa_same_root` | 3 | GPU + EFA with `matchAttribute` pcieRoot |
//! | `s04_gpu_all_efas_on_root` | 4 | `allocationMode: All` (root named), count 4, and All without a root stays Pending |
//! | `s05_neuron_groups` | 5 | 1/4/8/16 chips + their EFAs on `devicegroupN_id` |
//! | `s06_unsatisfiable_on_trn1` | 6 | 4 chips + 4 EFAs on trn1 stays Pending with the scheduler's reason |
//! | `s07_shared_claim` | 7 | one claim, two pods, unprepared after the last |
//! | `s08_lnc` | 8 | LNC 1 env; LNC 3 → FailedPrepareDynamicResources with our message |
//! | `s09_delete_unprepares` | 9 | CDI spec and checkpoint entry gone with the pod |
//! | `s10_driver_crash` | 10 | SIGKILL while pods come and go, restart, no double allocation |
//! | `s11_node_isolation` | 11 | node A's driver credentials cannot touch node B's slices |
//! | `s12_cel_selectors` | (issue 6) | the CEL selector examples |
//! | `s13_chart_objects` | (issue 6) | every object of both charts, default and non-default values, passes server-side dry-run |

mod allocate;
mod charts;
pub mod kit;
mod lifecycle;
mod publish;

use anyhow::{Result, bail};

use crate::testbed::Testbed;

/// Every scenario, in the order they run.
pub const SCENARIOS: [&str; 13] = [
    "s01_slices",
    "s02_single_efa",
    "s03_gpu_efa_same_root",
    "s04_gpu_all_efas_on_root",
    "s05_neuron_groups",
    "s06_unsatisfiable_on_trn1",
    "s07_shared_claim",
    "s08_lnc",
    "s09_delete_unprepares",
    "s10_driver_crash",
    "s11_node_isolation",
    "s12_cel_selectors",
    "s13_chart_objects",
];

/// The namespace of scenario `name` (`s04_gpu_all_efas_on_root` →
/// `s04-gpu-all-efas-on-root`).
pub fn namespace_of(name: &str) -> String {
    name.replace('_', "-")
}

/// Runs the scenario called `name` in its own namespace, then removes
/// every pod it left (also when it failed, so that the next scenario starts
/// from idle drivers) and the namespace.
pub async fn run<T: Testbed>(tb: &T, name: &str) -> Result<()> {
    let ns = namespace_of(name);
    kit::namespace(tb, &ns).await?;
    let result = match name {
        "s01_slices" => publish::slices(tb, &ns).await,
        "s02_single_efa" => allocate::single_efa(tb, &ns).await,
        "s03_gpu_efa_same_root" => allocate::gpu_efa_same_root(tb, &ns).await,
        "s04_gpu_all_efas_on_root" => allocate::gpu_all_efas_on_root(tb, &ns).await,
        "s05_neuron_groups" => allocate::neuron_groups(tb, &ns).await,
        "s06_unsatisfiable_on_trn1" => allocate::unsatisfiable_on_trn1(tb, &ns).await,
        "s07_shared_claim" => lifecycle::shared_claim(tb, &ns).await,
        "s08_lnc" => lifecycle::lnc(tb, &ns).await,
        "s09_delete_unprepares" => lifecycle::delete_unprepares(tb, &ns).await,
        "s10_driver_crash" => lifecycle::driver_crash(tb, &ns).await,
        "s11_node_isolation" => publish::node_isolation(tb, &ns).await,
        "s12_cel_selectors" => allocate::cel_selectors(tb, &ns).await,
        "s13_chart_objects" => charts::chart_objects(tb).await,
        other => Err(anyhow::anyhow!("no scenario named {other}")),
    };
    let cleanup = kit::delete_all_pods(tb, &ns, std::time::Duration::from_secs(120)).await;
    kit::drop_namespace(tb, &ns).await;
    match (result, cleanup) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => bail!("cleaning up {ns}: {e:#}"),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Mean prepare latency `(count, mean ms)` from a driver's `/metrics`
/// (`dra_plugin_claim_duration_seconds{operation="prepare",result="success"}`).
pub fn prepare_latency(metrics: &str) -> Option<(u64, f64)> {
    let value = |suffix: &str| -> Option<f64> {
        metrics.lines().find_map(|l| {
            let rest = l.strip_prefix(&format!("dra_plugin_claim_duration_seconds_{suffix}{{"))?;
            let (labels, v) = rest.split_once('}')?;
            (labels.contains("operation=\"prepare\"") && labels.contains("result=\"success\""))
                .then(|| v.trim().parse().ok())
                .flatten()
        })
    };
    let count = value("count")?;
    let sum = value("sum")?;
    (count > 0.0).then(|| (count as u64, sum / count * 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_latency_reads_the_histogram() {
        let text = "# HELP x\n\
            dra_plugin_claim_duration_seconds_sum{operation=\"unprepare\",result=\"success\"} 9\n\
            dra_plugin_claim_duration_seconds_count{operation=\"unprepare\",result=\"success\"} 1\n\
            dra_plugin_claim_duration_seconds_sum{operation=\"prepare\",result=\"success\"} 0.03\n\
            dra_plugin_claim_duration_seconds_count{operation=\"prepare\",result=\"success\"} 3\n";
        let (n, ms) = prepare_latency(text).unwrap();
        assert_eq!(n, 3);
        assert!((ms - 10.0).abs() < 1e-9, "{ms}");
        assert_eq!(prepare_latency("nothing"), None);
    }

    #[test]
    fn scenario_names_are_unique_and_make_namespace_names() {
        let set: std::collections::BTreeSet<&str> = SCENARIOS.iter().copied().collect();
        assert_eq!(set.len(), SCENARIOS.len());
        assert_eq!(
            namespace_of("s04_gpu_all_efas_on_root"),
            "s04-gpu-all-efas-on-root"
        );
    }
}
