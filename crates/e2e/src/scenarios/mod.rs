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
//! Every scenario is registered once, in the `scenarios!` list below: its
//! name (also its namespace and its test name), what it proves, the DRA
//! features it needs (a release without them reports it as skipped, with the
//! reason, see [`local_cluster::versions`]), the features no release has on by
//! default that the harness turns on at bring-up for it (`gates [...]`, see
//! [`local_cluster::versions::opt_in`]; a release without their API skips it),
//! the testbed operations it needs beyond the common ones (`testbed [...]`: a
//! testbed without them reports it as skipped, see [`TestbedOp`]) and the
//! function that runs it.

pub mod agreement;
mod allocate;
mod attribute_files;
pub mod aws_claims;
mod bad_input;
mod cel_agreement;
mod charts;
mod claim_status;
mod clash;
mod efa_capacity;
mod gangs;
mod health;
pub mod kit;
mod lifecycle;
mod migration;
mod node_policy;
mod outage;
mod partitions;
mod publish;
mod recovery;
pub mod registration;
mod reuse;
mod shadow;
mod surge;
mod taints;
mod uninstall;
mod upgrade;

use anyhow::{Result, bail};

use crate::testbed::{Testbed, TestbedOp};
use local_cluster::versions::opt_in::OptInFeature;
use local_cluster::versions::{DraFeature, Release};

/// One registered scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// `sNN_what`: the test name; its namespace is [`namespace_of`] it.
    pub name: &'static str,
    /// What it proves, in one line.
    pub about: &'static str,
    /// DRA features it needs from the cluster.
    pub needs: &'static [DraFeature],
    /// Testbed operations it needs beyond the common ones.
    pub testbed_needs: &'static [TestbedOp],
    /// Features the harness turns on at bring-up for it.
    pub gates: &'static [OptInFeature],
}

impl Scenario {
    /// Why it cannot run on `release`, or `None` when it can.
    pub fn skip_reason(&self, release: &Release) -> Option<String> {
        release
            .lacks(self.needs)
            .or_else(|| release.lacks_opt_in(self.gates))
    }

    /// Why it cannot run on a testbed offering `offers`
    /// ([`Testbed::offers`]), or `None` when it can.
    pub fn testbed_skip_reason(&self, offers: &[TestbedOp]) -> Option<String> {
        let missing: Vec<&str> = self
            .testbed_needs
            .iter()
            .filter(|op| !offers.contains(op))
            .map(|op| op.describe())
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "needs a testbed that can {}; this one cannot",
                missing.join(" and ")
            )
        })
    }
}

/// Declares [`SCENARIOS`] and the dispatcher from one list.
macro_rules! scenarios {
    ($( $name:ident [$($need:ident),*] $(gates [$($gate:ident),*])?
        $(testbed [$($op:ident),*])? $about:literal
        => $($func:ident)::+ ;)*) => {
        /// Every scenario, in the order they run.
        pub const SCENARIOS: &[Scenario] = &[
            $( Scenario {
                name: stringify!($name),
                about: $about,
                needs: &[$(DraFeature::$need),*],
                testbed_needs: &[$($(TestbedOp::$op),*)?],
                gates: &[$($(OptInFeature::$gate),*)?],
            }, )*
        ];

        async fn dispatch<T: Testbed>(tb: &T, name: &str, ns: &str) -> Result<()> {
            match name {
                $( stringify!($name) => $($func)::+(tb, ns).await, )*
                other => Err(anyhow::anyhow!("no scenario named {other}")),
            }
        }
    };
}

