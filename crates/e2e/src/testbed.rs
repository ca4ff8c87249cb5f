//! What the scenarios need from a cluster, whatever brought it up.
//!
//! [`Testbed`] is the small seam between the shared scenarios
//! ([`crate::scenarios`]) and cluster bring-up: drivers as host processes on
//! the local cluster ([`crate::local::LocalTestbed`]), and drivers as pods of
//! the charts' DaemonSets ([`crate::chart_testbed::ChartTestbed`]) on the
//! local cluster or on kind.
//!
//! Everything else the scenarios do goes through the Kubernetes API with the
//! admin client, so it is the same on any cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sysfs_fixtures::Fixture;

use crate::charts::{self, Chart};
use local_cluster::cluster::TeardownReport;
use local_cluster::cluster_config::selected_kubernetes_version;
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;
use local_cluster::versions::opt_in::Enablement;

/// A driver the suite runs on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum DriverKind {
    /// `efa-driver`
    Efa,
    /// `neuron-driver`
    Neuron,
    /// `gpu-test-driver`, the suite's stand-in for NVIDIA's GPU driver.
    GpuTest,
}

impl DriverKind {
    pub const ALL: [DriverKind; 3] = [DriverKind::Efa, DriverKind::Neuron, DriverKind::GpuTest];

    /// The DRA driver name (`spec.driver` of its slices).
    pub fn driver_name(self) -> &'static str {
        match self {
            DriverKind::Efa => "efa.networking.k8s.aws",
            DriverKind::Neuron => "neuron.aws.com",
            DriverKind::GpuTest => "gpu.nvidia.com",
        }
    }

    /// The executable.
    pub fn binary(self) -> &'static str {
        match self {
            DriverKind::Efa => "efa-driver",
            DriverKind::Neuron => "neuron-driver",
            DriverKind::GpuTest => "gpu-test-driver",
        }
    }

    /// The chart that ships its RBAC and admission policy (none for the test GPU driver).
    pub fn chart(self) -> Option<Chart> {
        match self {
            DriverKind::Efa => Some(charts::EFA_CHART),
            DriverKind::Neuron => Some(charts::NEURON_CHART),
            DriverKind::GpuTest => None,
        }
    }

    /// `namespace/name` of the ServiceAccount whose bound token the driver uses.
    pub fn service_account(self) -> (String, String) {
        match self.chart() {
            Some(c) => (charts::NAMESPACE.to_string(), c.service_account()),
            None => (
                charts::NAMESPACE.to_string(),
                GPU_TEST_SERVICE_ACCOUNT.to_string(),
            ),
        }
    }

    /// How many devices the driver publishes for `fixture` on the
    /// selected Kubernetes release, started as every testbed starts it
    /// ([`TESTBED_PARTITIONS`]: NeuronCores where the release serves
    /// partitionable devices).
    pub fn expected_devices(self, fixture: &Fixture) -> usize {
        self.expected_devices_in(fixture, &[testbed_partitions_env()])
    }

    /// [`Self::expected_devices`] of a driver started with `env` (the last
    /// `NEURON_PARTITIONS` in it wins; none: the driver's default,
    /// `chips`). Cores are published with `cores`, and with `auto` where
    /// the release keeps counters; the whole-node device of a Trn2
    /// UltraServer member wherever the release keeps counters.
    pub fn expected_devices_in(self, fixture: &Fixture, env: &[(String, String)]) -> usize {
        let counters = cores_published();
        let cores = match env.iter().rev().find(|(k, _)| k == "NEURON_PARTITIONS") {
            Some((_, v)) if v == "cores" => true,
            Some((_, v)) if v == "auto" => counters,
            _ => false,
        };
        let ultraserver_member = fixture.spec.neuron.as_ref().is_some_and(|n| {
            matches!(
                n.ultraserver,
                sysfs_fixtures::UltraServerSpec::Member { .. }
            )
        });
        let node_device = usize::from(ultraserver_member && counters);
        match self {
            DriverKind::Efa => fixture.efas.len(),
            DriverKind::Neuron if cores => {
                fixture
                    .neuron_chips
                    .iter()
                    .map(|c| 1 + c.core_count as usize)
                    .sum::<usize>()
                    + node_device
            }
            DriverKind::Neuron => fixture.neuron_chips.len() + node_device,
            DriverKind::GpuTest => fixture.gpus.len(),
        }
    }
}

