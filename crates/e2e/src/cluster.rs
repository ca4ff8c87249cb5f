//! [`LocalCluster`]: the control plane and nodes of one end-to-end run.
//!
//! Layout of a run `<id>`:
//! - `target/e2e/<id>/` (the *run dir*, kept): component logs, certificates,
//!   kubeconfigs, generated configs; `nodes/<node>/` per node.
//! - `/run/ad/<pid>/` (the *state dir*, removed on teardown), `<n>/` for the
//!   n-th node: kubelet root dirs (`k/`), containerd root/state, sockets, CDI
//!   dirs. It is short on purpose: unix socket paths (≤107 bytes) are built
//!   under it (see `new_state_dir`).
//!
//! Everything listens on loopback or unix sockets, except that the kubelets
//! serve on [`NODE_IP`], an address added to `lo` (the kubelet rejects a
//! loopback node IP, and the apiserver must reach the kubelet at the node's
//! InternalIP for logs and exec).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::cgroups;
use crate::error::{Error, Result, io};
use crate::node::{self, LocalNode, NodeProcesses};
use crate::pki::{self, CertPair, ClusterCa, Credentials};
use crate::process::{self, ManagedProcess, TeardownGuard};
use crate::toolchain::{Binaries, default_kubernetes_version, repo_root};
use crate::versions::KubernetesVersion;

/// The address the kubelets serve on; added to `lo` if missing.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Service CIDR given to the apiserver and controller-manager.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

/// One node to start.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Node name: a DNS label of at most 20 characters (it ends up in paths).
    pub name: String,
    /// Labels the kubelet registers the Node with (`--node-labels`).
    pub labels: BTreeMap<String, String>,
}

impl NodeSpec {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            labels: BTreeMap::new(),
        }
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub nodes: Vec<NodeSpec>,
    pub kubernetes_version: KubernetesVersion,
    /// How long each phase (control plane, each node) may take to come up.
    pub start_timeout: Duration,
    /// Leave the state dir (kubelet roots, containerd state) on teardown.
    pub keep_state_dir: bool,
}

impl ClusterConfig {
    /// One node per name, on the pinned Kubernetes version, or on the one
    /// `AWS_DRA_K8S_VERSION` names (a compatibility run:
    /// `cargo xtask e2e --cluster local --k8s-version v1.37.2`).
    pub fn with_nodes(names: &[&str]) -> Self {
        Self {
            nodes: names.iter().map(|n| NodeSpec::new(n)).collect(),
            kubernetes_version: selected_kubernetes_version(),
            start_timeout: Duration::from_secs(120),
            keep_state_dir: false,
        }
    }
}

/// `AWS_DRA_K8S_VERSION` when set and valid (a minor such as `1.34` or an
/// exact version), else the main release's pinned patch. An invalid value is
/// reported and ignored rather than silently testing something else than
/// asked: the version is logged at cluster start.
pub fn selected_kubernetes_version() -> KubernetesVersion {
    match std::env::var("AWS_DRA_K8S_VERSION") {
        Ok(v) if !v.is_empty() => KubernetesVersion::resolve(&v).unwrap_or_else(|e| {
            tracing::error!(value = %v, error = %e, "AWS_DRA_K8S_VERSION is not a known version; using the main one");
            default_kubernetes_version()
        }),
        _ => default_kubernetes_version(),
    }
}

/// Mutable state shared with the Ctrl-C hook; teardown empties it.
pub(crate) struct Processes {
    /// Control-plane processes in start order (torn down in reverse).
    control_plane: Vec<ManagedProcess>,
    /// Per node: runtime and kubelet.
    nodes: Vec<NodeProcesses>,
    /// Host processes started for a node (drivers, publishers), by node.
    host: Vec<ManagedProcess>,
    /// Every pid we started, to prove none is left.
    started_pids: BTreeSet<i32>,
    torn_down: bool,
}