scenarios! {
    s01_slices [] "pools, counts, attributes; drift repair; restart writes nothing"
        => publish::slices;
    s02_single_efa [] "template -> one EFA, the container sees exactly its uverbs"
        => allocate::single_efa;
    s03_gpu_efa_same_root [] "GPU + EFA with matchAttribute pcieRoot"
        => allocate::gpu_efa_same_root;
    s04_gpu_all_efas_on_root [] "allocationMode All (root named), count 4, and All without a root stays Pending"
        => allocate::gpu_all_efas_on_root;
    s05_neuron_groups [] "1/4/8/16 chips + their EFAs on devicegroupN_id"
        => allocate::neuron_groups;
    s06_unsatisfiable_on_trn1 [] "4 chips + 4 EFAs on trn1 stays Pending with the scheduler's reason"
        => allocate::unsatisfiable_on_trn1;
    s07_shared_claim [] "one claim, two pods, unprepared after the last"
        => lifecycle::shared_claim;
    s08_lnc [] "LNC 1 env; LNC 3 -> FailedPrepareDynamicResources with our message"
        => lifecycle::lnc;
    s09_delete_unprepares [] "CDI spec and checkpoint entry gone with the pod"
        => lifecycle::delete_unprepares;
    s10_driver_crash [] "SIGKILL while pods come and go, restart, no double allocation"
        => lifecycle::driver_crash;
    s11_node_isolation [] "node A's driver credentials cannot touch node B's slices or Node; the Neuron driver may change only its own Node's UltraServer labels"
        => publish::node_isolation;
    s12_cel_selectors [] "the CEL selector examples"
        => allocate::cel_selectors;
    s13_chart_objects [] "every object of both charts, default and non-default values, passes server-side dry-run"
        => charts::chart_objects;
    s14_device_taint_rule [DeviceTaintRules] "an admin's DeviceTaintRule takes one EFA out of new allocations; a toleration still gets it"
        => taints::device_taint_rule;
    s15_health_taints [DeviceTaints, ResourceHealthStatus] "a fault under a running pod: NoSchedule taint within a rescan + 5 s, Unhealthy in the pod status, new claims Pending unless they tolerate it"
        => health::fault_taints;
    s16_taints_dropped [] "on a server without DRADeviceTaints a fault neither crashes the driver nor rewrites its slices"
        => health::taints_dropped;
    s17_extended_resources [ExtendedResource, PartitionableDevices] "unchanged pods asking for aws.amazon.com/neuroncore: 2, neurondevice: 1 and vpc.amazonaws.com/efa: 4 get exactly those devices from DRA"
        => partitions::extended_resources;
    s18_cores_fill_node [ExtendedResource, PartitionableDevices] "claims for cores and whole chips fill trn2 (16 x 8 cores) without overlap; the next core stays Pending"
        => partitions::cores_fill_node;
    s19_migration [ExtendedResource, PartitionableDevices] "docs/migration.md on trn2: the guard refuses beside a device plugin; after it is removed the same pod runs on DRA"
        => migration::device_plugin_to_dra;
    s20_explain_agreement [AdminAccess] "kubectl-dra's CEL refuses what the API server refuses and selects what kube-scheduler allocates, data/cel-selectors.txt in one batch; a held device names its claim"
        => cel_agreement::explain_agreement;
    s21_device_reuse [] "force-deleted pod, its device at once to a new claim: Running within 60 s, handed over within 1 s of the unprepare, never prepared for two claims"
        => reuse::device_reuse;
    s22_bad_opaque_config [] "a NeuronConfig under the EFA driver: FailedPrepareDynamicResources with our exact message, nothing left on the node"
        => bad_input::bad_opaque_config;
    s23_slices_after_uninstall [] "a driver stopped for good: its slices stay unchanged for 20 s, the kubelet wipes them within 60 s, a restart republishes"
        => uninstall::slices_after_stop;
    s24_upgrade_while_held [] testbed [UpgradeDriverImage] "helm upgrade of both charts to a new image while 10 pods hold claims: no pod restarted, no failed prepare or unprepare"
        => upgrade::upgrade_while_held;
    s25_no_silent_clash [] "a stand-in DRANET slice naming an EFA and a stand-in AWS Neuron slice in our pool: ours withdraw just those (gauge, Node event), never touch theirs, no EFA allocated twice, and come back when they go"
        => clash::no_silent_clash;
    s26_aws_neuron_claims [] "claims shaped like AWS's Neuron DRA examples (neurondeviceN, topology4_id/8_id, v1alphav1 configs) run unchanged on trn2"
        => aws_claims::aws_neuron_claims;
    s27_ultraserver [PartitionableDevices] "4 trn2u kubelets of one UltraServer: groups of 4 and of 2 whole-node pods each on one set with consistent ids; an unsupported mode is refused by name"
        => aws_claims::ultraserver;
    s28_apiserver_outage [] testbed [StopApiServer] "API server stopped, p5's EFA driver started meanwhile: kubelet registers it and its pending unprepare runs from the checkpoint; API server back: the same process becomes ready, its slices unchanged, a new pod runs"
        => outage::apiserver_outage;
    s29_claim_device_status [] "a ResourceClaim of one chip and its EFA on trn2: each driver writes a Ready entry per prepared device with its data, as its own field manager; the claim and pod deleted and recreated under the same names: the new claim has exactly its own entries; the entries are gone once the pod is, the claim stays"
        => claim_status::claim_device_status;
    s30_device_attribute_files [] "4 chips + 4 EFAs on trn2: each driver's attributes file per request holds its allocated devices with their published attributes (chips and EFAs paired by devicegroup1_id), the claim's CDI spec mounts it read-only, the container sees the same bytes; gone after unprepare"
        => attribute_files::device_attribute_files;
    s31_efa_shared_capacity [ConsumableCapacity] "EFAs shared by capacity on p5: four claims share one EFA (3 x the default 25G, 23G rounded up to 25G), each prepared with its own share; a fifth stays Pending until one goes"
        => efa_capacity::shared_capacity;
    s32_surge_one_publisher [PartitionableDevices] testbed [UpgradeDriverImage] "helm upgrade of the Neuron chart to partitions=chips and back: old and new pod side by side, one publishes; the pool's generation moves at most twice per upgrade, the pool is never incomplete at a generation it was complete at, no write of the old pod after the new one's first"
        => surge::surge_one_publisher;
    s33_ultraserver_gangs [PartitionableDevices] gates [GenericWorkload, TopologyAwareWorkloadScheduling]
        testbed [EnableFeatureGates]
        "a PodGroup gang of 4 on the real trn2u kubelets us-0..us-3 (neuronnode, UltraServerConfig mode 4): all Running, one per node, one UltraServer, each container with the runtime's UltraServer variables; PodGroups of whole trn2u nodes (16 chips + all EFAs on devicegroup16_id) on 3 shadow UltraServers, one partly used: a gang of 4 on the 4-node id binds to one wholly free UltraServer; with none free, none binds and no claim is allocated, until one frees; the same for pairs on the 2-node id; a gang of 5 never binds; a gang of 4 whole p5 nodes (8 GPUs + 32 EFAs by pcieRoot) on 4 shadow p5s binds nowhere while one is partly used, on all 4 once it is free"
        => gangs::ultraserver_gangs;
    s34_damaged_checkpoint [] testbed [NodeState] "the EFA driver on p5 restarted on a checkpoint cut in half under a running pod: the claim is rebuilt from its CDI spec and attributes file (both left as they were), the corruption counted, and a restart of the pod's container succeeds; unprepare then removes everything"
        => recovery::damaged_checkpoint;
}