/// The Neuron driver's `--partitions` on every testbed (host processes,
/// Helm charts, kind): `auto`, so that the scenarios of NeuronCores and of
/// the device plugins' `aws.amazon.com/neuroncore` find cores where the
/// release serves them. The driver's own default is `chips` (cores cost
/// the scheduler on every claim, docs/neuron.md); `cargo xtask demo` runs
/// the defaults.
pub const TESTBED_PARTITIONS: &str = "auto";

/// `(NEURON_PARTITIONS, TESTBED_PARTITIONS)`.
pub fn testbed_partitions_env() -> (String, String) {
    ("NEURON_PARTITIONS".into(), TESTBED_PARTITIONS.into())
}

/// Whether the selected release keeps counters (serves partitionable
/// devices): where the Neuron driver publishes NeuronCores when asked to
/// (`--partitions auto`, as on every testbed), and the whole-node device of
/// an UltraServer node.
pub fn cores_published() -> bool {
    local_cluster::cluster_config::selected_kubernetes_version()
        .release()
        .is_ok_and(|r| r.has(local_cluster::versions::DraFeature::PartitionableDevices))
}

/// The drivers' periodic rescan interval on every testbed
/// (`RESCAN_INTERVAL_SECONDS`): fixtures produce no uevents, so a fault
/// injected into a fixture is seen at the next periodic rescan, at most this
/// long after the injection (the health scenarios' "rescan trigger").
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// `(name, value)` of the environment variable that sets [`RESCAN_INTERVAL`].
pub fn rescan_interval_env() -> (String, String) {
    rescan_interval_env_of(RESCAN_INTERVAL)
}

/// `(name, value)` of the environment variable that sets the rescan interval.
pub fn rescan_interval_env_of(interval: Duration) -> (String, String) {
    (
        "RESCAN_INTERVAL_SECONDS".into(),
        interval.as_secs().to_string(),
    )
}

/// An operation only some testbeds offer ([`Testbed::offers`]): a scenario
/// that needs one is reported as skipped, with [`TestbedOp::describe`] as
/// the reason, on a testbed without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestbedOp {
    /// [`Testbed::upgrade_driver_image`], [`Testbed::upgrade_driver_with`].
    UpgradeDriverImage,
    /// [`Testbed::with_api_server_stopped`], [`Testbed::spawn_driver`],
    /// [`Testbed::driver_readyz`] and [`Testbed::driver_process_id`].
    StopApiServer,
    /// Bring-up with feature gates and API versions turned on beyond the
    /// release's defaults ([`LocalOptions::enable`]).
    EnableFeatureGates,
    /// [`Testbed::damage_checkpoint`] and [`Testbed::kill_container`].
    NodeState,
}

impl TestbedOp {
    /// What a testbed must be able to do, for skip messages.
    pub fn describe(self) -> &'static str {
        match self {
            TestbedOp::UpgradeDriverImage => {
                "`helm upgrade` a driver's release to a new image (drivers installed from the charts)"
            }
            TestbedOp::StopApiServer => {
                "stop the API server and start a driver while it is down (drivers as host processes \
                 on a local cluster)"
            }
            TestbedOp::NodeState => {
                "damage a driver's checkpoint and kill a container on a node (drivers as host \
                 processes on a local cluster)"
            }
            TestbedOp::EnableFeatureGates => {
                "turn feature gates and API versions on at bring-up (drivers as host processes on a \
                 local cluster)"
            }
        }
    }
}

/// A directory the drivers of a node write to, as scenarios inspect it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDir {
    /// The CDI spec directory (the drivers' CDI root).
    Cdi,
    /// The device attributes files: `dra-device-attributes` beside the CDI
    /// root, the drivers' and the charts' default.
    DeviceAttributes,
}

impl NodeDir {
    /// This directory of a node whose CDI root is `cdi_root`.
    pub fn of(self, cdi_root: &Path) -> PathBuf {
        match self {
            NodeDir::Cdi => cdi_root.to_path_buf(),
            NodeDir::DeviceAttributes => cdi_root
                .parent()
                .unwrap_or(Path::new("/"))
                .join("dra-device-attributes"),
        }
    }
}

