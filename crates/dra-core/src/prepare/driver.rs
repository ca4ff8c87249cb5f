//! The one interface between `dra-core` and a device driver.
//!
//! A driver turns allocated devices (each with its resolved opaque config)
//! into container edits, and undoes that. Everything else (claim lookup,
//! config decoding, CDI files, checkpoint, locking, gRPC) is `dra-core`'s job,
//! so a driver stays a thin, device-specific adapter. Device inventory is not
//! part of this trait: the slice publisher consumes it from a watch channel.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::Path;

use crate::prepare::config::DriverConfig;

/// A claim as kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// One device the scheduler allocated to a claim for this driver.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatedDevice<C> {
    /// Base request name (`a` for a result of subrequest `a/b`).
    pub request: String,
    pub pool: String,
    /// Device name as published in the ResourceSlice.
    pub device: String,
    pub admin_access: bool,
    /// The opaque config that applies to this device (class configs first,
    /// then claim configs, the last matching entry wins); `None` when no
    /// entry for this driver applies.
    pub config: Option<C>,
}

/// A device node to create in the container.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/neuron0`.
    pub path: String,
    /// Path on the host when it differs from `path` (fixtures, dev roots).
    pub host_path: Option<String>,
}

impl DeviceNode {
    /// The node at `path` in the container, taken from `host` on the host;
    /// `host_path` is set only when the two differ (fixtures, a `--dev-root`).
    pub fn mapped(path: impl Into<String>, host: &Path) -> Self {
        let path = path.into();
        let host = host.display().to_string();
        DeviceNode {
            host_path: (host != path).then_some(host),
            path,
        }
    }

    /// The node `rel` below `/dev` in the container and below `dev_root`
    /// (`--dev-root`) on the host, e.g. `infiniband/uverbs3`.
    pub fn under_dev_root(dev_root: &Path, rel: impl AsRef<Path>) -> Self {
        let rel = rel.as_ref();
        let path = Path::new("/dev").join(rel);
        Self::mapped(path.display().to_string(), &dev_root.join(rel))
    }
}

/// What the container runtime must do to the container for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    pub device_nodes: Vec<DeviceNode>,
    pub env: BTreeMap<String, String>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.device_nodes.is_empty() && self.env.is_empty()
    }
}

/// The driver's answer for one allocated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceEdits {
    /// Must name one of the allocated devices.
    pub device: String,
    pub edits: ContainerEdits,
}

/// A device as recorded at prepare time; what unprepare gets back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    #[serde(default)]
    pub admin_access: bool,
    pub cdi_device_ids: Vec<String>,
    /// The shares of the device the claim got (the allocation's `shareID`s,
    /// sorted) when the device was published with `allowMultipleAllocations`;
    /// empty when the claim holds it exclusively. Several claims may hold
    /// shares of one device at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub share_ids: Vec<String>,
}

/// A driver failure, reported to the user as the claim's prepare error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DriverError {
    pub message: String,
}

impl DriverError {
    pub fn new(message: impl fmt::Display) -> Self {
        Self {
            message: message.to_string(),
        }
    }
}

/// A DRA node driver. Calls for one node are serialized by `dra-core` (also
/// across processes), so implementations need no locking of their own.
pub trait Driver: Send + Sync + 'static {
    /// The driver's opaque configuration type, decoded strictly by `dra-core`.
    type Config: DriverConfig;

    /// Produce the container edits for every device allocated to `claim`.
    /// Must return one entry per allocated device; each must have at least
    /// one edit (CDI rejects devices without edits).
    fn prepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<Self::Config>],
    ) -> impl Future<Output = Result<Vec<DeviceEdits>, DriverError>> + Send;

    /// The pieces of hardware `device` occupies, for the guard that keeps
    /// one piece from being prepared for two claims at once: two devices
    /// conflict when their lists share an entry. `device` is a name from a
    /// claim's allocation, which may be one this driver published before an
    /// upgrade renamed it, or a partition of another device. Default: the
    /// name itself (every device its own piece).
    fn occupies(&self, device: &str) -> Vec<String> {
        vec![device.to_owned()]
    }

    /// What each prepared device's entry in the claim's `status.devices`
    /// carries besides its `Ready` condition (`data`, `networkData`).
    /// Called after `prepare` succeeded, off kubelet's call, with the same
    /// devices; a device left out gets the condition only. Default: none.
    fn device_status(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<Self::Config>],
    ) -> Vec<DeviceStatus> {
        let _ = (claim, devices);
        Vec::new()
    }

    /// Undo `prepare` for a claim, working only from what was recorded then
    /// (the claim may be gone from the API server). `dra-core` removes the
    /// CDI spec itself; the default has nothing else to undo, which is right
    /// for a driver that changes no host state at prepare time.
    fn unprepare(
        &self,
        claim: &ClaimRef,
        devices: &[PreparedDevice],
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        tracing::debug!(claim = %claim, devices = devices.len(), "unprepare: nothing to undo on the host");
        std::future::ready(Ok(()))
    }
}

/// What a prepared device's entry in the claim's `status.devices` carries
/// besides its `Ready` condition; a driver gives one per device it knows
/// more about ([`Driver::device_status`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceStatus {
    /// The device's name, as allocated.
    pub device: String,
    /// The entry's `data`: what a workload or an operator wants to know
    /// about the device. At most 10 KiB as JSON (the API's limit); a larger
    /// object is left out and logged.
    pub data: serde_json::Map<String, serde_json::Value>,
    /// The entry's `networkData`, for a device with a network interface.
    pub network: Option<NetworkData>,
}

/// A network device's `networkData`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkData {
    /// e.g. `eth1`; at most 256 characters.
    pub interface_name: String,
    /// The MAC address, e.g. `0a:1b:2c:3d:4e:5f`; at most 128 characters.
    pub hardware_address: String,
    /// Addresses in CIDR notation (`192.0.2.5/24`).
    pub ips: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_path_only_when_it_differs() {
        let cases = [
            ("/dev", None),
            ("/dev/", None),
            ("/host/dev", Some("/host/dev/infiniband/uverbs3")),
        ];
        for (dev_root, want) in cases {
            let node = DeviceNode::under_dev_root(Path::new(dev_root), "infiniband/uverbs3");
            assert_eq!(node.path, "/dev/infiniband/uverbs3", "{dev_root}");
            assert_eq!(node.host_path.as_deref(), want, "{dev_root}");
        }
        let node = DeviceNode::mapped("/dev/neuron0", Path::new("/dev/neuron0"));
        assert_eq!(node.host_path, None);
        let node = DeviceNode::mapped("/dev/neuron0", Path::new("/f/dev/neuron0"));
        assert_eq!(node.host_path.as_deref(), Some("/f/dev/neuron0"));
    }
}