/// The scenario called `name`.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

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
    let mut result = dispatch(tb, name, &ns).await;
    if result.is_ok() {
        // The pods left: kubectl dra explain must agree with the scheduler.
        result = agreement::check_namespace(tb, &ns).await.map(|_| ());
    }
    let cleanup = kit::delete_all_pods(tb, &ns, std::time::Duration::from_secs(120)).await;
    kit::drop_namespace(tb, &ns).await;
    match (result, cleanup) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => bail!("cleaning up {ns}: {e:#}"),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Mean prepare latency `(count, mean ms)` from a driver's `/metrics`
/// (`aws_dra_plugin_claim_duration_seconds{operation="prepare",result="success"}`).
pub fn prepare_latency(metrics: &str) -> Option<(u64, f64)> {
    let value = |suffix: &str| -> Option<f64> {
        metrics.lines().find_map(|l| {
            let rest =
                l.strip_prefix(&format!("aws_dra_plugin_claim_duration_seconds_{suffix}{{"))?;
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
            aws_dra_plugin_claim_duration_seconds_sum{operation=\"unprepare\",result=\"success\"} 9\n\
            aws_dra_plugin_claim_duration_seconds_count{operation=\"unprepare\",result=\"success\"} 1\n\
            aws_dra_plugin_claim_duration_seconds_sum{operation=\"prepare\",result=\"success\"} 0.03\n\
            aws_dra_plugin_claim_duration_seconds_count{operation=\"prepare\",result=\"success\"} 3\n";
        let (n, ms) = prepare_latency(text).unwrap();
        assert_eq!(n, 3);
        assert!((ms - 10.0).abs() < 1e-9, "{ms}");
        assert_eq!(prepare_latency("nothing"), None);
    }

    #[test]
    fn scenario_names_are_unique_and_make_namespace_names() {
        let set: std::collections::BTreeSet<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        assert_eq!(set.len(), SCENARIOS.len());
        for (i, s) in SCENARIOS.iter().enumerate() {
            assert!(
                s.name.starts_with(&format!("s{:02}_", i + 1)),
                "{} out of order",
                s.name
            );
            assert_eq!(find(s.name).map(|f| f.name), Some(s.name));
        }
        assert_eq!(
            namespace_of("s04_gpu_all_efas_on_root"),
            "s04-gpu-all-efas-on-root"
        );
    }

    #[test]
    fn skips_follow_the_release_tables() {
        let s14 = find("s14_device_taint_rule").unwrap();
        let r34 = Release::for_minor(34).unwrap();
        let r37 = Release::for_minor(37).unwrap();
        assert!(s14.skip_reason(r37).is_none());
        let why = s14.skip_reason(r34).unwrap();
        assert!(why.contains("DRADeviceTaintRules"), "{why}");
        let s15 = find("s15_health_taints").unwrap();
        assert!(s15.skip_reason(r37).is_none());
        let why = s15.skip_reason(r34).unwrap();
        assert!(why.contains("DRADeviceTaints"), "{why}");
        // Extended resources and NeuronCores as partitions: 1.36+.
        let migration = [
            "s17_extended_resources",
            "s18_cores_fill_node",
            "s19_migration",
        ];
        for name in migration {
            let s = find(name).unwrap();
            assert!(s.skip_reason(r37).is_none(), "{name}");
            let why = s.skip_reason(r34).unwrap();
            assert!(why.contains("DRAExtendedResource"), "{why}");
        }
        // Only testbeds that can upgrade a release run s24.
        let s24 = find("s24_upgrade_while_held").unwrap();
        assert_eq!(s24.skip_reason(r34), None);
        assert_eq!(
            s24.testbed_skip_reason(&[TestbedOp::UpgradeDriverImage]),
            None
        );
        let why = s24.testbed_skip_reason(&[]).unwrap();
        assert!(why.contains("helm upgrade"), "{why}");
        // Only testbeds that can stop their API server run s28.
        let s28 = find("s28_apiserver_outage").unwrap();
        assert_eq!(s28.testbed_skip_reason(&[TestbedOp::StopApiServer]), None);
        let why = s28.testbed_skip_reason(&[]).unwrap();
        assert!(why.contains("stop the API server"), "{why}");
        // Gangs need the workload gates turned on at bring-up: only where
        // the testbed can, and only from 1.37 (the first v1beta1 PodGroup).
        let s33 = find("s33_ultraserver_gangs").unwrap();
        assert_eq!(
            s33.testbed_skip_reason(&[TestbedOp::EnableFeatureGates]),
            None
        );
        let why = s33.testbed_skip_reason(&[]).unwrap();
        assert!(why.contains("feature gates"), "{why}");
        let r38 = Release::for_minor(38).unwrap();
        assert!(s33.skip_reason(r37).is_none());
        assert!(s33.skip_reason(r38).is_none());
        // 1.34 and 1.35 lack the whole-node device's counters first.
        for minor in [34, 35] {
            let why = s33.skip_reason(Release::for_minor(minor).unwrap()).unwrap();
            assert!(why.contains("DRAPartitionableDevices"), "{why}");
        }
        let why = s33.skip_reason(Release::for_minor(36).unwrap()).unwrap();
        assert!(why.contains("GenericWorkload"), "{why}");
        assert!(
            SCENARIOS
                .iter()
                .all(|s| s.gates.is_empty() || s.name == s33.name)
        );
        // ... and s32, which upgrades with a layout change.
        let s32 = find("s32_surge_one_publisher").unwrap();
        assert_eq!(
            s32.testbed_skip_reason(&[TestbedOp::UpgradeDriverImage]),
            None
        );
        assert!(s32.skip_reason(r37).is_none());
        let why = s32.skip_reason(r34).unwrap();
        assert!(why.contains("DRAPartitionableDevices"), "{why}");
        // ... and s34, which damages a node's checkpoint and kills a container.
        let s34 = find("s34_damaged_checkpoint").unwrap();
        assert_eq!(s34.testbed_skip_reason(&[TestbedOp::NodeState]), None);
        let why = s34.testbed_skip_reason(&[]).unwrap();
        assert!(why.contains("checkpoint"), "{why}");
        for s in SCENARIOS
            .iter()
            .filter(|s| ![s24.name, s28.name, s32.name, s33.name, s34.name].contains(&s.name))
        {
            assert_eq!(s.testbed_skip_reason(&[]), None, "{}", s.name);
        }
        // The UltraServer's whole-node device needs counters.
        let s27 = find("s27_ultraserver").unwrap();
        assert!(s27.skip_reason(r37).is_none());
        let why = s27.skip_reason(r34).unwrap();
        assert!(why.contains("DRAPartitionableDevices"), "{why}");
        // EFAs shared by capacity need consumable capacity.
        let s31 = find("s31_efa_shared_capacity").unwrap();
        assert!(s31.skip_reason(r37).is_none());
        let why = s31.skip_reason(r34).unwrap();
        assert!(why.contains("DRAConsumableCapacity"), "{why}");
        // Everything else runs on every release we test.
        for s in SCENARIOS.iter().filter(|s| {
            s.name != s14.name
                && s.name != s15.name
                && s.name != s27.name
                && s.name != s31.name
                && s.name != s32.name
                && s.name != s33.name
                && !migration.contains(&s.name)
        }) {
            assert_eq!(s.skip_reason(r34), None, "{}", s.name);
        }
    }
}
