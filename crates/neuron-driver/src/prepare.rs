//! The `dra-core` [`Driver`]: allocated chips → container edits.
//!
//! Each allocated chip gets its device node `/dev/neuronN`. The Neuron
//! runtime settings are claim-wide (one runtime per container sees all the
//! claim's chips), but CDI edits are per device, so the same two variables
//! are put on every device of the claim:
//! - `NEURON_RT_VISIBLE_CORES`: the logical cores of all allocated chips for
//!   the effective LNC, as a range list (see [`crate::lnc`]);
//! - `NEURON_LOGICAL_NC_CONFIG`: the effective LNC.
//!
//! A claim whose chips would need different LNCs (different requests with
//! different configs) fails: one container cannot run two LNCs. Nothing is
//! created on the host, so unprepare has nothing to undo (the CDI spec is
//! `dra-core`'s).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverError,
};

use crate::config::NeuronConfig;
use crate::discovery::{NeuronChip, NodeInventory};
use crate::lnc::{
    LncError, LogicalNeuronCore, effective_core_lnc, effective_lnc, logical_cores, range_list,
};
use crate::partitions::{DeviceRef, parse_device_ref};

/// Env var with the visible logical cores.
pub const ENV_VISIBLE_CORES: &str = "NEURON_RT_VISIBLE_CORES";
/// Env var with the LNC.
pub const ENV_LNC: &str = "NEURON_LOGICAL_NC_CONFIG";

/// The latest inventory, shared between the rescan loop and prepare.
pub type SharedInventory = Arc<RwLock<NodeInventory>>;

/// Why a claim cannot be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    #[error(
        "device {0:?} is not a Neuron chip or core of this driver (expected neuron-device-<index> or neuron-device-<index>-core-<core>)"
    )]
    UnknownDevice(String),
    #[error("chip {index} ({device}) is not present on this node any more")]
    ChipGone { index: u32, device: String },
    #[error("device {device}: chip {chip} has {cores} physical cores, there is no core {core}")]
    NoSuchCore {
        device: String,
        chip: u32,
        core: u32,
        cores: u32,
    },
    #[error(
        "logicalNeuronCore 2 fuses the physical cores of a chip in pairs (0+1, 2+3, ...), but the claim has core {core} of chip {chip} without core {partner}; ask for whole pairs (count 2 with matchAttribute neuron.aws.com/lnc2CoreId) or set logicalNeuronCore: 1"
    )]
    UnpairedCore { chip: u32, core: u32, partner: u32 },
    #[error(transparent)]
    Lnc(#[from] LncError),
    #[error(
        "the claim's chips resolve to different logicalNeuronCore values ({details}); one container runs one LNC: give every request of the claim the same NeuronConfig"
    )]
    MixedLnc { details: String },
    #[error("no devices allocated")]
    Empty,
}

/// One allocated device, resolved against the inventory.
struct Resolved<'a> {
    device: &'a AllocatedDevice<NeuronConfig>,
    chip: &'a NeuronChip,
    /// `None` for the whole chip.
    core: Option<u32>,
    lnc: LogicalNeuronCore,
}

fn resolve<'a>(
    inventory: &'a NodeInventory,
    d: &'a AllocatedDevice<NeuronConfig>,
) -> Result<Resolved<'a>, PrepareError> {
    let unknown = || PrepareError::UnknownDevice(d.device.clone());
    let (index, core) = match parse_device_ref(&d.device).ok_or_else(unknown)? {
        DeviceRef::Chip(index) => (index, None),
        DeviceRef::Core { chip, core } => (chip, Some(core)),
    };
    let chip = inventory
        .chip(index)
        .ok_or_else(|| PrepareError::ChipGone {
            index,
            device: d.device.clone(),
        })?;
    let lnc = match core {
        None => effective_lnc(chip, d.config.as_ref())?,
        Some(core) if core >= chip.core_count => {
            return Err(PrepareError::NoSuchCore {
                device: d.device.clone(),
                chip: index,
                core,
                cores: chip.core_count,
            });
        }
        Some(_) => effective_core_lnc(chip, d.config.as_ref())?,
    };
    Ok(Resolved {
        device: d,
        chip,
        core,
        lnc,
    })
}

