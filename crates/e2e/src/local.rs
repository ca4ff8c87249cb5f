//! [`LocalTestbed`]: the drivers on a [`LocalCluster`], set up as the charts
//! would set them up, and the [`Testbed`] operations on it.
//!
//! Bring-up: the cluster (nodes labelled with their instance type, as EKS
//! labels them); namespace `aws-dra`; the DeviceClasses, ServiceAccounts,
//! RBAC and ValidatingAdmissionPolicies from the rendered charts, applied
//! server-side; the test GPU driver's class and RBAC
//! (`manifests/gpu-test-driver.yaml`); a fixture tree per node
//! (`<run>/nodes/<node>/fixture`); then per node and driver a placeholder pod
//! pinned to the node under the driver's ServiceAccount, a token bound to
//! that pod (so it carries `authentication.kubernetes.io/node-name`, which
//! the charts' admission policy checks), and the driver as a host process
//! with that token, the node's kubelet dirs, the fixture, and its own
//! metrics port.
//!
//! Driver binaries: `AWS_DRA_BIN_DIR`, else next to the running executable.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use sysfs_fixtures::Fixture;

use crate::charts::{self, Helm};
use crate::host_env::{driver_bin_dir, free_port, http_get, list_dir, read_if_exists, rss_kib};
use crate::manifests;
use crate::manifests::GPU_TEST_MANIFEST;
use crate::pod_adapt::adapt_pod_for_local;
use crate::pools::wait_pool_complete;
use crate::testbed::{
    DriverKind, LocalOptions, ManagedTestbed, NodeDir, NodeInfo, Testbed, TestbedOp,
};
use local_cluster::cluster::{ClusterConfig, HostProcess, LocalCluster, NodeSpec, TeardownReport};
use local_cluster::error::{Error, Result, io};
use local_cluster::toolchain::PAUSE_IMAGE;

mod node_state;
mod outage;
mod spawn;

/// How long a driver may take from start to a complete pool in the API.
const SLICES_TIMEOUT: Duration = Duration::from_secs(90);

struct DriverSlot {
    kubeconfig: PathBuf,
    metrics_port: u16,
    process: Option<HostProcess>,
}

struct NodeState {
    info: NodeInfo,
    cdi_dir: PathBuf,
    plugins_dir: PathBuf,
    drivers: BTreeMap<DriverKind, DriverSlot>,
}