/// What [`Testbed::upgrade_driver_image`] did.
#[derive(Debug, Clone)]
pub struct ImageUpgrade {
    /// The image reference the driver's pods run now.
    pub image: String,
    /// The Helm releases upgraded.
    pub releases: Vec<String>,
    /// `(node, time)`: from the first `helm upgrade` until that node's new
    /// driver pod was Ready and its old pod gone.
    pub nodes: Vec<(String, Duration)>,
    /// From the first `helm upgrade` until every release had rolled out.
    pub rollout: Duration,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// `(node, instance type, drivers)`.
    pub nodes: Vec<(String, String, Vec<DriverKind>)>,
    /// Leave kubelet/containerd state on teardown.
    pub keep_state_dir: bool,
    /// Where the driver binaries are; `None`: [`crate::host_env::driver_bin_dir`]'s lookup.
    pub bin_dir: Option<PathBuf>,
    /// The Kubernetes release to run (default: `AWS_DRA_K8S_VERSION`, else the main release).
    pub kubernetes_version: KubernetesVersion,
    /// The API server writes an audit log ([`crate::ClusterConfig::audit_log`]).
    pub audit_log: bool,
    /// The kubelets' `syncFrequency` ([`crate::ClusterConfig::kubelet_sync_frequency`]).
    pub kubelet_sync_frequency: Option<std::time::Duration>,
    /// The drivers' periodic rescan; `None`: the testbeds' [`RESCAN_INTERVAL`]
    /// (1 s, for the health scenarios). The benchmark runs the driver's own
    /// default, as production does, so its figures at rest are the ones a
    /// node pays.
    pub rescan_interval: Option<Duration>,
    /// Environment the drivers start with besides the rescan interval:
    /// [`TESTBED_PARTITIONS`] by default; the Neuron benchmark sets its own
    /// `NEURON_PARTITIONS`, the demo none (the drivers' defaults).
    pub driver_env: Vec<(String, String)>,
    /// Feature gates and API versions the control plane turns on beyond the
    /// release's defaults (`local_cluster::versions::opt_in`); empty by
    /// default.
    pub enable: Enablement,
}

impl LocalOptions {
    /// The drivers' environment: the rescan interval, then [`Self::driver_env`].
    pub fn driver_environment(&self) -> Vec<(String, String)> {
        let interval = self.rescan_interval.unwrap_or(RESCAN_INTERVAL);
        std::iter::once(rescan_interval_env_of(interval))
            .chain(self.driver_env.iter().cloned())
            .collect()
    }
}

impl Default for LocalOptions {
    /// `p5` (p5.48xlarge: EFA + test GPU driver) and `trn2` (trn2.48xlarge: EFA + Neuron).
    fn default() -> Self {
        Self {
            nodes: vec![
                (
                    "p5".into(),
                    "p5.48xlarge".into(),
                    vec![DriverKind::Efa, DriverKind::GpuTest],
                ),
                (
                    "trn2".into(),
                    "trn2.48xlarge".into(),
                    vec![DriverKind::Efa, DriverKind::Neuron],
                ),
            ],
            keep_state_dir: false,
            bin_dir: None,
            kubernetes_version: selected_kubernetes_version(),
            audit_log: false,
            kubelet_sync_frequency: None,
            rescan_interval: None,
            driver_env: vec![testbed_partitions_env()],
            enable: Enablement::default(),
        }
    }
}

/// The drivers on the nodes, with their metrics ports and credentials.
/// ServiceAccount of the test GPU driver (from `manifests/gpu-test-driver.yaml`).
pub const GPU_TEST_SERVICE_ACCOUNT: &str = "gpu-test-driver";

/// A node of the testbed: its fixture hardware and the drivers it runs.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The name the scenarios know the node by (`p5`, `trn2`, `trn1`).
    pub name: String,
    /// The Kubernetes Node name: the same on the local cluster; on kind,
    /// where node names are generated, the node labelled
    /// `e2e.aws-dra.dev/node=<name>`.
    pub node_name: String,
    pub fixture: Fixture,
    pub drivers: Vec<DriverKind>,
}

impl NodeInfo {
    pub fn instance_type(&self) -> &str {
        &self.fixture.instance_type
    }
}

/// The figures the suite tracks (printed, never asserted).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Figures {
    /// `(node, driver, ms)`: process start → all its slices visible with every device.
    pub start_to_slices_ms: Vec<(String, String, u64)>,
    /// `(node, driver, prepares, mean ms)` from `aws_dra_plugin_claim_duration_seconds`.
    pub prepare_latency: Vec<(String, String, u64, f64)>,
    /// `(node, driver, KiB)`: VmRSS after the run.
    pub rss_kib: Vec<(String, String, u64)>,
    /// Cluster bring-up (control plane, nodes, charts, drivers), ms.
    pub bring_up_ms: u64,
    /// The Kubernetes release the cluster ran.
    #[serde(default)]
    pub kubernetes_version: String,
    /// Scenario outcomes: how many passed and failed.
    #[serde(default)]
    pub passed: u64,
    #[serde(default)]
    pub failed: u64,
    /// `(scenario, reason)` of every scenario the release could not run.
    #[serde(default)]
    pub skipped: Vec<(String, String)>,
    /// The node list the testbed started with (`e2e::kind_host::NodeList`:
    /// `testbed`, or `kind` for kind's node list from bring-up).
    #[serde(default)]
    pub node_list: String,
    /// The testbed's nodes at the end of the run.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// What the cluster turned on beyond the release's defaults for the
    /// scenarios that needed it (`Enablement::describe`), empty when nothing.
    #[serde(default)]
    pub enabled: String,
}

