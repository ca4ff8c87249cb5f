//! One node of the local cluster: its own containerd and a real kubelet.
//!
//! Two kubelets share this host, so everything either of them owns is
//! separated (see docs/e2e-local-cluster.md for why each one matters): root
//! dir, cert files, ports, pod logs dir, volume plugin dir, cgroup root, and a
//! containerd of its own (a kubelet garbage-collects containers it does not
//! know, so two kubelets on one runtime would kill each other's pods).
//! containerd gets the node's CDI dir as its only `cdi_spec_dirs` entry, the
//! pause and probe images imported into its `k8s.io` namespace, and a
//! bridge network of the node's own (the `cni` module), so that the Node is
//! Ready; the pods of the tests use the host network.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cgroups;
use crate::cluster_config::{NODE_IP, NodeSpec, write_json};
use crate::cni::PodNetwork;
use crate::error::{Error, Result, io};
use crate::kubelet_socket;
use crate::pki::CertPair;
use crate::process::{ManagedProcess, run_checked};
use crate::toolchain::{Binaries, PAUSE_IMAGE, PROBE_IMAGE};

/// Everything a test needs to know about a running node.
#[derive(Debug, Clone)]
pub struct LocalNode {
    /// The Node name (also the kubelet's `--hostname-override`).
    pub name: String,
    /// The kubelet's `--root-dir`.
    pub kubelet_root_dir: PathBuf,
    /// `<root-dir>/plugins_registry`: where DRA drivers put their registration socket.
    pub plugins_registry_dir: PathBuf,
    /// `<root-dir>/plugins`: where DRA drivers keep their `dra.sock` and data.
    pub plugins_dir: PathBuf,
    /// The node's CDI spec directory, the only one its containerd reads.
    pub cdi_dir: PathBuf,
    /// kubeconfig with the node's identity (`system:node:<name>`, group `system:nodes`).
    pub kubeconfig: PathBuf,
    /// containerd's CRI socket.
    pub containerd_socket: PathBuf,
    /// Snapshotter containerd uses (`overlayfs`, or `native` where overlay mounts fail).
    pub snapshotter: String,
    /// Where the kubelet writes container logs.
    pub pod_logs_dir: PathBuf,
    /// The node's logs and configs: `kubelet.log`, `containerd.log`, host processes.
    pub run_dir: PathBuf,
    /// The kubelet's cgroup root (relative to each hierarchy).
    pub cgroup_root: String,
    pub kubelet_port: u16,
}

pub(crate) struct NodePlan {
    pub spec: NodeSpec,
    pub run_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cgroup_root: String,
    pub kubeconfig: PathBuf,
    pub serving: CertPair,
    pub client_ca: PathBuf,
    pub kubelet_port: u16,
    pub healthz_port: u16,
    /// `syncFrequency` of the kubelet (`None`: its default).
    pub sync_frequency: Option<std::time::Duration>,
}

/// The processes of one node, owned by the cluster's process table.
pub(crate) struct NodeProcesses {
    containerd: ManagedProcess,
    kubelet: Option<ManagedProcess>,
    /// Pids of the `ctr` imports etc. are not kept: they are waited for.
    runtime_cgroup: String,
    /// Removed when the runtime stops.
    pod_network: PodNetwork,
}

impl NodeProcesses {
    pub(crate) fn stop_kubelet(&mut self, grace: Duration) {
        if let Some(k) = self.kubelet.as_mut() {
            k.terminate(grace);
        }
    }

    /// The running kubelet's pid.
    pub(crate) fn kubelet_pid(&self) -> Option<i32> {
        self.kubelet.as_ref().map(ManagedProcess::pid)
    }

    /// Takes the kubelet out of the table (to stop it and start it again).
    pub(crate) fn take_kubelet(&mut self) -> Option<ManagedProcess> {
        self.kubelet.take()
    }

    pub(crate) fn set_kubelet(&mut self, kubelet: ManagedProcess) {
        self.kubelet = Some(kubelet);
    }

    pub(crate) fn stop_runtime(&mut self, grace: Duration) {
        self.containerd.terminate(grace);
        // Shims left containerd's process group but not its cgroup.
        for pid in cgroups::pids_under(&self.runtime_cgroup) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.pod_network.remove();
    }

    pub(crate) fn check_running(&mut self) -> Result<()> {
        self.containerd.check_running()?;
        if let Some(k) = self.kubelet.as_mut() {
            k.check_running()?;
        }
        Ok(())
    }

