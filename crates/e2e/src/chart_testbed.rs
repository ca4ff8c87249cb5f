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
//! driver runs as a DaemonSet of the same shape (`gpu_test_daemonset`).
//!
//! The testbed drives the DaemonSets through one node label per driver,
//! `e2e.aws-dra.dev/<binary>=run`, which every DaemonSet's nodeSelector
//! requires: labelling a node starts that driver there, removing the label
//! stops it (a graceful pod deletion: SIGTERM), and a crash is a SIGKILL of
//! the container's process, after which kubelet restarts it in the same pod
//! ([`Testbed::restarts_crashed_drivers`]).
//!
//! Two hosts implement [`ChartHost`]: [`LocalChartHost`] (the local cluster
//! of real processes; one release per node and chart, because every local
//! node has its own kubelet root directory, and host networking, because the
//! local cluster has no CNI and no kube-proxy) and the kind host of
//! `cargo xtask e2e --cluster kind` (one release per chart, files read with
//! `docker exec`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sysfs_fixtures::Fixture;

use crate::charts::{self, Chart, Helm};
use crate::cluster::{ClusterConfig, LocalCluster, NodeSpec, TeardownReport};
use crate::error::{Error, Result, io};
use crate::host_env::{driver_bin_dir, free_port, rss_kib};
use crate::manifests;
use crate::manifests::GPU_TEST_MANIFEST;
use crate::pod_adapt::adapt_pod_for_local;
use crate::pools::wait_pool_complete;
use crate::process::run_checked;
use crate::testbed::LocalOptions;
use crate::testbed::{DriverKind, ManagedTestbed, NodeInfo, Testbed};
use crate::versions::KubernetesVersion;

/// Prefix of the node labels that switch a driver on (`<prefix><binary>=run`).
pub const RUN_LABEL_PREFIX: &str = "e2e.aws-dra.dev/";
/// Pod label naming the driver binary, on every driver pod of this testbed.
pub const POD_DRIVER_LABEL: &str = "e2e.aws-dra.dev/driver";
/// Reference of the image with all three driver binaries in
/// `/usr/local/bin` (built by [`driver_image_spec`] here; the kind host loads
/// the same archive).
pub const DRIVERS_IMAGE_REPOSITORY: &str = "localhost/aws-dra-e2e/drivers";
pub const DRIVERS_IMAGE_TAG: &str = "e2e";

const POD_TIMEOUT: Duration = Duration::from_secs(120);
const SLICES_TIMEOUT: Duration = Duration::from_secs(90);

/// The node label that runs `kind` there.
pub fn run_label(kind: DriverKind) -> String {
    format!("{RUN_LABEL_PREFIX}{}", kind.binary())
}

/// Where a node keeps what the drivers use, as the node itself sees it
/// (the charts' `hostPaths`).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub kubelet_root: String,
    pub cdi_root: String,
    pub sysfs_root: String,
    pub dev_root: String,
}

/// A node of the testbed as its host knows it.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    /// The Kubernetes Node name.
    pub node_name: String,
    /// The fixture hardware (for the expected device counts).
    pub fixture: Fixture,
    pub paths: HostPaths,
}

/// How the DaemonSets are deployed on a host's cluster.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub image_repository: String,
    pub image_tag: String,
    /// Image holding `/usr/local/bin/gpu-test-driver`.
    pub gpu_test_image: String,
    pub host_network: bool,
    /// `extraEnv` of the charts (`(name, value)`).
    pub extra_env: Vec<(String, String)>,
    /// Tolerations replacing the charts' defaults, if any.
    pub tolerations: Option<Value>,
    /// One release per node and chart (nodes differ in kubelet root) rather
    /// than one per chart.
    pub per_node_releases: bool,
    /// Each release gets its own metrics port (host networking on one host).
    pub unique_metrics_ports: bool,
}

