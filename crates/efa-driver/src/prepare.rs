//! The `dra-core` [`Driver`] implementation: allocated EFAs → container edits.
//!
//! For each allocated EFA the container gets its `/dev/infiniband/uverbsN`
//! and, when the host has it, the shared `/dev/infiniband/rdma_cm`; every
//! device of a claim carries the same `EFA_RDMA_DEVICES` (the claim's RDMA
//! device names, sorted, comma-separated), because CDI edits are per device
//! and the runtime merges them. Host paths are under `--dev-root`, container
//! paths are the standard ones.
//!
//! Each device is re-read from sysfs at prepare time (one PCI function, not a
//! full scan): the uverbs number is assigned by the kernel at bind time and
//! can change after a driver reload, so the published inventory is not
//! trusted for it. The answer is a pure function of the allocation and the
//! host state, so a claim shared by several pods gets identical edits;
//! `dra-core` prepares it once and replays the checkpoint for later pods.
//! Unprepare has nothing to undo (no host state is changed here; `dra-core`
//! removes the CDI spec).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, DeviceStatus, Driver,
    DriverError,
};
use topology::SysfsRoot;

use crate::attributes::parse_device_name;
use crate::config::EfaConfig;
use crate::discovery::{self, INFINIBAND_DEV_DIR, UnusableReason};

mod status;

/// Env var listing the claim's RDMA device names, e.g. `rdmap79s0,rdmap80s0`.
pub const ENV_RDMA_DEVICES: &str = "EFA_RDMA_DEVICES";
/// Container-side directory of the verbs device nodes.
pub const CONTAINER_INFINIBAND_DIR: &str = "/dev/infiniband";
/// The RDMA connection manager node, shared by all devices.
pub const RDMA_CM: &str = "rdma_cm";

/// Why one allocated device cannot be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    #[error(
        "device {device:?} is not an EFA device name of this driver (expected efa-DDDD-BB-DD-F)"
    )]
    BadDeviceName { device: String },
    #[error(
        "EFA {device} is not on this node: no PCI function {address} in sysfs (it was removed \
         after the claim was allocated, or the claim names a device this node never published)"
    )]
    NotPresent { device: String, address: String },
    #[error("EFA {device} ({address}) cannot be used now: {reason}")]
    Unusable {
        device: String,
        address: String,
        reason: UnusableReason,
    },
    #[error("EFA {device}: host device node {path} does not exist (check --dev-root)")]
    NoHostNode { device: String, path: PathBuf },
}

/// The EFA driver: where to read sysfs and where the host's `/dev` is.
#[derive(Debug, Clone)]
pub struct EfaDriver {
    sysfs: SysfsRoot,
    dev_root: PathBuf,
}

impl EfaDriver {
    pub fn new(sysfs: SysfsRoot, dev_root: impl Into<PathBuf>) -> Self {
        EfaDriver {
            sysfs,
            dev_root: dev_root.into(),
        }
    }

    /// The edits for every allocated device, in the order given.
    fn container_edits(
        &self,
        devices: &[AllocatedDevice<EfaConfig>],
    ) -> Result<Vec<DeviceEdits>, PrepareError> {
        let mut resolved = Vec::with_capacity(devices.len());
        for d in devices {
            let address =
                parse_device_name(&d.device).ok_or_else(|| PrepareError::BadDeviceName {
                    device: d.device.clone(),
                })?;
            if !self
                .sysfs
                .pci_devices_dir()
                .join(address.to_string())
                .exists()
            {
                return Err(PrepareError::NotPresent {
                    device: d.device.clone(),
                    address: address.to_string(),
                });
            }
            let efa = discovery::read_one(&self.sysfs, address).map_err(|reason| {
                PrepareError::Unusable {
                    device: d.device.clone(),
                    address: address.to_string(),
                    reason,
                }
            })?;
            let rel = Path::new(INFINIBAND_DEV_DIR).join(efa.uverbs_name());
            let host = self.dev_root.join(&rel);
            if host.symlink_metadata().is_err() {
                return Err(PrepareError::NoHostNode {
                    device: d.device.clone(),
                    path: host,
                });
            }
            resolved.push((d.device.clone(), efa.rdma_device, rel));
        }
        let rdma_cm_rel = Path::new(INFINIBAND_DEV_DIR).join(RDMA_CM);
        let rdma_cm = self
            .dev_root
            .join(&rdma_cm_rel)
            .symlink_metadata()
            .is_ok()
            .then(|| DeviceNode::under_dev_root(&self.dev_root, &rdma_cm_rel));
        // Sorted and deduplicated, so the value does not depend on the order
        // kubelet lists the results in.
        let names: BTreeSet<&str> = resolved.iter().map(|(_, r, _)| r.as_str()).collect();
        let list = names.into_iter().collect::<Vec<_>>().join(",");
        Ok(resolved
            .iter()
            .map(|(device, _, rel)| {
                let mut edits = ContainerEdits::default();
                edits
                    .device_nodes
                    .push(DeviceNode::under_dev_root(&self.dev_root, rel));
                edits.device_nodes.extend(rdma_cm.clone());
                edits.env.insert(ENV_RDMA_DEVICES.to_owned(), list.clone());
                DeviceEdits {
                    device: device.clone(),
                    edits,
                }
            })
            .collect())
    }
}

impl Driver for EfaDriver {
    type Config = EfaConfig;

    async fn prepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<EfaConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        let edits = self.container_edits(devices).map_err(|e| {
            tracing::warn!(claim = %claim, error = %e, "prepare failed");
            DriverError::new(e)
        })?;
        tracing::info!(claim = %claim, devices = edits.len(), "prepared EFAs");
        Ok(edits)
    }

    /// RDMA device, verbs node, placement, port state; the interface when
    /// there is one (see the `status` module).
    fn device_status(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice<EfaConfig>],
    ) -> Vec<DeviceStatus> {
        status::device_status(&self.sysfs, devices)
    }
}