    pub(crate) fn pids(&self) -> Vec<i32> {
        let mut pids = vec![self.containerd.pid()];
        pids.extend(self.kubelet.as_ref().map(ManagedProcess::pid));
        pids
    }
}

fn mkdirs(dirs: &[&Path]) -> Result<()> {
    for d in dirs {
        fs::create_dir_all(d).map_err(io("creating", *d))?;
    }
    Ok(())
}

/// Starts containerd and the kubelet of one node. The caller waits for the
/// Node object; here we wait only for containerd's socket and the image import.
pub(crate) async fn start(
    plan: &NodePlan,
    binaries: &Binaries,
    timeout: Duration,
) -> Result<(LocalNode, NodeProcesses)> {
    let s = &plan.state_dir;
    // One letter: socket paths are built under it (see `new_state_dir`).
    let kubelet_root = s.join("k");
    let plugins_registry = kubelet_root.join("plugins_registry");
    let plugins = kubelet_root.join("plugins");
    let cdi = s.join("cdi");
    let containerd_root = s.join("containerd/root");
    let containerd_state = s.join("containerd/state");
    let sockets = s.join("sock");
    let cni_conf = s.join("cni/net.d");
    let volume_plugins = s.join("volume-plugins");
    let pod_logs = plan.run_dir.join("pods");
    mkdirs(&[
        &plugins_registry,
        &plugins,
        &cdi,
        &containerd_root,
        &containerd_state,
        &sockets,
        &cni_conf,
        &volume_plugins,
        &pod_logs,
    ])?;
    cgroups::create_everywhere(&plan.cgroup_root)?;

    let snapshotter = pick_snapshotter(s);
    let socket = sockets.join("containerd.sock");
    let config = containerd_config(&ContainerdPaths {
        root: &containerd_root,
        state: &containerd_state,
        socket: &socket,
        sockets: &sockets,
        cdi: &cdi,
        cni_conf: &cni_conf,
        cni_bin: &binaries.cni_bin_dir,
        runc: &binaries.runc,
        runc_root: &s.join("runc"),
        opt: &s.join("containerd/opt"),
        snapshotter: &snapshotter,
    });
    let config_path = plan.run_dir.join("containerd.toml");
    fs::write(&config_path, config).map_err(io("writing", &config_path))?;
    let pod_network = PodNetwork::for_kubelet_port(plan.kubelet_port);
    pod_network.write(&cni_conf, &s.join("cni/ipam"), &binaries.cni_bin_dir)?;

    let path_env = format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        binaries.containerd_bin_dir.display()
    );
    let mut containerd_cmd = Command::new(&binaries.containerd);
    containerd_cmd
        .arg("--config")
        .arg(&config_path)
        .env("PATH", &path_env);
    let containerd = ManagedProcess::spawn(
        "containerd",
        containerd_cmd,
        &plan.run_dir.join("containerd.log"),
    )?;
    let runtime_cgroup = format!("{}-runtime", plan.cgroup_root.trim_end_matches('/'));
    cgroups::track(&runtime_cgroup, containerd.pid())?;
    let mut procs = NodeProcesses {
        containerd,
        kubelet: None,
        runtime_cgroup,
        pod_network,
    };

    let ctr = |args: &[&str]| -> Command {
        let mut c = Command::new(&binaries.ctr);
        c.arg("--address").arg(&socket).args(args);
        c
    };
    let started = Instant::now();
    loop {
        procs.containerd.check_running()?;
        if socket.exists() && run_checked(&mut ctr(&["version"])).is_ok() {
            break;
        }
        if started.elapsed() > timeout {
            return Err(Error::Timeout {
                what: format!("containerd of node {}", plan.spec.name),
                after: timeout,
                logs: plan.run_dir.clone(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for archive in [&binaries.pause_image, &binaries.probe_image] {
        let archive = archive.to_string_lossy().into_owned();
        run_checked(&mut ctr(&[
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            &snapshotter,
            &archive,
        ]))?;
    }
    let listed = run_checked(&mut ctr(&["--namespace", "k8s.io", "images", "list", "-q"]))?;
    for image in [PAUSE_IMAGE, PROBE_IMAGE] {
        if !listed.lines().any(|l| l.trim() == image) {
            return Err(Error::Host(format!(
                "image {image} not in containerd of node {} after import; it has:\n{listed}",
                plan.spec.name
            )));
        }
    }

    let kubelet_config = plan.run_dir.join("kubelet.config.json");
    let mut configuration = kubelet_configuration(plan, &socket, &pod_logs, &volume_plugins);
    if let Some(every) = plan.sync_frequency {
        configuration["syncFrequency"] = json!(format!("{}ms", every.as_millis()));
    }
    binaries
        .kubernetes_version
        .release()?
        .apply_to_kubelet_config(&mut configuration)?;
    write_json(&kubelet_config, &configuration)?;
    let mut kubelet_cmd = Command::new(&binaries.kubelet);
    kubelet_cmd
        .arg(format!("--config={}", kubelet_config.display()))
        .arg(format!("--kubeconfig={}", plan.kubeconfig.display()))
        .arg(format!("--root-dir={}", kubelet_root.display()))
        // The default (/var/lib/kubelet/pki) ignores --root-dir and would be shared.
        .arg(format!("--cert-dir={}", s.join("kubelet-pki").display()))
        .arg(format!("--hostname-override={}", plan.spec.name))
        .arg(format!("--node-ip={NODE_IP}"))
        .arg("--v=2")
        // Each DRA call's start and answer, with kubelet's time stamps and
        // claim UIDs (two lines per call): what the burst benchmark times
        // calls with, and what a reader of a failed scenario wants to see.
        .arg("--vmodule=dra_plugin=4")
        .env("PATH", &path_env);
    if !plan.spec.labels.is_empty() {
        let labels: Vec<String> = plan
            .spec
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        kubelet_cmd.arg(format!("--node-labels={}", labels.join(",")));
    }
    // One kubelet at a time from start to its device-plugin socket bound:
    // that path is the host's, whatever --root-dir says (kubelet_socket).
    let kubelet = kubelet_socket::spawn_kubelet(
        kubelet_cmd,
        &plan.run_dir.join("kubelet.log"),
        &plan.cgroup_root,
    )
    .await?;
    procs.kubelet = Some(kubelet);

    let local = LocalNode {
        name: plan.spec.name.clone(),
        kubelet_root_dir: kubelet_root,
        plugins_registry_dir: plugins_registry,
        plugins_dir: plugins,
        cdi_dir: cdi,
        kubeconfig: plan.kubeconfig.clone(),
        containerd_socket: socket,
        snapshotter,
        pod_logs_dir: pod_logs,
        run_dir: plan.run_dir.clone(),
        cgroup_root: plan.cgroup_root.clone(),
        kubelet_port: plan.kubelet_port,
    };
    Ok((local, procs))
}

fn kubelet_configuration(
    plan: &NodePlan,
    socket: &Path,
    pod_logs: &Path,
    volume_plugins: &Path,
) -> serde_json::Value {
    let endpoint = format!("unix://{}", socket.display());
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP.to_string(),
        "port": plan.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": plan.healthz_port,
        "tlsCertFile": plan.serving.cert_file,
        "tlsPrivateKeyFile": plan.serving.key_file,
        "rotateCertificates": false,
        "serverTLSBootstrap": false,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": plan.client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{}", plan.cgroup_root),
        "cgroupsPerQOS": true,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": false,
        "podLogsDir": pod_logs,
        "volumePluginDir": volume_plugins,
        // A small shared VM disk must not evict test pods or GC imported images.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "shutdownGracePeriod": "0s",
        "registerNode": true,
        "maxPods": 110,
    })
}

struct ContainerdPaths<'a> {
    root: &'a Path,
    state: &'a Path,
    socket: &'a Path,
    sockets: &'a Path,
    cdi: &'a Path,
    cni_conf: &'a Path,
    cni_bin: &'a Path,
    runc: &'a Path,
    runc_root: &'a Path,
    opt: &'a Path,
    snapshotter: &'a str,
}