/// What a cluster must offer [`ChartTestbed`].
#[allow(async_fn_in_trait)]
pub trait ChartHost: Send + Sync {
    fn client(&self) -> kube::Client;
    fn admin_kubeconfig(&self) -> &Path;
    fn deployment(&self) -> Deployment;
    /// The layout of node `name` with the fixture of `instance_type`,
    /// adding the node first where the host can.
    async fn node(&self, name: &str, instance_type: &str) -> Result<NodeLayout>;
    /// A file on the node (`None` when absent).
    fn read_file(&self, node: &str, path: &str) -> Result<Option<Vec<u8>>>;
    /// Entry names of a directory on the node (empty when absent).
    fn list_dir(&self, node: &str, path: &str) -> Result<Vec<String>>;
    /// SIGKILL to the main process of a container (CRI id, no `containerd://`).
    fn kill_container(&self, node: &str, container_id: &str) -> Result<()>;
    /// VmRSS of a container's main process, KiB.
    fn container_rss_kib(&self, node: &str, container_id: &str) -> Option<u64>;
    /// A kubeconfig for the API server with a bearer token.
    fn kubeconfig_for_token(&self, stem: &str, user: &str, token: &str) -> Result<PathBuf>;
    fn adapt_pod(&self, pod: &mut Value);
    fn logs_hint(&self) -> String;
    /// Where the run's logs and generated files are.
    fn run_dir(&self) -> &Path;
    /// Stops what the host started (the cluster, where it owns it).
    fn shutdown(self) -> TeardownReport
    where
        Self: Sized;
}

/// One DaemonSet: a chart release (or the GPU test driver's manifest).
#[derive(Debug, Clone)]
struct Unit {
    kind: DriverKind,
    release: String,
    /// Only this node (per-node releases); `None`: all nodes with the label.
    node: Option<String>,
    metrics_port: u16,
}

struct TbNode {
    info: NodeInfo,
    layout: NodeLayout,
}

/// The scenarios' [`Testbed`] with chart-installed drivers.
pub struct ChartTestbed<H: ChartHost> {
    host: H,
    helm: Helm,
    client: kube::Client,
    deployment: Deployment,
    work_dir: PathBuf,
    nodes: Mutex<Vec<TbNode>>,
    units: Mutex<Vec<Unit>>,
    /// Container id of the last kill, per `(node, driver)`.
    killed: Mutex<BTreeMap<(String, DriverKind), String>>,
    start_times: Mutex<Vec<(String, DriverKind, Duration)>>,
    handle: tokio::runtime::Handle,
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |e| Error::Testbed(format!("{action}: {e}"))
}

fn json_err(what: &str) -> impl FnOnce(serde_json::Error) -> Error + '_ {
    move |source| Error::Json {
        what: what.to_string(),
        source,
    }
}

/// Runs a future to completion from synchronous code: inside the (multi-
/// threaded) runtime the scenarios run on, or outside it (the harness reads
/// the figures after the scenarios) on the runtime of `handle`.
fn block<F: std::future::Future>(handle: &tokio::runtime::Handle, f: F) -> F::Output {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::block_in_place(|| handle.block_on(f))
    } else {
        handle.block_on(f)
    }
}

fn short_name(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Efa => "efa",
        DriverKind::Neuron => "neuron",
        DriverKind::GpuTest => "gpu-test",
    }
}

/// The release (and DaemonSet) name for `kind`: `efa`, `neuron`, `gpu-test`,
/// with `-<node>` for a per-node release.
pub fn release_name(kind: DriverKind, node: Option<&str>) -> String {
    match node {
        Some(n) => format!("{}-{n}", short_name(kind)),
        None => short_name(kind).to_string(),
    }
}