/// A local cluster with the drivers running on fixture nodes.
pub struct LocalTestbed {
    cluster: tokio::sync::Mutex<LocalCluster>,
    client: kube::Client,
    run_dir: PathBuf,
    admin_kubeconfig: PathBuf,
    bin_dir: PathBuf,
    nodes: Mutex<Vec<NodeState>>,
    /// Start → complete pool, per `(node, driver)`, for the figures.
    start_times: Mutex<Vec<(String, DriverKind, Duration)>>,
    /// The drivers' environment: the rescan interval and LocalOptions::driver_env.
    driver_env: Vec<(String, String)>,
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

impl LocalTestbed {
    /// Starts everything described in the module docs. Needs root, the
    /// Kubernetes binaries (`cargo xtask k8s build`), helm and the drivers.
    pub async fn start(options: LocalOptions) -> Result<LocalTestbed> {
        let started = Instant::now();
        let mut kinds: Vec<DriverKind> = options.nodes.iter().flat_map(|n| n.2.clone()).collect();
        kinds.sort();
        kinds.dedup();
        let bin_dir = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => driver_bin_dir(&kinds)?,
        };
        let helm = Helm::locate()?;
        let config = ClusterConfig {
            kubernetes_version: options.kubernetes_version.clone(),
            keep_state_dir: options.keep_state_dir,
            audit_log: options.audit_log,
            kubelet_sync_frequency: options.kubelet_sync_frequency,
            enable: options.enable.clone(),
            nodes: (options.nodes.iter())
                .map(|(n, t, _)| NodeSpec::for_fixture(n, t))
                .collect(),
            ..ClusterConfig::with_nodes(&[])
        };
        let cluster = LocalCluster::start(config).await?;
        let client = cluster.client()?;
        let testbed = LocalTestbed {
            client: client.clone(),
            run_dir: cluster.run_dir().to_path_buf(),
            admin_kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
            cluster: tokio::sync::Mutex::new(cluster),
            bin_dir,
            nodes: Mutex::new(Vec::new()),
            start_times: Mutex::new(Vec::new()),
            driver_env: options.driver_environment(),
        };
        testbed.install_cluster_objects(&helm).await?;
        for (name, instance_type, drivers) in &options.nodes {
            testbed.setup_node(name, instance_type, drivers).await?;
        }
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "testbed up"
        );
        Ok(testbed)
    }

    async fn install_cluster_objects(&self, helm: &Helm) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": charts::NAMESPACE},
        }))
        .map_err(|source| Error::Json {
            what: "namespace".into(),
            source,
        })?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(kube_err("creating namespace aws-dra")(e)),
        }
        let mut objects = charts::cluster_objects(helm, &self.client).await?;
        objects.extend(manifests::parse("gpu-test-driver.yaml", GPU_TEST_MANIFEST)?);
        for obj in &objects {
            manifests::apply(&self.client, obj, None).await?;
            tracing::info!(object = %manifests::id(obj), "applied");
        }
        // Token requests need the ServiceAccounts; they exist once applied.
        Ok(())
    }

    async fn setup_node(
        &self,
        name: &str,
        instance_type: &str,
        drivers: &[DriverKind],
    ) -> Result<()> {
        let (local, node_run_dir) = {
            let cluster = self.cluster.lock().await;
            let node = cluster
                .node(name)
                .ok_or_else(|| Error::Testbed(format!("no node {name} in the cluster")))?;
            (node.clone(), node.run_dir.clone())
        };
        let fixture_dir = node_run_dir.join("fixture");
        if fixture_dir.exists() {
            std::fs::remove_dir_all(&fixture_dir).map_err(io("removing", &fixture_dir))?;
        }
        let fixture: Fixture = sysfs_fixtures::generate(instance_type, &fixture_dir)?;
        let mut slots = BTreeMap::new();
        for kind in drivers {
            let kubeconfig = self.bound_token_kubeconfig(name, *kind).await?;
            slots.insert(
                *kind,
                DriverSlot {
                    kubeconfig,
                    metrics_port: free_port()?,
                    process: None,
                },
            );
        }
        {
            let mut nodes = self.lock_nodes()?;
            nodes.push(NodeState {
                info: NodeInfo {
                    name: name.to_string(),
                    node_name: name.to_string(),
                    fixture,
                    drivers: drivers.to_vec(),
                },
                cdi_dir: local.cdi_dir.clone(),
                plugins_dir: local.plugins_dir.clone(),
                drivers: slots,
            });
        }
        for kind in drivers {
            self.start_driver(name, *kind).await?;
        }
        Ok(())
    }

    /// Placeholder pod on `node` under the driver's ServiceAccount, and a
    /// kubeconfig with a token bound to it.
    async fn bound_token_kubeconfig(&self, node: &str, kind: DriverKind) -> Result<PathBuf> {
        let (namespace, sa) = kind.service_account();
        self.bound_token_kubeconfig_as(node, &namespace, &sa, kind.binary())
            .await
    }

    /// Like the drivers' credentials, for any ServiceAccount: a placeholder
    /// pod `<binary>-<node>` pinned to `node`, and a kubeconfig
    /// (`<run_dir>/<binary>-<node>.kubeconfig`) with a token bound to it.
    pub async fn bound_token_kubeconfig_as(
        &self,
        node: &str,
        namespace: &str,
        sa: &str,
        binary: &str,
    ) -> Result<PathBuf> {
        let pod_name = format!("{binary}-{node}");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": {"aws-dra.dev/e2e": "driver-identity", "aws-dra.dev/driver": binary},
            },
            "spec": {
                // Pinned like a DaemonSet pod: the token's node-name extra
                // comes from this field.
                "nodeName": node,
                "serviceAccountName": sa,
                "automountServiceAccountToken": false,
                "hostNetwork": true,
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "identity",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                }],
            },
        }))
        .map_err(|source| Error::Json {
            what: "placeholder pod".into(),
            source,
        })?;
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(kube_err(format!("creating pod {namespace}/{pod_name}")))?;
        let uid = created
            .metadata
            .uid
            .ok_or_else(|| Error::Testbed(format!("pod {pod_name} has no uid")))?;
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": 86400,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid},
            },
        }))
        .map_err(|source| Error::Json {
            what: "token request".into(),
            source,
        })?;
        let body = request;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let issued: TokenRequest = sas
            .create_subresource("token", sa, &PostParams::default(), &body)
            .await
            .map_err(kube_err(format!("requesting a token for {namespace}/{sa}")))?;
        let token = issued
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::Testbed(format!("token request for {sa} has no status")))?;
        let cluster = self.cluster.lock().await;
        cluster.kubeconfig_for_token(
            &format!("{binary}-{node}"),
            &format!("system:serviceaccount:{namespace}:{sa}"),
            &token,
        )
    }

    /// Starts another host process on `node` (see
    /// [`LocalCluster::spawn_host_process`]): what `cargo xtask bench` runs
    /// its reference driver with.
    pub async fn spawn_on_node(
        &self,
        node: &str,
        name: &str,
        command: Command,
    ) -> Result<HostProcess> {
        self.cluster
            .lock()
            .await
            .spawn_host_process(node, name, command)
    }

    /// The cluster's view of `node` (its kubelet dirs, CDI dir).
    pub async fn local_node(&self, node: &str) -> Option<crate::LocalNode> {
        self.cluster.lock().await.node(node).cloned()
    }

    /// The cluster, for faults below the testbed (`cargo xtask chaos`).
    pub async fn cluster(&self) -> tokio::sync::MutexGuard<'_, LocalCluster> {
        self.cluster.lock().await
    }

    /// The process id of a running driver.
    pub fn driver_pid(&self, node: &str, kind: DriverKind) -> Option<i32> {
        self.with_slot(node, kind, |_, s| s.process.as_ref().map(HostProcess::pid))
            .ok()?
    }

    fn lock_nodes(&self) -> Result<std::sync::MutexGuard<'_, Vec<NodeState>>> {
        self.nodes
            .lock()
            .map_err(|_| Error::Testbed("testbed state poisoned".into()))
    }

    fn cdi_dir(&self, node: &str) -> Result<PathBuf> {
        let nodes = self.lock_nodes()?;
        let n = nodes.iter().find(|n| n.info.name == node);
        n.map(|n| n.cdi_dir.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    fn with_slot<T>(
        &self,
        node: &str,
        kind: DriverKind,
        f: impl FnOnce(&NodeState, &DriverSlot) -> T,
    ) -> Result<T> {
        let nodes = self.lock_nodes()?;
        let n = nodes
            .iter()
            .find(|n| n.info.name == node)
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))?;
        let slot = n
            .drivers
            .get(&kind)
            .ok_or_else(|| Error::Testbed(format!("{} does not run on {node}", kind.binary())))?;
        Ok(f(n, slot))
    }

    fn driver_log(&self, node: &str, kind: DriverKind) -> PathBuf {
        self.run_dir
            .join("nodes")
            .join(node)
            .join(format!("{}.log", kind.binary()))
    }

    /// Waits until the driver's pool on `node` is complete: every slice of
    /// the newest generation present and `expected` devices in them.
    async fn wait_for_pool(&self, node: &str, kind: DriverKind, expected: usize) -> Result<()> {
        let complete =
            wait_pool_complete(&self.client, node, kind, expected, SLICES_TIMEOUT, || {
                if self.driver_running(node, kind) {
                    Ok(())
                } else {
                    Err(Error::Testbed(format!(
                        "{} on {node} exited before publishing; log: {}",
                        kind.binary(),
                        self.driver_log(node, kind).display()
                    )))
                }
            })
            .await?;
        if complete {
            return Ok(());
        }
        Err(Error::Timeout {
            what: format!(
                "{expected} {} devices of node {node} in ResourceSlices (driver log {})",
                kind.driver_name(),
                self.driver_log(node, kind).display()
            ),
            after: SLICES_TIMEOUT,
            logs: self.run_dir.clone(),
        })
    }
}