/// containerd 2.x config (version 3) for one node: own root, state and
/// sockets, NRI off (its socket path is global), CDI on with only this
/// node's spec dir, our pause image as the sandbox image.
fn containerd_config(p: &ContainerdPaths<'_>) -> String {
    let q = |path: &Path| format!("'{}'", path.display());
    format!(
        r#"version = 3
root = {root}
state = {state}

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[debug]
  address = {debug}
  level = 'info'

[metrics]
  address = ''

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.internal.v1.opt']
  path = {opt}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = '{snapshotter}'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{pause}'

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [{cdi}]
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  # Without CAP_SYS_RESOURCE (this VM's root lacks it) runc cannot lower
  # oom_score_adj (the sandbox gets -998): clamp to containerd's own value.
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = {runc}
  Root = {runc_root}
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{cni_bin}]
  conf_dir = {cni_conf}
"#,
        root = q(p.root),
        state = q(p.state),
        socket = q(p.socket),
        ttrpc = q(&p.sockets.join("containerd.sock.ttrpc")),
        debug = q(&p.sockets.join("debug.sock")),
        opt = q(p.opt),
        snapshotter = p.snapshotter,
        pause = PAUSE_IMAGE,
        cdi = q(p.cdi),
        runc = q(p.runc),
        runc_root = q(p.runc_root),
        cni_bin = q(p.cni_bin),
        cni_conf = q(p.cni_conf),
    )
}