/// The chart values of one release.
///
/// `pin`: the node a per-node release is for; `primary`: the first release
/// of the chart, which also installs its cluster-wide objects (DeviceClass,
/// ServiceAccount, RBAC, admission policy).
pub fn release_values(
    deployment: &Deployment,
    kind: DriverKind,
    release: &str,
    pin: Option<&str>,
    paths: &HostPaths,
    primary: bool,
    metrics_port: u16,
) -> Value {
    let mut selector = serde_json::Map::new();
    selector.insert(run_label(kind), json!("run"));
    if let Some(node) = pin {
        selector.insert("kubernetes.io/hostname".into(), json!(node));
    }
    let env: Vec<Value> = deployment
        .extra_env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut values = json!({
        "fullnameOverride": release,
        "image": {
            "repository": deployment.image_repository,
            "tag": deployment.image_tag,
            // Loaded into the nodes' containerd, never pulled.
            "pullPolicy": "Never",
        },
        "logFormat": "text",
        "logLevel": "info,dra_core=debug",
        "hostNetwork": deployment.host_network,
        "extraEnv": env,
        "hostPaths": {
            "kubeletRoot": paths.kubelet_root,
            "cdiRoot": paths.cdi_root,
            "sysfsRoot": paths.sysfs_root,
            "devRoot": paths.dev_root,
        },
        "metrics": {"port": metrics_port},
        "nodeSelector": selector,
        "podLabels": {POD_DRIVER_LABEL: kind.binary()},
        // One ServiceAccount per chart, whatever the release: the admission
        // policy and the RBAC name it, and s11 checks the token's username.
        "serviceAccount": {"create": primary, "name": kind.service_account().1},
        "rbac": {"create": primary},
        "validatingAdmissionPolicy": {"enabled": primary},
        "deviceClasses": {"default": {"enabled": primary}},
    });
    if let Some(t) = &deployment.tolerations {
        values["tolerations"] = t.clone();
    }
    values
}