pub(crate) struct Inner {
    pub(crate) id: String,
    pub(crate) run_dir: PathBuf,
    pub(crate) state_dir: PathBuf,
    /// cgroup path (relative to each hierarchy) holding the whole run.
    pub(crate) cgroup: String,
    keep_state_dir: bool,
    pub(crate) processes: Mutex<Processes>,
}

/// What teardown found.
#[derive(Debug, Clone, Default)]
pub struct TeardownReport {
    /// Pids of ours still alive after teardown (should be empty).
    pub leftover_pids: Vec<i32>,
    /// cgroups that could not be removed.
    pub leftover_cgroups: Vec<PathBuf>,
    /// Mounts under the state dir that could not be unmounted.
    pub leftover_mounts: Vec<PathBuf>,
}

impl TeardownReport {
    pub fn is_clean(&self) -> bool {
        self.leftover_pids.is_empty()
            && self.leftover_cgroups.is_empty()
            && self.leftover_mounts.is_empty()
    }
}

impl Inner {
    fn teardown(&self) -> TeardownReport {
        let mut report = TeardownReport::default();
        let Ok(mut procs) = self.processes.lock() else {
            return report;
        };
        if procs.torn_down {
            return report;
        }
        procs.torn_down = true;
        let grace = Duration::from_secs(5);
        for p in procs.host.iter_mut().rev() {
            p.terminate(grace);
        }
        // Kubelets first so nothing restarts containers, then every process in
        // the node cgroups (containers, shims), then the runtimes.
        for n in procs.nodes.iter_mut() {
            n.stop_kubelet(grace);
        }
        kill_cgroup(&self.cgroup);
        for n in procs.nodes.iter_mut() {
            n.stop_runtime(grace);
        }
        for p in procs.control_plane.iter_mut().rev() {
            p.terminate(grace);
        }
        kill_cgroup(&self.cgroup);
        let mut pids: BTreeSet<i32> = procs.started_pids.clone();
        pids.extend(cgroups::pids_under(&self.cgroup));
        report.leftover_pids = pids
            .into_iter()
            .filter(|p| process::pid_alive(*p))
            .collect();
        report.leftover_mounts = node::unmount_below(&self.state_dir);
        report.leftover_cgroups = cgroups::remove_everywhere(&self.cgroup);
        if !self.keep_state_dir && report.leftover_mounts.is_empty() {
            let _ = fs::remove_dir_all(&self.state_dir);
        }
        if !report.is_clean() {
            eprintln!(
                "aws-dra-e2e: teardown of {} left {report:?}; logs in {}",
                self.id,
                self.run_dir.display()
            );
        }
        report
    }
}

