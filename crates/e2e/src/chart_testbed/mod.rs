//! [`ChartTestbed`]: the drivers as pods of the DaemonSets the Helm charts
//! install, on whatever cluster a [`ChartHost`] provides.
//!
//! Where [`crate::local::LocalTestbed`] runs the drivers as host processes
//! (fast, and the process is directly in reach), this testbed deploys them as
//! a platform team would: `helm upgrade --install` of `charts/efa-dra-driver`
//! and `charts/neuron-dra-driver` with an image holding the release
//! binaries, so every scenario also exercises the chart's DaemonSet (its
//! securityContext, host mounts, downward API, ServiceAccount token, RBAC,
//! admission policy and liveness probe) on a real kubelet. The test GPU
//! driver runs as a DaemonSet of the same shape ([`gpu_daemonset`]).
//!
//! The testbed drives the DaemonSets through one node label per driver,
//! `e2e.aws-dra.dev/<binary>=run`, which every DaemonSet's nodeSelector
//! requires: labelling a node starts that driver there, removing the label
//! stops it (a graceful pod deletion: SIGTERM), and a crash is a SIGKILL of
//! the container's process, after which kubelet restarts it in the same pod
//! ([`Testbed::restarts_crashed_drivers`]).
//!
//! Two hosts implement [`ChartHost`]: [`LocalChartHost`](local_host::LocalChartHost) (the local cluster
//! of real processes; one release per node and chart, because every local
//! node has its own kubelet root directory, and host networking, because the
//! local cluster has no CNI and no kube-proxy) and the kind host of
//! `cargo xtask e2e --cluster kind` (one release per chart, files read with
//! `docker exec`).
//!
//! Files: [`host`] is the seam (what a cluster must offer), [`values`] the
//! Helm values of each release, [`gpu_daemonset`] the test GPU driver's
//! DaemonSet, this file the testbed's own state and helpers,
//! `testbed_ops.rs` the [`Testbed`] operations, `upgrade.rs` the image
//! upgrade (`helm upgrade` and the rollout), and [`local_host`] the host
//! on the local cluster (the kind host is `crate::kind_host`).

pub mod gpu_daemonset;
pub mod host;
pub mod local_host;
mod testbed_ops;
mod upgrade;
pub mod values;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::charts::{self, Chart, Helm};
use crate::host_env::free_port;
use crate::manifests;
use crate::manifests::GPU_TEST_MANIFEST;
use crate::pools::wait_pool_complete;
use crate::testbed::{DriverKind, ManagedTestbed, NodeInfo, Testbed};
use local_cluster::cluster::TeardownReport;
use local_cluster::error::{Error, Result, io};

use self::gpu_daemonset::gpu_test_daemonset;
use self::host::{ChartHost, Deployment, NodeLayout, POD_DRIVER_LABEL, run_label};
use self::values::{release_name, release_values};

pub(super) const POD_TIMEOUT: Duration = Duration::from_secs(120);
pub(super) const SLICES_TIMEOUT: Duration = Duration::from_secs(90);

/// One DaemonSet: a chart release (or the GPU test driver's manifest).
#[derive(Debug, Clone)]
pub(super) struct Unit {
    pub(super) kind: DriverKind,
    pub(super) release: String,
    /// Only this node (per-node releases); `None`: all nodes with the label.
    pub(super) node: Option<String>,
    pub(super) metrics_port: u16,
}

pub(super) struct TbNode {
    pub(super) info: NodeInfo,
    pub(super) layout: NodeLayout,
}

/// The scenarios' [`Testbed`] with chart-installed drivers.
pub struct ChartTestbed<H: ChartHost> {
    pub(super) host: H,
    pub(super) helm: Helm,
    pub(super) client: kube::Client,
    pub(super) deployment: Deployment,
    pub(super) work_dir: PathBuf,
    pub(super) nodes: Mutex<Vec<TbNode>>,
    pub(super) units: Mutex<Vec<Unit>>,
    /// Container id of the last kill, per `(node, driver)`.
    pub(super) killed: Mutex<BTreeMap<(String, DriverKind), String>>,
    pub(super) start_times: Mutex<Vec<(String, DriverKind, Duration)>>,
    /// Image upgrades so far (each gets its own tag).
    pub(super) upgrades: AtomicU32,
    pub(super) handle: tokio::runtime::Handle,
}

pub(super) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |e| Error::Testbed(format!("{action}: {e}"))
}