/// The test GPU driver's DaemonSet: the shape of the charts' (same env,
/// mounts, label-driven scheduling), written here because NVIDIA's chart is
/// not ours to run.
pub fn gpu_test_daemonset(
    deployment: &Deployment,
    name: &str,
    pin: Option<&str>,
    paths: &HostPaths,
    metrics_port: u16,
) -> Value {
    let mut selector = serde_json::Map::new();
    selector.insert(run_label(DriverKind::GpuTest), json!("run"));
    if let Some(node) = pin {
        selector.insert("kubernetes.io/hostname".into(), json!(node));
    }
    let registrar = format!("{}/plugins_registry", paths.kubelet_root);
    let plugin_dir = format!(
        "{}/plugins/{}",
        paths.kubelet_root,
        DriverKind::GpuTest.driver_name()
    );
    let mut env = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}),
        json!({"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar}),
        json!({"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": format!("{}/plugins", paths.kubelet_root)}),
        json!({"name": "CDI_ROOT", "value": paths.cdi_root}),
        json!({"name": "METRICS_ADDRESS", "value": format!("0.0.0.0:{metrics_port}")}),
        json!({"name": "LOG_LEVEL", "value": "info,dra_core=debug"}),
    ];
    env.extend(
        deployment
            .extra_env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v})),
    );
    let mut spec = json!({
        "serviceAccountName": crate::testbed::GPU_TEST_SERVICE_ACCOUNT,
        "nodeSelector": selector,
        "terminationGracePeriodSeconds": 10,
        "containers": [{
            "name": "driver",
            "image": deployment.gpu_test_image,
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/gpu-test-driver"],
            "args": ["run", format!("--sysfs-root={}", paths.sysfs_root),
                     format!("--dev-root={}", paths.dev_root), "--log-format=text"],
            "env": env,
            "ports": [{"name": "metrics", "containerPort": metrics_port}],
            "securityContext": {"readOnlyRootFilesystem": true},
            "terminationMessagePath": "/tmp/termination-log",
            "volumeMounts": [
                {"name": "registry", "mountPath": registrar},
                {"name": "plugin", "mountPath": plugin_dir},
                {"name": "cdi", "mountPath": paths.cdi_root},
                {"name": "sys", "mountPath": paths.sysfs_root, "readOnly": true},
                {"name": "dev", "mountPath": paths.dev_root, "readOnly": true},
            ],
        }],
        "volumes": [
            {"name": "registry", "hostPath": {"path": registrar, "type": "DirectoryOrCreate"}},
            {"name": "plugin", "hostPath": {"path": plugin_dir, "type": "DirectoryOrCreate"}},
            {"name": "cdi", "hostPath": {"path": paths.cdi_root, "type": "DirectoryOrCreate"}},
            {"name": "sys", "hostPath": {"path": paths.sysfs_root, "type": "Directory"}},
            {"name": "dev", "hostPath": {"path": paths.dev_root, "type": "Directory"}},
        ],
    });
    if deployment.host_network {
        spec["hostNetwork"] = json!(true);
        spec["dnsPolicy"] = json!("ClusterFirstWithHostNet");
    }
    spec["tolerations"] = deployment
        .tolerations
        .clone()
        .unwrap_or_else(|| json!([{"operator": "Exists"}]));
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": charts::NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "template": {
                "metadata": {"labels": {
                    "app.kubernetes.io/instance": name,
                    POD_DRIVER_LABEL: DriverKind::GpuTest.binary(),
                }},
                "spec": spec,
            },
        },
    })
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn container_id(p: &Pod) -> Option<String> {
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
fn pod_stuck(p: &Pod) -> Option<String> {
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
    fn first_starts(&self) -> Vec<(String, DriverKind, Duration)> {
        self.start_times
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    fn lock<'a, T>(m: &'a Mutex<T>) -> Result<std::sync::MutexGuard<'a, T>> {
        m.lock()
            .map_err(|_| Error::Testbed("testbed state poisoned".into()))
    }

    fn layout(&self, node: &str) -> Result<NodeLayout> {
        Self::lock(&self.nodes)?
            .iter()
            .find(|n| n.info.name == node)
            .map(|n| n.layout.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    fn node_info(&self, node: &str) -> Result<NodeInfo> {
        Self::lock(&self.nodes)?
            .iter()
            .find(|n| n.info.name == node)
            .map(|n| n.info.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    fn unit(&self, node: &str, kind: DriverKind) -> Result<Unit> {
        let node_name = self.layout(node)?.node_name;
        Self::lock(&self.units)?
            .iter()
            .find(|u| u.kind == kind && u.node.as_deref().is_none_or(|n| n == node_name))
            .cloned()
            .ok_or_else(|| Error::Testbed(format!("{} is not deployed for {node}", kind.binary())))
    }

    async fn setup_node(
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
    async fn ensure_unit(&self, kind: DriverKind, layout: &NodeLayout) -> Result<()> {
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
    fn helm_install(&self, chart: Chart, release: &str, values: &Value, first: bool) -> Result<()> {
        let file = self.work_dir.join(format!("{release}.values.json"));
        let text = serde_json::to_vec_pretty(values).map_err(json_err("chart values"))?;
        std::fs::write(&file, text).map_err(io("writing", &file))?;
        let dir = crate::toolchain::repo_root()
            .join("charts")
            .join(chart.name);
        let (dir, file, kubeconfig) = (
            dir.display().to_string(),
            file.display().to_string(),
            self.host.admin_kubeconfig().display().to_string(),
        );
        if first {
            self.helm.run(&["dependency", "build", &dir])?;
        }
        self.helm.run(&[
            "upgrade",
            "--install",
            release,
            &dir,
            "--namespace",
            charts::NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
            "-f",
            &file,
        ])?;
        Ok(())
    }

    /// The driver's pods on `node` (terminating ones included).
    async fn pods(&self, node: &str, kind: DriverKind) -> Result<Vec<Pod>> {
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

    async fn live_pod(&self, node: &str, kind: DriverKind) -> Result<Option<Pod>> {
        Ok(self
            .pods(node, kind)
            .await?
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none()))
    }

    async fn set_run_label(&self, node: &str, kind: DriverKind, on: bool) -> Result<()> {
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

    async fn run_label_set(&self, node: &str, kind: DriverKind) -> Result<bool> {
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

    async fn pod_log_tail(&self, pod: &Pod) -> String {
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
    async fn wait_ready(&self, node: &str, kind: DriverKind, not_id: Option<&str>) -> Result<Pod> {
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

    async fn wait_for_pool(&self, node: &str, kind: DriverKind) -> Result<()> {
        let info = self.node_info(node)?;
        let expected = kind.expected_devices(&info.fixture);
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

impl<H: ChartHost> Testbed for ChartTestbed<H> {
    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes
            .lock()
            .map(|n| n.iter().map(|n| n.info.clone()).collect())
            .unwrap_or_default()
    }

    async fn ensure_node(
        &self,
        name: &str,
        instance_type: &str,
        drivers: &[DriverKind],
    ) -> Result<()> {
        if self.nodes().iter().any(|n| n.name == name) {
            return Ok(());
        }
        self.setup_node(name, instance_type, drivers).await
    }

    /// Labels the node so that the DaemonSet runs a pod there, then waits
    /// for it to be ready and its pool complete. When the label is already
    /// there (the pod was killed and kubelet restarts it), waits for the
    /// restarted container instead.
    async fn start_driver(&self, node: &str, kind: DriverKind) -> Result<Duration> {
        let started = Instant::now();
        let killed = Self::lock(&self.killed)?.remove(&(node.to_string(), kind));
        if self.run_label_set(node, kind).await? {
            if killed.is_none()
                && self
                    .live_pod(node, kind)
                    .await?
                    .is_some_and(|p| pod_ready(&p))
            {
                return Err(Error::Testbed(format!(
                    "{} already runs on {node}",
                    kind.binary()
                )));
            }
        } else {
            self.set_run_label(node, kind, true).await?;
        }
        self.wait_ready(node, kind, killed.as_deref()).await?;
        self.wait_for_pool(node, kind).await?;
        let elapsed = started.elapsed();
        if let Ok(mut t) = self.start_times.lock()
            && !t.iter().any(|(n, k, _)| n == node && *k == kind)
        {
            t.push((node.to_string(), kind, elapsed));
        }
        tracing::info!(
            node,
            driver = kind.binary(),
            elapsed_ms = elapsed.as_millis() as u64,
            "pool complete"
        );
        Ok(elapsed)
    }

    fn kill_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        let pod = block(&self.handle, self.live_pod(node, kind))?
            .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
        let id = container_id(&pod).ok_or_else(|| {
            Error::Testbed(format!("{} pod on {node} has no container", kind.binary()))
        })?;
        let node_name = self.layout(node)?.node_name;
        self.host.kill_container(&node_name, &id)?;
        Self::lock(&self.killed)?.insert((node.to_string(), kind), id);
        Ok(())
    }

    /// Removes the node label; the DaemonSet controller deletes the pod and
    /// kubelet stops it gracefully (SIGTERM).
    async fn stop_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        self.set_run_label(node, kind, false).await?;
        let started = Instant::now();
        while !self.pods(node, kind).await?.is_empty() {
            if started.elapsed() > POD_TIMEOUT {
                let release = self.unit(node, kind).map(|u| u.release).unwrap_or_default();
                return Err(Error::Testbed(format!(
                    "{} pod of {release} on {node} still there {POD_TIMEOUT:?} after its label was removed",
                    kind.binary()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    fn driver_running(&self, node: &str, kind: DriverKind) -> bool {
        block(&self.handle, self.live_pod(node, kind))
            .ok()
            .flatten()
            .is_some_and(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some())
            })
    }

    /// A token bound to the driver's own pod, as the pod's projected token
    /// is (so it carries the node name the admission policy checks).
    fn driver_kubeconfig(&self, node: &str, kind: DriverKind) -> Result<PathBuf> {
        block(&self.handle, async {
            let pod = self
                .live_pod(node, kind)
                .await?
                .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
            let name = pod.metadata.name.clone().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let sa = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default();
            let request: TokenRequest = serde_json::from_value(json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {
                    "audiences": [],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
                },
            }))
            .map_err(json_err("token request"))?;
            let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), charts::NAMESPACE);
            let issued: TokenRequest = sas
                .create_subresource("token", &sa, &PostParams::default(), &request)
                .await
                .map_err(kube_err(format!("requesting a token for {sa}")))?;
            let token = issued
                .status
                .map(|s| s.token)
                .ok_or_else(|| Error::Testbed(format!("token request for {sa} has no status")))?;
            self.host.kubeconfig_for_token(
                &format!("{}-{node}-pod", kind.binary()),
                &format!("system:serviceaccount:{}:{sa}", charts::NAMESPACE),
                &token,
            )
        })
    }

    /// Through the API server's pod proxy, as a scraper without node access would.
    async fn driver_metrics(&self, node: &str, kind: DriverKind) -> Result<String> {
        let unit = self.unit(node, kind)?;
        let pod = self
            .live_pod(node, kind)
            .await?
            .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}:{}/proxy/metrics",
            charts::NAMESPACE,
            pod.metadata.name.unwrap_or_default(),
            unit.metrics_port
        );
        let req = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|e| Error::Testbed(format!("building {path}: {e}")))?;
        self.client
            .request_text(req)
            .await
            .map_err(kube_err(format!("GET {path}")))
    }

    fn driver_rss_kib(&self, node: &str, kind: DriverKind) -> Option<u64> {
        let pod = block(&self.handle, self.live_pod(node, kind)).ok()??;
        let id = container_id(&pod)?;
        let node_name = self.layout(node).ok()?.node_name;
        self.host.container_rss_kib(&node_name, &id)
    }

    fn cdi_spec_files(&self, node: &str) -> Result<Vec<String>> {
        let l = self.layout(node)?;
        let mut names = self.host.list_dir(&l.node_name, &l.paths.cdi_root)?;
        names.sort();
        Ok(names)
    }

    fn checkpoint(
        &self,
        node: &str,
        kind: DriverKind,
    ) -> Result<Option<dra_core::checkpoint::Checkpoint>> {
        let l = self.layout(node)?;
        let path = format!(
            "{}/plugins/{}/checkpoint.json",
            l.paths.kubelet_root,
            kind.driver_name()
        );
        match self.host.read_file(&l.node_name, &path)? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Json {
                    what: format!("{path} on {}", l.node_name),
                    source,
                }),
            None => Ok(None),
        }
    }

    fn adapt_pod(&self, pod: &mut Value) {
        self.host.adapt_pod(pod);
    }

    fn logs_hint(&self) -> String {
        format!(
            "{}; driver pods: kubectl -n {} logs -l {POD_DRIVER_LABEL}=<binary>",
            self.host.logs_hint(),
            charts::NAMESPACE
        )
    }

    fn restarts_crashed_drivers(&self) -> bool {
        true
    }
}

/// The image files: the three driver binaries in `/usr/local/bin` (as the
/// Dockerfile puts them) and the shared libraries they load, from this
/// host (Debian 12 here, the distroless base's release too).
pub fn driver_image_spec(bin_dir: &Path) -> Result<crate::image::ImageSpec> {
    let mut files = Vec::new();
    let mut libs = std::collections::BTreeSet::new();
    for kind in DriverKind::ALL {
        let bin = bin_dir.join(kind.binary());
        let bin = std::fs::canonicalize(&bin).map_err(io("resolving", &bin))?;
        libs.extend(crate::image::shared_libraries(&bin)?);
        files.push((bin, format!("/usr/local/bin/{}", kind.binary())));
    }
    files.extend(libs.into_iter().map(|l| {
        let inside = l.display().to_string();
        (l, inside)
    }));
    let (main, main_at) = files.remove(0);
    Ok(crate::image::ImageSpec {
        reference: format!("{DRIVERS_IMAGE_REPOSITORY}:{DRIVERS_IMAGE_TAG}"),
        binary: main,
        entrypoint: main_at,
        files,
    })
}

/// The Kubernetes name of the local node the scenarios call `role`: not the
/// role itself, so that a scenario that confuses the two fails here as it
/// would on kind, whose node names are generated.
pub fn local_node_name(role: &str) -> String {
    format!("chart-{role}")
}

/// Label naming a node's role (`p5`, `trn2`, `trn1`) on every testbed node.
pub const ROLE_LABEL: &str = "e2e.aws-dra.dev/node";

fn node_spec(role: &str, instance_type: &str) -> NodeSpec {
    NodeSpec::new(&local_node_name(role))
        .label("node.kubernetes.io/instance-type", instance_type)
        .label(ROLE_LABEL, role)
}

/// [`ChartHost`] on a [`LocalCluster`].
pub struct LocalChartHost {
    cluster: tokio::sync::Mutex<LocalCluster>,
    client: kube::Client,
    admin_kubeconfig: PathBuf,
    run_dir: PathBuf,
    api_host_port: (String, String),
    ctr: PathBuf,
    image_archive: PathBuf,
    handle: tokio::runtime::Handle,
}

impl LocalChartHost {
    /// Starts a local cluster with `nodes` (`(name, instance type)`) and
    /// loads the driver image (binaries from `bin_dir`) into every node.
    pub async fn start(
        nodes: &[(String, String)],
        bin_dir: &Path,
        kubernetes_version: &KubernetesVersion,
    ) -> Result<Self> {
        let mut config = ClusterConfig::with_nodes(&[]);
        config.kubernetes_version = kubernetes_version.clone();
        config.nodes = nodes.iter().map(|(n, t)| node_spec(n, t)).collect();
        let cluster = LocalCluster::start(config).await?;
        let client = cluster.client()?;
        let run_dir = cluster.run_dir().to_path_buf();
        let image_archive = run_dir.join("drivers.oci.tar");
        crate::image::write_archive(&driver_image_spec(bin_dir)?, &image_archive)?;
        let server = cluster
            .server_url()
            .trim_start_matches("https://")
            .to_string();
        let (h, p) = server
            .rsplit_once(':')
            .ok_or_else(|| Error::Testbed(format!("server URL without port: {server}")))?;
        let host = LocalChartHost {
            client,
            admin_kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
            run_dir,
            api_host_port: (h.to_string(), p.to_string()),
            ctr: cluster.binaries().ctr.clone(),
            image_archive,
            cluster: tokio::sync::Mutex::new(cluster),
            handle: tokio::runtime::Handle::current(),
        };
        for (n, _) in nodes {
            host.import_image(&local_node_name(n)).await?;
        }
        Ok(host)
    }

    fn ctr(&self, socket: &Path) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io"]);
        c
    }

    async fn local_node(&self, name: &str) -> Result<crate::node::LocalNode> {
        self.cluster
            .lock()
            .await
            .node(name)
            .cloned()
            .ok_or_else(|| Error::Testbed(format!("no node {name} in the cluster")))
    }

    async fn import_image(&self, name: &str) -> Result<()> {
        let n = self.local_node(name).await?;
        run_checked(
            self.ctr(&n.containerd_socket)
                .args(["images", "import", "--snapshotter", &n.snapshotter])
                .arg(&self.image_archive),
        )?;
        Ok(())
    }

    fn socket_of(&self, node: &str) -> Result<PathBuf> {
        block(&self.handle, async {
            Ok(self.local_node(node).await?.containerd_socket)
        })
    }

    fn task_pid(&self, node: &str, container_id: &str) -> Option<i32> {
        let socket = self.socket_of(node).ok()?;
        let out = run_checked(self.ctr(&socket).args(["tasks", "ls"])).ok()?;
        out.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(container_id)).then(|| w.next()?.parse().ok())?
        })
    }
}

