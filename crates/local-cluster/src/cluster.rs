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

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cgroups;
pub use crate::cluster_config::{
    ClusterConfig, NODE_IP, NodeSpec, SERVICE_CIDR, selected_kubernetes_version,
};
use crate::cluster_config::{PortAllocator, is_short_dns_label, run_id};
use crate::error::{Error, Result, io};
use crate::node::{self, LocalNode, NodeProcesses};
use crate::pki::{self, CertPair, ClusterCa, Credentials};
use crate::process::{self, ManagedProcess, TeardownGuard};
use crate::toolchain::{Binaries, repo_root};

/// Mutable state shared with the Ctrl-C hook; teardown empties it.
pub(crate) struct Processes {
    /// Control-plane processes in start order (torn down in reverse).
    pub(crate) control_plane: Vec<ManagedProcess>,
    /// Per node: runtime and kubelet.
    pub(crate) nodes: Vec<NodeProcesses>,
    /// Host processes started for a node (drivers, publishers), by node.
    host: Vec<ManagedProcess>,
    /// Every pid we started, to prove none is left.
    pub(crate) started_pids: process::StartedPids,
    torn_down: bool,
}

pub(crate) struct Inner {
    pub(crate) id: String,
    pub(crate) run_dir: PathBuf,
    pub(crate) state_dir: PathBuf,
    /// cgroup path (relative to each hierarchy) holding the whole run.
    pub(crate) cgroup: String,
    keep_state_dir: bool,
    kubelet_sync_frequency: Option<Duration>,
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
        let mut pids: BTreeSet<i32> = procs.started_pids.alive();
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
    pub(crate) inner: Arc<Inner>,
    _interrupt: TeardownGuard,
    pub(crate) binaries: Binaries,
    pub(crate) ca: ClusterCa,
    pub(crate) server: String,
    pub(crate) admin_kubeconfig: PathBuf,
    pub(crate) client: Option<kube::Client>,
    pub(crate) nodes: Vec<LocalNode>,
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
        for line in crate::host_limits::raise_inotify_limits() {
            eprintln!("aws-dra-e2e: {line}");
        }
        let id = run_id();
        let run_dir = std::env::var_os("AWS_DRA_E2E_DIR")
            .map_or_else(|| repo_root().join("target/e2e"), PathBuf::from)
            .join(&id);
        fs::create_dir_all(&run_dir).map_err(io("creating", &run_dir))?;
        let state_dir = crate::stale_state::fresh_state_dir(config.keep_state_dir)?;
        let run_dir = run_dir.canonicalize().map_err(io("resolving", &run_dir))?;
        eprintln!("aws-dra-e2e: run {id}: logs in {}", run_dir.display());

        let inner = Arc::new(Inner {
            id: id.clone(),
            run_dir: run_dir.clone(),
            state_dir,
            cgroup: format!("aws-dra-e2e/{id}"),
            keep_state_dir: config.keep_state_dir,
            kubelet_sync_frequency: config.kubelet_sync_frequency,
            processes: Mutex::new(Processes {
                control_plane: Vec::new(),
                nodes: Vec::new(),
                host: Vec::new(),
                started_pids: process::StartedPids::default(),
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

    /// Starts one more node (containerd + kubelet) and waits for its Node object.
    pub async fn add_node_now(&mut self, spec: &NodeSpec) -> Result<&LocalNode> {
        let mut ports = PortAllocator::default();
        self.add_node(spec, &mut ports, Duration::from_secs(120))
            .await?;
        self.nodes
            .last()
            .ok_or_else(|| Error::Host("node list empty after add".into()))
    }

    pub(crate) async fn add_node(
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
            sync_frequency: self.inner.kubelet_sync_frequency,
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

    pub(crate) fn spawn_control_plane(&self, name: &str, command: Command) -> Result<()> {
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

    pub(crate) fn write_kubeconfig(&self, path: &Path, user: &str, cert: &CertPair) -> Result<()> {
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

    pub(crate) async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> bool,
    ) -> Result<()> {
        self.wait_until_async(what, timeout, || std::future::ready(probe()))
            .await
    }

    pub(crate) async fn wait_until_async<F, Fut>(
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
            .map(|p| p.started_pids.alive())
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