impl ManagedTestbed for LocalTestbed {
    fn start_times(&self) -> Vec<(String, DriverKind, Duration)> {
        self.start_times
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    fn shutdown(self) -> TeardownReport {
        self.cluster.into_inner().shutdown()
    }
}

impl Testbed for LocalTestbed {
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
        {
            let mut cluster = self.cluster.lock().await;
            cluster
                .add_node_now(&NodeSpec::for_fixture(name, instance_type))
                .await?;
        }
        self.setup_node(name, instance_type, drivers).await
    }

    async fn start_driver(&self, node: &str, kind: DriverKind) -> Result<Duration> {
        let started = Instant::now();
        let expected = self.spawn_driver_process(node, kind).await?;
        self.wait_for_pool(node, kind, expected).await?;
        let elapsed = started.elapsed();
        // The figure is the cold start; a restart finds its pool already there.
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
        let p = self.with_slot(node, kind, |_, s| s.process.clone())?;
        let p =
            p.ok_or_else(|| Error::Testbed(format!("{} never started on {node}", kind.binary())))?;
        p.kill();
        Ok(())
    }

    async fn stop_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        let p = self.with_slot(node, kind, |_, s| s.process.clone())?;
        let p =
            p.ok_or_else(|| Error::Testbed(format!("{} never started on {node}", kind.binary())))?;
        tokio::task::spawn_blocking(move || p.terminate(Duration::from_secs(10)))
            .await
            .map_err(|e| Error::Testbed(format!("stopping {}: {e}", kind.binary())))?;
        Ok(())
    }

    fn driver_running(&self, node: &str, kind: DriverKind) -> bool {
        self.with_slot(node, kind, |_, s| {
            s.process.as_ref().is_some_and(HostProcess::is_running)
        })
        .unwrap_or(false)
    }

    fn driver_kubeconfig(&self, node: &str, kind: DriverKind) -> Result<PathBuf> {
        self.with_slot(node, kind, |_, s| s.kubeconfig.clone())
    }

    async fn driver_metrics(&self, node: &str, kind: DriverKind) -> Result<String> {
        let port = self.with_slot(node, kind, |_, s| s.metrics_port)?;
        tokio::task::spawn_blocking(move || {
            http_get(SocketAddr::from(([127, 0, 0, 1], port)), "/metrics")
        })
        .await
        .map_err(|e| Error::Testbed(format!("metrics task: {e}")))?
    }

    fn driver_rss_kib(&self, node: &str, kind: DriverKind) -> Option<u64> {
        let pid = self
            .with_slot(node, kind, |_, s| s.process.as_ref().map(HostProcess::pid))
            .ok()??;
        rss_kib(pid)
    }

    fn fixture_sysfs(&self, node: &str) -> Result<PathBuf> {
        let nodes = self.lock_nodes()?;
        nodes
            .iter()
            .find(|n| n.info.name == node)
            .map(|n| n.info.fixture.sys.clone())
            .ok_or_else(|| Error::Testbed(format!("no node {node}")))
    }

    fn node_dir_files(&self, node: &str, dir: NodeDir) -> Result<Vec<String>> {
        list_dir(&dir.of(&self.cdi_dir(node)?))
    }

    fn node_dir_file(&self, node: &str, dir: NodeDir, name: &str) -> Result<Option<Vec<u8>>> {
        read_if_exists(&dir.of(&self.cdi_dir(node)?).join(name))
    }

    fn checkpoint(
        &self,
        node: &str,
        kind: DriverKind,
    ) -> Result<Option<dra_core::testing::Checkpoint>> {
        let path = self.with_slot(node, kind, |n, _| {
            n.plugins_dir
                .join(kind.driver_name())
                .join("checkpoint.json")
        })?;
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Json {
                    what: path.display().to_string(),
                    source,
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", &path)(e)),
        }
    }

    fn adapt_pod(&self, pod: &mut Value) {
        adapt_pod_for_local(pod);
    }

    fn logs_hint(&self) -> String {
        format!(
            "component logs in {} (drivers: nodes/<node>/<driver>.log, kubelet: nodes/<node>/kubelet.log)",
            self.run_dir.display()
        )
    }

    fn offers() -> &'static [TestbedOp] {
        &[
            TestbedOp::StopApiServer,
            TestbedOp::EnableFeatureGates,
            TestbedOp::NodeState,
        ]
    }

    fn damage_checkpoint(&self, node: &str, kind: DriverKind) -> Result<()> {
        self.truncate_checkpoint(node, kind)
    }

    async fn kill_container(&self, node: &str, container_id: &str) -> Result<()> {
        self.kill_node_container(node, container_id).await
    }

    async fn with_api_server_stopped<R>(&self, outage: impl Future<Output = R>) -> Result<R> {
        self.api_server_outage(outage).await
    }

    async fn spawn_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        self.spawn_driver_process(node, kind).await.map(|_| ())
    }

    async fn driver_readyz(&self, node: &str, kind: DriverKind) -> Result<(u16, String)> {
        self.readyz(node, kind).await
    }

    fn driver_process_id(&self, node: &str, kind: DriverKind) -> Option<i32> {
        self.driver_pid(node, kind)
    }
}