/// SIGKILLs every process in the run's cgroups, a few rounds (a dying shim
/// can still fork).
fn kill_cgroup(relative: &str) {
    for _ in 0..20 {
        let pids = cgroups::pids_under(relative);
        let alive: Vec<i32> = pids
            .into_iter()
            .filter(|p| process::pid_alive(*p))
            .collect();
        if alive.is_empty() {
            return;
        }
        for pid in alive {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running local cluster; dropping it tears everything down.
pub struct LocalCluster {
    inner: Arc<Inner>,
    _interrupt: TeardownGuard,
    binaries: Binaries,
    ca: ClusterCa,
    server: String,
    admin_kubeconfig: PathBuf,
    client: Option<kube::Client>,
    nodes: Vec<LocalNode>,
}

impl LocalCluster {
    /// Starts etcd, the control plane and every node of `config`, and waits
    /// until each Node object is registered. Binaries must have been built
    /// (`cargo xtask k8s build`). Needs root.
    pub async fn start(config: ClusterConfig) -> Result<Self> {
        if !nix::unistd::geteuid().is_root() {
            return Err(Error::Host(
                "the local cluster runs kubelets and containerd: run as root".into(),
            ));
        }
        for n in &config.nodes {
            if !is_short_dns_label(&n.name) {
                return Err(Error::BadNodeName(n.name.clone()));
            }
        }
        let binaries = Binaries::locate(&config.kubernetes_version)?;
        let id = run_id();
        let run_dir = std::env::var_os("AWS_DRA_E2E_DIR")
            .map_or_else(|| repo_root().join("target/e2e"), PathBuf::from)
            .join(&id);
        fs::create_dir_all(&run_dir).map_err(io("creating", &run_dir))?;
        let state_dir = new_state_dir()?;
        let run_dir = run_dir.canonicalize().map_err(io("resolving", &run_dir))?;
        eprintln!("aws-dra-e2e: run {id}: logs in {}", run_dir.display());

        let inner = Arc::new(Inner {
            id: id.clone(),
            run_dir: run_dir.clone(),
            state_dir,
            cgroup: format!("aws-dra-e2e/{id}"),
            keep_state_dir: config.keep_state_dir,
            processes: Mutex::new(Processes {
                control_plane: Vec::new(),
                nodes: Vec::new(),
                host: Vec::new(),
                started_pids: BTreeSet::new(),
                torn_down: false,
            }),
        });
        let weak: Weak<Inner> = Arc::downgrade(&inner);
        let guard = process::on_interrupt(Arc::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.teardown();
            }
        }));
        let ca = ClusterCa::create(&run_dir.join("pki"))?;
        let mut cluster = Self {
            inner,
            _interrupt: guard,
            binaries,
            ca,
            server: String::new(),
            admin_kubeconfig: run_dir.join("admin.kubeconfig"),
            client: None,
            nodes: Vec::new(),
        };
        match cluster.bring_up(&config).await {
            Ok(()) => Ok(cluster),
            Err(err) => {
                eprintln!(
                    "aws-dra-e2e: cluster start failed: {err}\naws-dra-e2e: logs in {}",
                    cluster.inner.run_dir.display()
                );
                Err(err)
            }
        }
    }

    async fn bring_up(&mut self, config: &ClusterConfig) -> Result<()> {
        node::ensure_node_ip(NODE_IP)?;
        cgroups::create_everywhere(&self.inner.cgroup)?;
        let run_dir = self.inner.run_dir.clone();
        let timeout = config.start_timeout;
        let mut ports = PortAllocator::default();

        // etcd
        let etcd_client = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let etcd_peer = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let mut etcd = Command::new(&self.binaries.etcd);
        etcd.arg("--name=e2e")
            .arg(format!(
                "--data-dir={}",
                self.inner.state_dir.join("etcd").display()
            ))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=e2e={peer_url}"))
            // Throwaway data: skip fsync, it is the slowest part on a small VM.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        self.spawn_control_plane("etcd", etcd)?;
        self.wait_until("etcd /health", timeout, || {
            http_get_ok(SocketAddr::from(([127, 0, 0, 1], etcd_client)), "/health")
        })
        .await?;

        // kube-apiserver
        let pki_dir = run_dir.join("pki");
        let api_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        self.server = format!("https://127.0.0.1:{api_port}");
        let serving = self.ca.serving_cert(
            "kube-apiserver",
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(NODE_IP),
            ],
        )?;
        // The apiserver's identity toward kubelets (logs, exec): full access.
        let kubelet_client = self.ca.client_cert(
            "kube-apiserver-kubelet-client",
            "kube-apiserver",
            &["system:masters"],
        )?;
        let sa = self.ca.service_account_key()?;
        // Everything that differs between Kubernetes releases comes from its table.
        let release = self.binaries.kubernetes_version.release()?;
        let mut apiserver = Command::new(&self.binaries.kube_apiserver);
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={api_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("apiserver-generated").display()
            ))
            .arg(format!("--tls-cert-file={}", serving.cert_file.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                serving.key_file.display()
            ))
            .arg(format!("--client-ca-file={}", self.ca.cert_file.display()))
            .arg(format!(
                "--kubelet-client-certificate={}",
                kubelet_client.cert_file.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                kubelet_client.key_file.display()
            ))
            .arg(format!(
                "--kubelet-certificate-authority={}",
                self.ca.cert_file.display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                sa.public_key_file.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa.private_key_file.display()
            ))
            .arg("--authorization-mode=Node,RBAC")
            // Added to the default-on set (which includes ValidatingAdmissionPolicy).
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--allow-privileged=true")
            // A loopback advertise address is refused by the endpoint reconciler.
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false")
            .args(release.control_plane_flags(true));
        self.spawn_control_plane("kube-apiserver", apiserver)?;

        let admin = self
            .ca
            .client_cert("admin", "system:admin", &["system:masters"])?;
        let admin_kubeconfig = self.admin_kubeconfig.clone();
        self.write_kubeconfig(&admin_kubeconfig, "system:admin", &admin)?;
        let client = client_from_kubeconfig(&admin_kubeconfig).await?;
        self.wait_until_async("kube-apiserver /readyz", timeout, || {
            let client = client.clone();
            async move {
                let req = http_request("/readyz");
                matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok")
            }
        })
        .await?;
        self.client = Some(client.clone());

        // kube-controller-manager
        let kcm_cert = self.ca.client_cert(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let kcm_kubeconfig = run_dir.join("kube-controller-manager.kubeconfig");
        self.write_kubeconfig(&kcm_kubeconfig, "system:kube-controller-manager", &kcm_cert)?;
        let kcm_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let mut kcm = Command::new(&self.binaries.kube_controller_manager);
        kcm.arg(format!("--kubeconfig={}", kcm_kubeconfig.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                kcm_kubeconfig.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                kcm_kubeconfig.display()
            ))
            .arg("--use-service-account-credentials")
            .arg(format!(
                "--service-account-private-key-file={}",
                sa.private_key_file.display()
            ))
            .arg(format!("--root-ca-file={}", self.ca.cert_file.display()))
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={kcm_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("kcm-generated").display()
            ))
            .arg("--controllers=*")
            .args(release.control_plane_flags(false));
        self.spawn_control_plane("kube-controller-manager", kcm)?;

        // kube-scheduler
        let sched_cert = self
            .ca
            .client_cert("kube-scheduler", "system:kube-scheduler", &[])?;
        let sched_kubeconfig = run_dir.join("kube-scheduler.kubeconfig");
        self.write_kubeconfig(&sched_kubeconfig, "system:kube-scheduler", &sched_cert)?;
        let sched_config = run_dir.join("kube-scheduler.config.json");
        write_json(
            &sched_config,
            &json!({
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": sched_kubeconfig},
                "leaderElection": {"leaderElect": false},
            }),
        )?;
        let sched_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let mut scheduler = Command::new(&self.binaries.kube_scheduler);
        scheduler
            .arg(format!("--config={}", sched_config.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                sched_kubeconfig.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                sched_kubeconfig.display()
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={sched_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("scheduler-generated").display()
            ))
            .args(release.control_plane_flags(false));
        self.spawn_control_plane("kube-scheduler", scheduler)?;

        // The controller-manager is up once it created the default ServiceAccount
        // (ServiceAccount admission rejects pods until then).
        let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.wait_until_async("ServiceAccount default/default", timeout, || {
            let sa_api = sa_api.clone();
            async move { matches!(sa_api.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;
        self.wait_until("kube-scheduler port", timeout, || {
            TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], sched_port)),
                Duration::from_millis(200),
            )
            .is_ok()
        })
        .await?;

        for spec in &config.nodes {
            self.add_node(spec, &mut ports, timeout).await?;
        }
        Ok(())
    }

    /// Starts one more node (containerd + kubelet) and waits for its Node object.
    pub async fn add_node_now(&mut self, spec: &NodeSpec) -> Result<&LocalNode> {
        let mut ports = PortAllocator::default();
        self.add_node(spec, &mut ports, Duration::from_secs(120))
            .await?;
        self.nodes
            .last()
            .ok_or_else(|| Error::Host("node list empty after add".into()))
    }

    async fn add_node(
        &mut self,
        spec: &NodeSpec,
        ports: &mut PortAllocator,
        timeout: Duration,
    ) -> Result<()> {
        let node_cert = self.ca.client_cert(
            &format!("node-{}", spec.name),
            &format!("system:node:{}", spec.name),
            &["system:nodes"],
        )?;
        let serving = self.ca.serving_cert(
            &format!("kubelet-serving-{}", spec.name),
            &format!("system:node:{}", spec.name),
            &[spec.name.as_str()],
            &[IpAddr::V4(NODE_IP)],
        )?;
        let node_run_dir = self.inner.run_dir.join("nodes").join(&spec.name);
        fs::create_dir_all(&node_run_dir).map_err(io("creating", &node_run_dir))?;
        let kubeconfig = node_run_dir.join("kubelet.kubeconfig");
        self.write_kubeconfig(
            &kubeconfig,
            &format!("system:node:{}", spec.name),
            &node_cert,
        )?;
        let plan = node::NodePlan {
            spec: spec.clone(),
            run_dir: node_run_dir,
            // By index, not name: short (see `new_state_dir`).
            state_dir: self.inner.state_dir.join(self.nodes.len().to_string()),
            cgroup_root: format!("{}/{}", self.inner.cgroup, spec.name),
            kubeconfig,
            serving,
            client_ca: self.ca.cert_file.clone(),
            kubelet_port: ports.pick(IpAddr::V4(NODE_IP))?,
            healthz_port: ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?,
        };
        let (local, procs) = node::start(&plan, &self.binaries, timeout).await?;
        self.record_node(procs)?;
        let client = self.client()?;
        let nodes: Api<Node> = Api::all(client);
        let name = spec.name.clone();
        self.wait_until_async(&format!("Node {name} registered"), timeout, || {
            let nodes = nodes.clone();
            let name = name.clone();
            async move { matches!(nodes.get_opt(&name).await, Ok(Some(_))) }
        })
        .await?;
        self.nodes.push(local);
        Ok(())
    }

    fn record_node(&self, procs: NodeProcesses) -> Result<()> {
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        guard.started_pids.extend(procs.pids());
        guard.nodes.push(procs);
        Ok(())
    }

    fn spawn_control_plane(&self, name: &str, command: Command) -> Result<()> {
        let log = self.inner.run_dir.join(format!("{name}.log"));
        let p = ManagedProcess::spawn(name, command, &log)?;
        cgroups::track(&format!("{}/control-plane", self.inner.cgroup), p.pid())?;
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        guard.started_pids.insert(p.pid());
        guard.control_plane.push(p);
        Ok(())
    }

    fn write_kubeconfig(&self, path: &Path, user: &str, cert: &CertPair) -> Result<()> {
        pki::write_kubeconfig(
            path,
            &self.server,
            &self.ca.cert_file,
            user,
            Credentials::ClientCert(cert),
        )
    }

    /// Fails fast when any control-plane or node process died.
    fn check_processes(&self) -> Result<()> {
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        for p in guard.control_plane.iter_mut() {
            p.check_running()?;
        }
        for n in guard.nodes.iter_mut() {
            n.check_running()?;
        }
        Ok(())
    }

    async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<()> {
        self.wait_until_async(what, timeout, || std::future::ready(probe()))
            .await
    }

    async fn wait_until_async<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            if probe().await {
                tracing::info!(
                    what,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "ready"
                );
                return Ok(());
            }
            self.check_processes()?;
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: timeout,
                    logs: self.inner.run_dir.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// An admin (`system:masters`) client.
    pub fn client(&self) -> Result<kube::Client> {
        self.client
            .clone()
            .ok_or_else(|| Error::Host("cluster has no API client yet".into()))
    }

    /// kubeconfig of the admin identity.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// `https://127.0.0.1:<port>` of the apiserver.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The CA every component and client trusts.
    pub fn ca_file(&self) -> &Path {
        &self.ca.cert_file
    }

    /// Where logs, certificates and kubeconfigs of this run are kept.
    pub fn run_dir(&self) -> &Path {
        &self.inner.run_dir
    }

    /// Unique id of this run (also the last part of [`Self::run_dir`]).
    pub fn run_id(&self) -> &str {
        &self.inner.id
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    pub fn nodes(&self) -> &[LocalNode] {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&LocalNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Issues a client-certificate kubeconfig for any identity (`user`, `groups`),
    /// written to `<run_dir>/<file_stem>.kubeconfig`.
    pub fn kubeconfig_for_user(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<PathBuf> {
        let cert = self.ca.client_cert(file_stem, user, groups)?;
        let path = self.inner.run_dir.join(format!("{file_stem}.kubeconfig"));
        self.write_kubeconfig(&path, user, &cert)?;
        Ok(path)
    }

    /// Writes a bearer-token kubeconfig (e.g. a service-account token bound
    /// to a pod, from the TokenRequest API) to `<run_dir>/<file_stem>.kubeconfig`.
    pub fn kubeconfig_for_token(
        &self,
        file_stem: &str,
        user: &str,
        token: &str,
    ) -> Result<PathBuf> {
        let path = self.inner.run_dir.join(format!("{file_stem}.kubeconfig"));
        pki::write_kubeconfig(
            &path,
            &self.server,
            &self.ca.cert_file,
            user,
            Credentials::Token(token),
        )?;
        Ok(path)
    }

    /// Starts `command` as a host process bound to node `node`: in its own
    /// process group, torn down with the cluster, log at
    /// `<run_dir>/nodes/<node>/<name>.log`. The environment carries what a
    /// driver DaemonSet would get: `NODE_NAME`, `KUBELET_REGISTRAR_DIRECTORY_PATH`,
    /// `KUBELET_PLUGINS_DIRECTORY_PATH`, `CDI_ROOT`, and `KUBECONFIG` (the
    /// node's `system:node:<name>` identity unless the command sets its own).
    pub fn spawn_host_process(
        &self,
        node: &str,
        name: &str,
        mut command: Command,
    ) -> Result<HostProcess> {
        let n = self
            .node(node)
            .ok_or_else(|| Error::Host(format!("no node named {node}")))?;
        command
            .env("NODE_NAME", &n.name)
            .env("KUBELET_REGISTRAR_DIRECTORY_PATH", &n.plugins_registry_dir)
            .env("KUBELET_PLUGINS_DIRECTORY_PATH", &n.plugins_dir)
            .env("CDI_ROOT", &n.cdi_dir);
        let has_kubeconfig = command.get_envs().any(|(k, _)| k == "KUBECONFIG");
        if !has_kubeconfig {
            command.env("KUBECONFIG", &n.kubeconfig);
        }
        let log = n.run_dir.join(format!("{name}.log"));
        let p = ManagedProcess::spawn(name, command, &log)?;
        let pid = p.pid();
        cgroups::track(&format!("{}/host/{node}", self.inner.cgroup), pid)?;
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        guard.started_pids.insert(pid);
        guard.host.push(p);
        Ok(HostProcess {
            inner: Arc::downgrade(&self.inner),
            pid,
            log,
        })
    }

    /// Every live process of this run: what it started plus whatever lives in
    /// its cgroups (containerd shims, pause and container processes).
    pub fn live_pids(&self) -> Vec<i32> {
        let mut pids: BTreeSet<i32> = self
            .inner
            .processes
            .lock()
            .map(|p| p.started_pids.clone())
            .unwrap_or_default();
        pids.extend(cgroups::pids_under(&self.inner.cgroup));
        // Pod processes live under the kubelets' cgroup roots, which are inside ours.
        pids.into_iter()
            .filter(|p| process::pid_alive(*p))
            .collect()
    }

    /// Stops everything now and reports what, if anything, was left behind.
    pub fn shutdown(self) -> TeardownReport {
        self.inner.teardown()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "aws-dra-e2e: tearing down after a panic; logs in {}",
                self.inner.run_dir.display()
            );
        }
        self.inner.teardown();
    }
}