/// `overlayfs` when an overlay mount works under `state_dir`, else `native`
/// (plain copies; works on any filesystem, fine for our tiny images).
fn pick_snapshotter(state_dir: &Path) -> String {
    let probe = state_dir.join("overlay-probe");
    let dirs = ["lower", "upper", "work", "merged"].map(|d| probe.join(d));
    if dirs.iter().any(|d| fs::create_dir_all(d).is_err()) {
        return "native".into();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        dirs[0].display(),
        dirs[1].display(),
        dirs[2].display()
    );
    let mounted = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&dirs[3])
        .output()
        .is_ok_and(|o| o.status.success());
    if mounted {
        let _ = Command::new("umount").arg(&dirs[3]).status();
    }
    let _ = fs::remove_dir_all(&probe);
    if mounted { "overlayfs" } else { "native" }.into()
}

/// Adds `ip/32` to `lo` unless some interface has it already.
pub(crate) fn ensure_node_ip(ip: Ipv4Addr) -> Result<()> {
    let shown = run_checked(Command::new("ip").args(["-4", "-o", "addr", "show"]))?;
    if shown.contains(&format!(" {ip}/")) {
        return Ok(());
    }
    match run_checked(Command::new("ip").args(["addr", "add", &format!("{ip}/32"), "dev", "lo"])) {
        Ok(_) => Ok(()),
        // Another cluster starting at the same moment (CI's e2e legs run
        // side by side) may have added it between the check and the add.
        Err(e) => {
            let shown = run_checked(Command::new("ip").args(["-4", "-o", "addr", "show"]))?;
            if shown.contains(&format!(" {ip}/")) {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// Lazily unmounts everything mounted at or below `dir` (pod volumes,
/// overlay rootfs), deepest first; returns what is still mounted.
pub(crate) fn unmount_below(dir: &Path) -> Vec<PathBuf> {
    let find = || -> Vec<PathBuf> {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return Vec::new();
        };
        let mut found: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .map(|m| PathBuf::from(unescape_mount_path(m)))
            .filter(|m| m.starts_with(dir))
            .collect();
        found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        found.dedup();
        found
    };
    for mount in find() {
        let _ = Command::new("umount").arg("-l").arg(&mount).output();
    }
    find()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mount_path(r"/run/a\040b"), "/run/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path(r"/x\134y"), r"/x\y");
    }

    #[test]
    fn containerd_config_separates_the_node() {
        let p = |s: &str| PathBuf::from(s);
        let text = containerd_config(&ContainerdPaths {
            root: &p("/s/p5/root"),
            state: &p("/s/p5/state"),
            socket: &p("/s/p5/sock/containerd.sock"),
            sockets: &p("/s/p5/sock"),
            cdi: &p("/s/p5/cdi"),
            cni_conf: &p("/s/p5/cni"),
            cni_bin: &p("/usr/lib/cni"),
            runc: &p("/usr/sbin/runc"),
            runc_root: &p("/s/p5/runc"),
            opt: &p("/s/p5/opt"),
            snapshotter: "native",
        });
        for needle in [
            "root = '/s/p5/root'",
            "address = '/s/p5/sock/containerd.sock'",
            "cdi_spec_dirs = ['/s/p5/cdi']",
            "enable_cdi = true",
            "snapshotter = 'native'",
            "sandbox = 'localhost/aws-dra-e2e/pause:v1'",
            "SystemdCgroup = false",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