impl Figures {
    /// The figures as indented lines, for a terminal.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "    Kubernetes {}: {} passed, {} failed, {} skipped; testbed bring-up {:.1}s",
            self.kubernetes_version,
            self.passed,
            self.failed,
            self.skipped.len(),
            self.bring_up_ms as f64 / 1000.0
        )];
        if !self.node_list.is_empty() {
            out.push(format!(
                "    node list `{}`; nodes at the end: {}",
                self.node_list,
                self.nodes.join(", ")
            ));
        }
        if !self.enabled.is_empty() {
            out.push(format!("    turned on at bring-up: {}", self.enabled));
        }
        for (name, why) in &self.skipped {
            out.push(format!("    skipped {name}: {why}"));
        }
        for (node, driver, ms) in &self.start_to_slices_ms {
            out.push(format!(
                "    start -> slices visible  {node:<5} {driver:<16} {ms:>6} ms"
            ));
        }
        for (node, driver, n, ms) in &self.prepare_latency {
            out.push(format!(
                "    prepare latency          {node:<5} {driver:<16} {ms:>8.1} ms (mean of {n})"
            ));
        }
        for (node, driver, kib) in &self.rss_kib {
            out.push(format!(
                "    RSS after the run        {node:<5} {driver:<16} {:>8.1} MiB",
                *kib as f64 / 1024.0
            ));
        }
        out
    }
}

/// What the scenario harness and `cargo xtask demo` need of a testbed they
/// brought up, besides [`Testbed`].
pub trait ManagedTestbed: Testbed {
    /// Start → complete pool of the first start of each driver.
    fn start_times(&self) -> Vec<(String, DriverKind, Duration)>;
    /// The admin kubeconfig (for `kubectl`).
    fn admin_kubeconfig(&self) -> &Path;
    /// Where the run's logs and generated files are.
    fn run_dir(&self) -> &Path;
    /// Stops what the testbed started and reports leftovers.
    fn shutdown(self) -> TeardownReport
    where
        Self: Sized;
}

