//! What a local cluster is made of, before anything starts: the node specs,
//! the cluster configuration, the addresses and ports it uses, and the
//! checks on names that end up in paths. Both [`crate::cluster`] and
//! `node.rs` build on it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result, io};
use crate::toolchain::default_kubernetes_version;
use crate::versions::KubernetesVersion;
use crate::versions::opt_in::Enablement;

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

    /// A node for the fixture `fixture` (an instance type, or a variant
    /// such as `trn2u.48xlarge@node1`), labelled with its instance type.
    pub fn for_fixture(name: &str, fixture: &str) -> Self {
        Self::new(name).label(
            "node.kubernetes.io/instance-type",
            sysfs_fixtures::instance_type_of(fixture),
        )
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
    /// Write the API server's audit log (`<run_dir>/audit.log`, metadata of
    /// every request not made by the control plane or a kubelet): what
    /// `cargo xtask bench` counts requests per client from.
    pub audit_log: bool,
    /// The kubelets' `syncFrequency` (`None`: the kubelet's default, 1 min).
    /// The kubelet retries a prepare that failed (a driver that was down)
    /// only at its next periodic sync of the pod (kubernetes#139836), so this
    /// is how long such a pod waits: `cargo xtask chaos
    /// --kubelet-sync-frequency` shortens it to fit its cycles into a run.
    pub kubelet_sync_frequency: Option<Duration>,
    /// Feature gates and API versions turned on beyond the release's
    /// defaults, for the control plane ([`crate::versions::opt_in`]): empty
    /// but where a scenario that needs them runs.
    pub enable: Enablement,
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
            audit_log: false,
            kubelet_sync_frequency: None,
            enable: Enablement::default(),
        }
    }
}

/// `AWS_DRA_K8S_VERSION` when set (a minor such as `1.34` or an exact
/// version of a release we have), else the main release's pinned patch.
pub fn try_selected_kubernetes_version() -> Result<KubernetesVersion> {
    match std::env::var("AWS_DRA_K8S_VERSION") {
        Ok(v) if !v.trim().is_empty() => KubernetesVersion::resolve(&v),
        _ => Ok(default_kubernetes_version()),
    }
}

/// [`try_selected_kubernetes_version`] for the test harnesses, which have
/// no way to go on without a version: a value we cannot run stops them with
/// the error (naming the releases we have), never a quiet run of another
/// release than the one asked for.
pub fn selected_kubernetes_version() -> KubernetesVersion {
    try_selected_kubernetes_version().unwrap_or_else(|e| panic!("AWS_DRA_K8S_VERSION: {e}"))
}

#[derive(Default)]
pub struct PortAllocator {
    used: BTreeSet<(IpAddr, u16)>,
}

impl PortAllocator {
    /// A port that is free on `ip` now, outside the ephemeral range and
    /// reserved against other test processes (see [`crate::ports`]); never the
    /// same one twice.
    pub fn pick(&mut self, ip: IpAddr) -> Result<u16> {
        let port = crate::ports::reserve(ip, &|p| self.used.contains(&(ip, p)))?;
        self.used.insert((ip, port));
        Ok(port)
    }
}

/// Whether `name` can name a node: a DNS label of at most 20 characters (it ends up in paths).
pub fn is_short_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| Error::Json {
        what: path.display().to_string(),
        source,
    })?;
    fs::write(path, text).map_err(io("writing", path))
}

/// Root of the state dirs (`/run/ad/<pid>`, short for unix socket paths).
pub const STATE_ROOT: &str = "/run/ad";

/// A new, empty `/run/ad/<pid in hex>[suffix]`. As short as it is because
/// unix socket paths (≤ 107 bytes) are built under it: with a pod's UID in
/// its name (the DaemonSet's seamless-upgrade naming), an EFA registration
/// socket takes 86 bytes after the kubelet root dir, so the root may be 21
/// bytes at most: `/run/ad/<pid>/<n>/k` is.
pub fn new_state_dir() -> Result<PathBuf> {
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

pub fn run_id() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{secs}-{}", std::process::id())
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