pub(super) fn json_err(what: &str) -> impl FnOnce(serde_json::Error) -> Error + '_ {
    move |source| Error::Json {
        what: what.to_string(),
        source,
    }
}

/// Runs a future to completion from synchronous code: inside the (multi-
/// threaded) runtime the scenarios run on, or outside it (the harness reads
/// the figures after the scenarios) on the runtime of `handle`.
pub(super) fn block<F: std::future::Future>(handle: &tokio::runtime::Handle, f: F) -> F::Output {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::block_in_place(|| handle.block_on(f))
    } else {
        handle.block_on(f)
    }
}

pub(super) fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

pub(super) fn container_id(p: &Pod) -> Option<String> {
    let id = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()?;
    Some(id.rsplit("://").next().unwrap_or(&id).to_string())
}

/// Why a driver pod cannot start (image missing, crash loop), if it cannot.
pub(super) fn pod_stuck(p: &Pod) -> Option<String> {
    let c = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let waiting = c.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.clone().unwrap_or_default();
    matches!(
        reason.as_str(),
        "ErrImageNeverPull"
            | "ErrImagePull"
            | "ImagePullBackOff"
            | "CreateContainerConfigError"
            | "CreateContainerError"
            | "RunContainerError"
    )
    .then(|| format!("{reason}: {}", waiting.message.clone().unwrap_or_default()))
}

impl<H: ChartHost> ChartTestbed<H> {
    /// Installs the charts (and the GPU test driver) on `host` and starts
    /// the drivers on `nodes` (`(name, instance type, drivers)`).
    pub async fn start(
        host: H,
        nodes: &[(String, String, Vec<DriverKind>)],
        work_dir: &Path,
    ) -> Result<Self> {
        std::fs::create_dir_all(work_dir).map_err(io("creating", work_dir))?;
        let helm = Helm::locate()?;
        let client = host.client();
        let deployment = host.deployment();
        let tb = ChartTestbed {
            host,
            helm,
            client,
            deployment,
            work_dir: work_dir.to_path_buf(),
            nodes: Mutex::new(Vec::new()),
            units: Mutex::new(Vec::new()),
            killed: Mutex::new(BTreeMap::new()),
            start_times: Mutex::new(Vec::new()),
            upgrades: AtomicU32::new(0),
            handle: tokio::runtime::Handle::current(),
        };
        let namespaces: Api<Namespace> = Api::all(tb.client.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": charts::NAMESPACE}}))
                .map_err(json_err("namespace"))?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(kube_err("creating namespace aws-dra")(e)),
        }
        for obj in manifests::parse("gpu-test-driver.yaml", GPU_TEST_MANIFEST)? {
            manifests::apply(&tb.client, &obj, None).await?;
        }
        for (name, instance_type, drivers) in nodes {
            tb.setup_node(name, instance_type, drivers).await?;
        }
        Ok(tb)
    }