impl ChartHost for LocalChartHost {
    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    fn deployment(&self) -> Deployment {
        Deployment {
            image_repository: DRIVERS_IMAGE_REPOSITORY.into(),
            image_tag: DRIVERS_IMAGE_TAG.into(),
            gpu_test_image: format!("{DRIVERS_IMAGE_REPOSITORY}:{DRIVERS_IMAGE_TAG}"),
            // No CNI: only host-network pods run.
            host_network: true,
            // No kube-proxy: the kubernetes Service's ClusterIP leads nowhere,
            // so the in-cluster config points at the API server itself
            // (loopback, in the pods' host network).
            extra_env: vec![
                (
                    "KUBERNETES_SERVICE_HOST".into(),
                    self.api_host_port.0.clone(),
                ),
                (
                    "KUBERNETES_SERVICE_PORT".into(),
                    self.api_host_port.1.clone(),
                ),
            ],
            // Nodes without CNI stay NotReady (tainted).
            tolerations: Some(json!([{"operator": "Exists"}])),
            per_node_releases: true,
            unique_metrics_ports: true,
        }
    }

    async fn node(&self, name: &str, instance_type: &str) -> Result<NodeLayout> {
        let k8s_name = local_node_name(name);
        let exists = self.cluster.lock().await.node(&k8s_name).is_some();
        if !exists {
            self.cluster
                .lock()
                .await
                .add_node_now(&node_spec(name, instance_type))
                .await?;
            self.import_image(&k8s_name).await?;
        }
        let n = self.local_node(&k8s_name).await?;
        let fixture_dir = n.run_dir.join("fixture");
        if fixture_dir.exists() {
            std::fs::remove_dir_all(&fixture_dir).map_err(io("removing", &fixture_dir))?;
        }
        let fixture = sysfs_fixtures::generate(instance_type, &fixture_dir)?;
        Ok(NodeLayout {
            node_name: n.name.clone(),
            paths: HostPaths {
                kubelet_root: n.kubelet_root_dir.display().to_string(),
                cdi_root: n.cdi_dir.display().to_string(),
                sysfs_root: fixture.sys.display().to_string(),
                dev_root: fixture.dev.display().to_string(),
            },
            fixture,
        })
    }