/// The visible logical cores of the claim under `lnc`: whole chips' ranges,
/// and single cores (LNC=1: the core's node-wide index; LNC=2: the pair's
/// logical index, each pair complete).
fn visible_cores(devices: &[Resolved<'_>], lnc: LogicalNeuronCore) -> Result<String, PrepareError> {
    let mut indices: Vec<u32> = Vec::new();
    let cores: BTreeSet<(u32, u32)> = devices
        .iter()
        .filter_map(|r| r.core.map(|k| (r.chip.index, k)))
        .collect();
    for r in devices {
        match r.core {
            None => indices.extend(logical_cores(r.chip, lnc)),
            Some(k) => match lnc {
                LogicalNeuronCore::One => indices.push(r.chip.index * r.chip.core_count + k),
                LogicalNeuronCore::Two => {
                    let partner = k ^ 1;
                    if !cores.contains(&(r.chip.index, partner)) {
                        return Err(PrepareError::UnpairedCore {
                            chip: r.chip.index,
                            core: k,
                            partner,
                        });
                    }
                    indices.push(r.chip.index * (r.chip.core_count / 2) + k / 2);
                }
            },
        }
    }
    Ok(range_list(indices))
}

/// Container edits for the devices of one claim.
pub fn claim_edits(
    inventory: &NodeInventory,
    devices: &[AllocatedDevice<NeuronConfig>],
) -> Result<Vec<DeviceEdits>, PrepareError> {
    let resolved = devices
        .iter()
        .map(|d| resolve(inventory, d))
        .collect::<Result<Vec<_>, _>>()?;
    let lncs: BTreeSet<LogicalNeuronCore> = resolved.iter().map(|r| r.lnc).collect();
    let lnc = match lncs.len() {
        0 => return Err(PrepareError::Empty),
        1 => *lncs.iter().next().ok_or(PrepareError::Empty)?,
        _ => {
            let details = resolved
                .iter()
                .map(|r| {
                    format!(
                        "{} (request {}): {}",
                        r.device.device, r.device.request, r.lnc
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(PrepareError::MixedLnc { details });
        }
    };
    let visible = visible_cores(&resolved, lnc)?;
    let env: std::collections::BTreeMap<String, String> = [
        (ENV_VISIBLE_CORES.to_owned(), visible),
        (ENV_LNC.to_owned(), lnc.to_string()),
    ]
    .into_iter()
    .collect();
    // Cores of one chip all carry the chip's device node; the container
    // runtime merges identical device nodes of a container into one.
    Ok(resolved
        .iter()
        .map(|r| DeviceEdits {
            device: r.device.device.clone(),
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode::mapped(
                    format!("/dev/neuron{}", r.chip.index),
                    &r.chip.device_node,
                )],
                env: env.clone(),
            },
        })
        .collect())
}

/// The Neuron driver as `dra-core` drives it.
#[derive(Debug, Clone)]
pub struct NeuronDriver {
    inventory: SharedInventory,
}

impl NeuronDriver {
    /// `inventory` is kept current by the scans
    /// ([`crate::inventory::NeuronInventory`]).
    /// Device nodes are taken from the inventory (`<dev-root>/neuronN`).
    pub fn new(inventory: SharedInventory) -> Self {
        NeuronDriver { inventory }
    }
}

impl Driver for NeuronDriver {
    type Config = NeuronConfig;

    async fn prepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<NeuronConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        // A poisoned lock only means a rescan panicked mid-update; the last
        // inventory written is still a whole one.
        let inventory = self.inventory.read().unwrap_or_else(|e| e.into_inner());
        let result = claim_edits(&inventory, devices);
        match &result {
            Ok(edits) => {
                tracing::info!(claim = %claim, devices = edits.len(), "prepared Neuron devices")
            }
            Err(error) => tracing::warn!(claim = %claim, %error, "cannot prepare Neuron devices"),
        }
        result.map_err(DriverError::new)
    }
}