/// Handle to a host process started with [`LocalCluster::spawn_host_process`].
#[derive(Debug, Clone)]
pub struct HostProcess {
    inner: Weak<Inner>,
    pid: i32,
    log: PathBuf,
}

impl HostProcess {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    fn with<T>(&self, f: impl FnOnce(&mut ManagedProcess) -> T) -> Option<T> {
        let inner = self.inner.upgrade()?;
        let mut guard = inner.processes.lock().ok()?;
        guard.host.iter_mut().find(|p| p.pid() == self.pid).map(f)
    }

    pub fn is_running(&self) -> bool {
        self.with(|p| p.is_running()).unwrap_or(false)
    }

    /// SIGKILL, as a crash would (the process group goes too).
    pub fn kill(&self) {
        self.with(|p| p.kill());
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&self, grace: Duration) {
        self.with(|p| p.terminate(grace));
    }
}

#[derive(Default)]
struct PortAllocator {
    used: BTreeSet<(IpAddr, u16)>,
}

impl PortAllocator {
    /// A port that is free on `ip` now (the kernel picks; we never hand the same one out twice).
    fn pick(&mut self, ip: IpAddr) -> Result<u16> {
        for _ in 0..50 {
            let listener = TcpListener::bind((ip, 0))
                .map_err(|source| Error::NoFreePort { addr: ip, source })?;
            let port = listener
                .local_addr()
                .map_err(|source| Error::NoFreePort { addr: ip, source })?
                .port();
            if self.used.insert((ip, port)) {
                return Ok(port);
            }
        }
        Err(Error::NoFreePort {
            addr: ip,
            source: std::io::Error::other("kernel kept returning used ports"),
        })
    }
}