    fn read_file(&self, _node: &str, path: &str) -> Result<Option<Vec<u8>>> {
        match std::fs::read(path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", Path::new(path))(e)),
        }
    }

    fn list_dir(&self, _node: &str, path: &str) -> Result<Vec<String>> {
        match std::fs::read_dir(path) {
            Ok(entries) => Ok(entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io("listing", Path::new(path))(e)),
        }
    }

    fn kill_container(&self, node: &str, container_id: &str) -> Result<()> {
        let socket = self.socket_of(node)?;
        run_checked(self.ctr(&socket).args([
            "tasks",
            "kill",
            "--signal",
            "SIGKILL",
            container_id,
        ]))?;
        Ok(())
    }

    fn container_rss_kib(&self, node: &str, container_id: &str) -> Option<u64> {
        rss_kib(self.task_pid(node, container_id)?)
    }

    fn kubeconfig_for_token(&self, stem: &str, user: &str, token: &str) -> Result<PathBuf> {
        block(&self.handle, async {
            self.cluster
                .lock()
                .await
                .kubeconfig_for_token(stem, user, token)
        })
    }

    fn adapt_pod(&self, pod: &mut Value) {
        adapt_pod_for_local(pod);
    }

    fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    fn shutdown(self) -> TeardownReport {
        self.cluster.into_inner().shutdown()
    }