    /// Label → pool complete of the first start of each driver.
    pub(super) fn first_starts(&self) -> Vec<(String, DriverKind, Duration)> {
        self.start_times
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    pub(super) fn lock<'a, T>(m: &'a Mutex<T>) -> Result<std::sync::MutexGuard<'a, T>> {
        m.lock()
            .map_err(|_| Error::Testbed("testbed state poisoned".into()))
    }

    pub(super) fn layout(&self, node: &str) -> Result<NodeLayout> {
        Self::lock(&self.nodes)?
            .iter()
            .find(|n| n.info.name == node)
            .map(|n| n.layout.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    pub(super) fn node_info(&self, node: &str) -> Result<NodeInfo> {
        Self::lock(&self.nodes)?
            .iter()
            .find(|n| n.info.name == node)
            .map(|n| n.info.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    pub(super) fn unit(&self, node: &str, kind: DriverKind) -> Result<Unit> {
        let node_name = self.layout(node)?.node_name;
        Self::lock(&self.units)?
            .iter()
            .find(|u| u.kind == kind && u.node.as_deref().is_none_or(|n| n == node_name))
            .cloned()
            .ok_or_else(|| Error::Testbed(format!("{} is not deployed for {node}", kind.binary())))
    }

    pub(super) async fn setup_node(
        &self,
        name: &str,
        instance_type: &str,
        drivers: &[DriverKind],
    ) -> Result<()> {
        let layout = self.host.node(name, instance_type).await?;
        Self::lock(&self.nodes)?.push(TbNode {
            info: NodeInfo {
                name: name.to_string(),
                node_name: layout.node_name.clone(),
                fixture: layout.fixture.clone(),
                drivers: drivers.to_vec(),
            },
            layout: layout.clone(),
        });
        for kind in drivers {
            self.ensure_unit(*kind, &layout).await?;
        }
        for kind in drivers {
            self.start_driver(name, *kind).await?;
        }
        Ok(())
    }

    /// Installs the release (or DaemonSet) that serves `kind` on `layout`'s node.
    pub(super) async fn ensure_unit(&self, kind: DriverKind, layout: &NodeLayout) -> Result<()> {
        let per_node = self.deployment.per_node_releases;
        let (primary, release) = {
            let units = Self::lock(&self.units)?;
            let exists = units.iter().any(|u| {
                u.kind == kind && (!per_node || u.node.as_deref() == Some(&layout.node_name))
            });
            if exists {
                return Ok(());
            }
            let primary = !units.iter().any(|u| u.kind == kind);
            let release = release_name(kind, per_node.then_some(layout.node_name.as_str()));
            (primary, release)
        };
        let metrics_port = if self.deployment.unique_metrics_ports {
            free_port()?
        } else {
            8080
        };
        let pin = per_node.then_some(layout.node_name.as_str());
        match kind.chart() {
            Some(chart) => {
                let values = release_values(
                    &self.deployment,
                    kind,
                    &release,
                    pin,
                    &layout.paths,
                    primary,
                    metrics_port,
                );
                self.helm_install(chart, &release, &values, primary)?;
            }
            None => {
                let ds = gpu_test_daemonset(
                    &self.deployment,
                    &release,
                    pin,
                    &layout.paths,
                    metrics_port,
                );
                manifests::apply(&self.client, &ds, None).await?;
            }
        }
        tracing::info!(release, driver = kind.binary(), primary, "deployed");
        Self::lock(&self.units)?.push(Unit {
            kind,
            release,
            node: per_node.then(|| layout.node_name.clone()),
            metrics_port,
        });
        Ok(())
    }

    /// `first`: the chart's first release, which builds its dependencies
    /// (the library chart) for all later ones.
    pub(super) fn helm_install(
        &self,
        chart: Chart,
        release: &str,
        values: &Value,
        first: bool,
    ) -> Result<()> {
        let file = self.work_dir.join(format!("{release}.values.json"));
        let text = serde_json::to_vec_pretty(values).map_err(json_err("chart values"))?;
        std::fs::write(&file, text).map_err(io("writing", &file))?;
        if first {
            self.helm.run(&["dependency", "build", &chart_dir(chart)])?;
        }
        self.helm_upgrade(
            chart,
            release,
            &["--install", "-f", &file.display().to_string()],
        )
    }

    /// `helm upgrade RELEASE CHART-DIR` in the drivers' namespace with the
    /// admin kubeconfig, then `extra` (the values to install or change).
    pub(super) fn helm_upgrade(&self, chart: Chart, release: &str, extra: &[&str]) -> Result<()> {
        let (dir, kubeconfig) = (
            chart_dir(chart),
            self.host.admin_kubeconfig().display().to_string(),
        );
        let mut args = vec![
            "upgrade",
            release,
            &dir,
            "--namespace",
            charts::NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
        ];
        args.extend_from_slice(extra);
        self.helm.run(&args)?;
        Ok(())
    }

    /// The driver's pods on `node` (terminating ones included).
    pub(super) async fn pods(&self, node: &str, kind: DriverKind) -> Result<Vec<Pod>> {
        let node_name = self.layout(node)?.node_name;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), charts::NAMESPACE);
        let lp = ListParams::default()
            .labels(&format!("{POD_DRIVER_LABEL}={}", kind.binary()))
            .fields(&format!("spec.nodeName={node_name}"));
        Ok(pods
            .list(&lp)
            .await
            .map_err(kube_err(format!("listing {} pods", kind.binary())))?
            .items)
    }

    pub(super) async fn live_pod(&self, node: &str, kind: DriverKind) -> Result<Option<Pod>> {
        Ok(self
            .pods(node, kind)
            .await?
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none()))
    }

    pub(super) async fn set_run_label(&self, node: &str, kind: DriverKind, on: bool) -> Result<()> {
        let node_name = self.layout(node)?.node_name;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let value = if on { json!("run") } else { Value::Null };
        let patch = json!({"metadata": {"labels": {run_label(kind): value}}});
        nodes
            .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!("labelling node {node_name}")))?;
        Ok(())
    }

    pub(super) async fn run_label_set(&self, node: &str, kind: DriverKind) -> Result<bool> {
        let node_name = self.layout(node)?.node_name;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let n = nodes
            .get(&node_name)
            .await
            .map_err(kube_err(format!("reading node {node_name}")))?;
        Ok(n.metadata
            .labels
            .is_some_and(|l| l.get(&run_label(kind)).is_some_and(|v| v == "run")))
    }

    pub(super) async fn pod_log_tail(&self, pod: &Pod) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), charts::NAMESPACE);
        let name = pod.metadata.name.clone().unwrap_or_default();
        let lp = LogParams {
            tail_lines: Some(30),
            ..Default::default()
        };
        match pods.logs(&name, &lp).await {
            Ok(l) => l,
            Err(_) => match pods
                .logs(
                    &name,
                    &LogParams {
                        previous: true,
                        ..lp
                    },
                )
                .await
            {
                Ok(l) => l,
                Err(e) => format!("(no log: {e})"),
            },
        }
    }

    /// Waits for a ready pod of the driver whose container is not `not_id`.
    pub(super) async fn wait_ready(
        &self,
        node: &str,
        kind: DriverKind,
        not_id: Option<&str>,
    ) -> Result<Pod> {
        let started = Instant::now();
        loop {
            if let Some(p) = self.live_pod(node, kind).await? {
                if pod_ready(&p) && container_id(&p).as_deref() != not_id {
                    return Ok(p);
                }
                if let Some(why) = pod_stuck(&p) {
                    return Err(Error::Testbed(format!(
                        "{} pod on {node} cannot start: {why}\n{}",
                        kind.binary(),
                        self.pod_log_tail(&p).await
                    )));
                }
                if started.elapsed() > POD_TIMEOUT {
                    return Err(Error::Testbed(format!(
                        "{} pod on {node} not ready after {POD_TIMEOUT:?}: {:?}\n{}",
                        kind.binary(),
                        p.status.as_ref().and_then(|s| s.container_statuses.clone()),
                        self.pod_log_tail(&p).await
                    )));
                }
            } else if started.elapsed() > POD_TIMEOUT {
                return Err(Error::Testbed(format!(
                    "no {} pod on {node} after {POD_TIMEOUT:?}; {}",
                    kind.binary(),
                    self.host.logs_hint()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(super) async fn wait_for_pool(&self, node: &str, kind: DriverKind) -> Result<()> {
        let info = self.node_info(node)?;
        let partitions = self.host.deployment().neuron_partitions;
        let env: Vec<(String, String)> = partitions
            .map(|p| ("NEURON_PARTITIONS".to_string(), p))
            .into_iter()
            .collect();
        let expected = kind.expected_devices_in(&info.fixture, &env);
        let node_name = self.layout(node)?.node_name;
        // kubelet restarts a driver that exits: nothing ends the wait early.
        if wait_pool_complete(
            &self.client,
            &node_name,
            kind,
            expected,
            SLICES_TIMEOUT,
            || Ok(()),
        )
        .await?
        {
            return Ok(());
        }
        let log = match self.live_pod(node, kind).await {
            Ok(Some(p)) => self.pod_log_tail(&p).await,
            _ => "(no pod)".into(),
        };
        Err(Error::Timeout {
            what: format!(
                "{expected} {} devices of node {node} in ResourceSlices; driver log tail:\n{log}",
                kind.driver_name()
            ),
            after: SLICES_TIMEOUT,
            logs: self.work_dir.clone(),
        })
    }
}

impl<H: ChartHost> ManagedTestbed for ChartTestbed<H> {
    fn start_times(&self) -> Vec<(String, DriverKind, Duration)> {
        self.first_starts()
    }

    fn admin_kubeconfig(&self) -> &Path {
        self.host.admin_kubeconfig()
    }

    fn run_dir(&self) -> &Path {
        self.host.run_dir()
    }

    /// Uninstalls nothing: the host's cluster goes away whole, or not at all.
    fn shutdown(self) -> TeardownReport {
        self.host.shutdown()
    }
}

/// The chart's directory in this repository.
fn chart_dir(chart: Chart) -> String {
    local_cluster::toolchain::repo_root()
        .join("charts")
        .join(chart.name)
        .display()
        .to_string()
}