/// The cluster-specific operations of the scenarios.
#[allow(async_fn_in_trait)]
pub trait Testbed: Send + Sync {
    /// An admin client.
    fn client(&self) -> kube::Client;
    /// The nodes, with fixtures and drivers.
    fn nodes(&self) -> Vec<NodeInfo>;
    /// Adds a node with the fixture of `instance_type` running `drivers`
    /// (no-op when it exists).
    async fn ensure_node(
        &self,
        name: &str,
        instance_type: &str,
        drivers: &[DriverKind],
    ) -> Result<()>;
    /// Starts the driver on `node` (it must not be running); returns how long
    /// until its pool was complete in the API.
    async fn start_driver(&self, node: &str, kind: DriverKind) -> Result<Duration>;
    /// SIGKILL, as a crash.
    fn kill_driver(&self, node: &str, kind: DriverKind) -> Result<()>;
    /// SIGTERM and wait for exit.
    async fn stop_driver(&self, node: &str, kind: DriverKind) -> Result<()>;
    fn driver_running(&self, node: &str, kind: DriverKind) -> bool;
    /// A kubeconfig with exactly the driver's credentials on `node`.
    fn driver_kubeconfig(&self, node: &str, kind: DriverKind) -> Result<PathBuf>;
    /// The driver's `/metrics` text.
    async fn driver_metrics(&self, node: &str, kind: DriverKind) -> Result<String>;
    /// Resident memory of the driver process, KiB.
    fn driver_rss_kib(&self, node: &str, kind: DriverKind) -> Option<u64>;
    /// Where the drivers' sysfs tree of `node` (its fixture's `sys/`) is on
    /// this machine, for [`sysfs_fixtures::health::inject`] and `clear`.
    fn fixture_sysfs(&self, node: &str) -> Result<PathBuf>;
    /// File names in the node's CDI spec directory.
    fn cdi_spec_files(&self, node: &str) -> Result<Vec<String>> {
        self.node_dir_files(node, NodeDir::Cdi)
    }
    /// File names in the node's directory `dir`, sorted (none when it does
    /// not exist).
    fn node_dir_files(&self, node: &str, dir: NodeDir) -> Result<Vec<String>>;
    /// The file `name` of the node's directory `dir`; `None` when absent.
    fn node_dir_file(&self, node: &str, dir: NodeDir, name: &str) -> Result<Option<Vec<u8>>>;
    /// The driver's checkpoint on `node` (`None` before its first prepare).
    fn checkpoint(
        &self,
        node: &str,
        kind: DriverKind,
    ) -> Result<Option<dra_core::testing::Checkpoint>>;
    /// Makes an example's Pod runnable here (image, host network, tolerations).
    fn adapt_pod(&self, pod: &mut serde_json::Value);
    /// Where component logs are, for failure messages.
    fn logs_hint(&self) -> String;
    /// Whether a supervisor restarts a killed driver by itself (kubelet, for
    /// a DaemonSet pod): then there is no window in which the driver stays
    /// dead, and [`Testbed::start_driver`] after [`Testbed::kill_driver`]
    /// waits for that restart instead of starting the driver.
    fn restarts_crashed_drivers(&self) -> bool {
        false
    }
    /// The optional operations ([`TestbedOp`]) this testbed can do; the
    /// harness skips scenarios that need another one.
    fn offers() -> &'static [TestbedOp] {
        &[]
    }
    /// Upgrades every release of the driver `kind` to a new image, as
    /// `helm upgrade` does, and returns once the rollout is complete: a new
    /// pod Ready on every node that runs the driver, and the old pods gone
    /// ([`TestbedOp::UpgradeDriverImage`]).
    async fn upgrade_driver_image(&self, kind: DriverKind) -> Result<ImageUpgrade> {
        Err(Error::Testbed(format!(
            "upgrading {} to a new image is not supported by this testbed: {}",
            kind.binary(),
            TestbedOp::UpgradeDriverImage.describe()
        )))
    }
    /// [`Testbed::upgrade_driver_image`] that also sets chart values
    /// (`helm upgrade --set key=value` for each of `set`), e.g. a layout
    /// change such as the Neuron chart's `partitions`
    /// ([`TestbedOp::UpgradeDriverImage`]).
    async fn upgrade_driver_with(
        &self,
        _kind: DriverKind,
        _set: &[(&str, &str)],
    ) -> Result<ImageUpgrade> {
        Err(lacks(TestbedOp::UpgradeDriverImage))
    }
    /// Stops the API server (the rest of the control plane, the kubelets,
    /// containerd and the drivers keep running), runs `outage`, then starts
    /// the API server again whatever `outage` returned, and returns its
    /// output once the API server answers `/readyz` with `ok`
    /// ([`TestbedOp::StopApiServer`]).
    async fn with_api_server_stopped<R>(&self, _outage: impl Future<Output = R>) -> Result<R> {
        Err(lacks(TestbedOp::StopApiServer))
    }
    /// Starts the driver on `node` (it must not be running) and returns once
    /// its process runs, waiting for nothing from the API server: a driver
    /// started during an outage ([`TestbedOp::StopApiServer`]).
    async fn spawn_driver(&self, _node: &str, _kind: DriverKind) -> Result<()> {
        Err(lacks(TestbedOp::StopApiServer))
    }
    /// The driver's `/readyz`: HTTP status and body, also when not ready
    /// ([`TestbedOp::StopApiServer`]).
    async fn driver_readyz(&self, _node: &str, _kind: DriverKind) -> Result<(u16, String)> {
        Err(lacks(TestbedOp::StopApiServer))
    }
    /// The id of the driver's running process on `node` (a restarted driver
    /// has a new one); `None` when it does not run
    /// ([`TestbedOp::StopApiServer`]).
    fn driver_process_id(&self, _node: &str, _kind: DriverKind) -> Option<i32> {
        None
    }
    /// Cuts the driver's checkpoint on `node` to half its length, as a full
    /// disk or a bad edit leaves it ([`TestbedOp::NodeState`]).
    fn damage_checkpoint(&self, _node: &str, _kind: DriverKind) -> Result<()> {
        Err(lacks(TestbedOp::NodeState))
    }
    /// Kills a pod's container on `node` (`containerd://<id>` as the pod's
    /// status has it); kubelet restarts it ([`TestbedOp::NodeState`]).
    async fn kill_container(&self, _node: &str, _container_id: &str) -> Result<()> {
        Err(lacks(TestbedOp::NodeState))
    }
}

/// The error of an optional operation a testbed does not offer.
fn lacks(op: TestbedOp) -> Error {
    Error::Testbed(format!("this testbed cannot {}", op.describe()))
}