    fn logs_hint(&self) -> String {
        format!(
            "component logs in {} (kubelet: nodes/<node>/kubelet.log, containers: nodes/<node>/pod-logs)",
            self.run_dir.display()
        )
    }
}

impl ChartTestbed<LocalChartHost> {
    /// The local cluster of [`crate::local::LocalOptions::default`]'s nodes
    /// with the drivers installed from the charts; driver binaries from
    /// `bin_dir`, or where [`crate::local::driver_bin_dir`] finds them.
    pub async fn start_local(options: &LocalOptions) -> Result<Self> {
        let bin_dir = match &options.bin_dir {
            Some(d) => d.clone(),
            None => driver_bin_dir(&DriverKind::ALL)?,
        };
        let names: Vec<(String, String)> = options
            .nodes
            .iter()
            .map(|(n, t, _)| (n.clone(), t.clone()))
            .collect();
        let host = LocalChartHost::start(&names, &bin_dir, &options.kubernetes_version).await?;
        let work = host.run_dir().join("charts");
        Self::start(host, &options.nodes, &work).await
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

impl ChartTestbed<crate::kind_host::KindHost> {
    /// The scenarios' testbed on a kind cluster that is already up (see
    /// [`crate::kind_host`]): installs the charts and starts the drivers on
    /// the nodes labelled with the roles of `nodes`.
    pub async fn start_kind(
        kubeconfig: &Path,
        work_dir: &Path,
        nodes: &[(String, String, Vec<DriverKind>)],
    ) -> Result<Self> {
        let host = crate::kind_host::KindHost::connect(kubeconfig, work_dir).await?;
        Self::start(host, nodes, &work_dir.join("charts")).await
    }
}