/// Root of the state dirs (`/run/ad/<pid>`, short for unix socket paths).
pub const STATE_ROOT: &str = "/run/ad";

/// A new, empty `/run/ad/<pid in hex>[suffix]`. As short as it is because
/// unix socket paths (≤ 107 bytes) are built under it: with a pod's UID in
/// its name (the DaemonSet's seamless-upgrade naming), an EFA registration
/// socket takes 86 bytes after the kubelet root dir, so the root may be 21
/// bytes at most: `/run/ad/<pid>/<n>/k` is.
fn new_state_dir() -> Result<PathBuf> {
    let root = Path::new(STATE_ROOT);
    fs::create_dir_all(root).map_err(io("creating", root))?;
    let pid = format!("{:x}", std::process::id());
    for suffix in ["", "a", "b", "c", "d", "e", "f", "g"] {
        let dir = root.join(format!("{pid}{suffix}"));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("creating", &dir)(e)),
        }
    }
    Err(Error::Host(format!(
        "{STATE_ROOT}/{pid}* all exist: remove the state dirs of old runs"
    )))
}

fn run_id() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{secs}-{}", std::process::id())
}

fn is_short_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn http_request(path: &str) -> http::Request<Vec<u8>> {
    let mut req = http::Request::new(Vec::new());
    *req.uri_mut() = http::Uri::try_from(path).unwrap_or_default();
    req
}

/// Minimal HTTP/1.0 GET on loopback (etcd's /health), true on a 200.
fn http_get_ok(addr: SocketAddr, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}

pub(crate) fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| Error::Json {
        what: path.display().to_string(),
        source,
    })?;
    fs::write(path, text).map_err(io("writing", path))
}

/// A client for the kubeconfig at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let err = |message: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|source| Error::Kube {
        action: format!("building a client from {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_must_be_short_labels() {
        for (name, ok) in [
            ("p5", true),
            ("trn2", true),
            ("trn1-big", true),
            ("", false),
            ("P5", false),
            ("-p5", false),
            ("a-very-long-node-name-indeed", false),
            ("p5/x", false),
        ] {
            assert_eq!(is_short_dns_label(name), ok, "{name}");
        }
    }

    #[test]
    fn ports_are_not_handed_out_twice() {
        let mut ports = PortAllocator::default();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let picked: BTreeSet<u16> = (0..20).map(|_| ports.pick(ip).unwrap()).collect();
        assert_eq!(picked.len(), 20);
    }
}
