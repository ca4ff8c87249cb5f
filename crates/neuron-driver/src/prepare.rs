//! The `dra-core` [`Driver`]: allocated chips → container edits.
//!
//! Each allocated chip gets its device node `/dev/neuronN`. The Neuron
//! runtime settings are claim-wide (one runtime per container sees all the
//! claim's chips), but CDI edits are per device, so the same two variables
//! are put on every device of the claim:
//! - `NEURON_RT_VISIBLE_CORES`: the logical cores of all allocated chips for
//!   the effective LNC, as a range list (see [`crate::lnc`]);
//! - `NEURON_LOGICAL_NC_CONFIG`: the effective LNC;
//! - with an `UltraServerConfig`, the runtime's UltraServer variables
//!   (`NEURON_RT_ULTRASERVER_MODE`, `_SERVER_ID`, `_NODE_ID`,
//!   `NEURON_GLOBAL_TOPOID`; see [`crate::ultraserver`]).
//!
//! The whole-node device of an UltraServer node (`neuronnode`) is every chip
//! of the node: all `/dev/neuronN` and all their cores.
//!
//! A claim whose chips would need different LNCs (different requests with
//! different configs) fails: one container cannot run two LNCs. Nothing is
//! created on the host, so unprepare has nothing to undo (the CDI spec is
//! `dra-core`'s).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, DeviceStatus, Driver,
    DriverError,
};

use crate::config::NeuronConfig;
use crate::discovery::{NeuronChip, NodeInventory};
use crate::lnc::{
    LncError, LogicalNeuronCore, effective_core_lnc, effective_lnc, logical_cores, range_list,
};
use crate::partitions::{DeviceRef, parse_device_ref};
use crate::ultraserver::{ModeError, UltraServer};

mod status;

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
        "device {0:?} is not a Neuron chip or core of this driver (expected neurondevice<index>, neurondevice<index>-core-<core> or neuronnode)"
    )]
    UnknownDevice(String),
    #[error(
        "chip {index} ({device}) is not on this node: no such chip in the current inventory (it \
         was removed after the claim was allocated, or the claim names a chip this node never \
         published)"
    )]
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
    #[error(
        "{device} needs a Trn2 UltraServer node with known ids, but {state}; the whole-node device \
         neuronnode and UltraServerConfig only work on trn2u nodes"
    )]
    NotUltraServer { device: String, state: String },
    #[error(transparent)]
    UltraServerMode(#[from] ModeError),
    #[error(
        "the claim's requests ask for different UltraServer sizes (ultraserverMode {modes}); one \
         container runs in one UltraServer set: give every request the same UltraServerConfig"
    )]
    MixedUltraServerModes { modes: String },
}

/// One allocated chip (or core), resolved against the inventory; the
/// whole-node device resolves to one of these per chip.
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
) -> Result<Vec<Resolved<'a>>, PrepareError> {
    let unknown = || PrepareError::UnknownDevice(d.device.clone());
    let (index, core) = match parse_device_ref(&d.device).ok_or_else(unknown)? {
        DeviceRef::Chip(index) => (index, None),
        DeviceRef::Core { chip, core } => (chip, Some(core)),
        DeviceRef::Node => {
            if inventory.ultraserver.membership().is_none() || inventory.chips.is_empty() {
                return Err(PrepareError::NotUltraServer {
                    device: d.device.clone(),
                    state: format!("{:?}", inventory.ultraserver),
                });
            }
            return inventory
                .chips
                .iter()
                .map(|chip| {
                    Ok(Resolved {
                        device: d,
                        chip,
                        core: None,
                        lnc: effective_lnc(chip, d.config.as_ref())?,
                    })
                })
                .collect();
        }
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
    Ok(vec![Resolved {
        device: d,
        chip,
        core,
        lnc,
    }])
}

/// The UltraServer variables of the claim: none unless a device's config
/// has an `UltraServerConfig`; every such config must ask for the same
/// number of nodes, and the node must support it.
fn ultraserver_env(
    inventory: &NodeInventory,
    devices: &[AllocatedDevice<NeuronConfig>],
) -> Result<BTreeMap<String, String>, PrepareError> {
    let modes: BTreeSet<u32> = devices
        .iter()
        .filter_map(|d| d.config.as_ref()?.ultraserver_mode)
        .collect();
    let Some(&nodes) = modes.iter().next() else {
        return Ok(BTreeMap::new());
    };
    if modes.len() > 1 {
        return Err(PrepareError::MixedUltraServerModes {
            modes: modes
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    match &inventory.ultraserver {
        UltraServer::Member(m) => Ok(m.runtime_env(nodes)?),
        UltraServer::None => Err(PrepareError::NotUltraServer {
            device: format!("UltraServerConfig ultraserverMode {nodes}"),
            state: "this node is not part of a Trn2 UltraServer".into(),
        }),
        UltraServer::Electing { reason } => Err(PrepareError::NotUltraServer {
            device: format!("UltraServerConfig ultraserverMode {nodes}"),
            state: format!(
                "the node's UltraServer ids are not known yet: {reason}; retried by kubelet"
            ),
        }),
    }
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
    let resolved: Vec<Resolved<'_>> = devices
        .iter()
        .map(|d| resolve(inventory, d))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let ultraserver = ultraserver_env(inventory, devices)?;
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
    let mut env: BTreeMap<String, String> = [
        (ENV_VISIBLE_CORES.to_owned(), visible),
        (ENV_LNC.to_owned(), lnc.to_string()),
    ]
    .into_iter()
    .collect();
    env.extend(ultraserver);
    // Cores of one chip all carry the chip's device node; the container
    // runtime merges identical device nodes of a container into one. The
    // whole-node device carries every chip's.
    let mut edits: Vec<DeviceEdits> = Vec::new();
    for r in &resolved {
        let node = DeviceNode::mapped(format!("/dev/neuron{}", r.chip.index), &r.chip.device_node);
        match edits.last_mut() {
            Some(last) if last.device == r.device.device => last.edits.device_nodes.push(node),
            _ => edits.push(DeviceEdits {
                device: r.device.device.clone(),
                edits: ContainerEdits {
                    device_nodes: vec![node],
                    env: env.clone(),
                },
            }),
        }
    }
    Ok(edits)
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

    /// Chip, cores, LNC and visible cores of each device (see the `status` module).
    fn device_status(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice<NeuronConfig>],
    ) -> Vec<DeviceStatus> {
        let inventory = self.inventory.read().unwrap_or_else(|e| e.into_inner());
        status::device_status(&inventory, devices)
    }

    /// A chip is its own piece and each of its cores; a core is that core;
    /// the whole-node device is every chip. Names of before the rename
    /// (`neuron-device-N`) map to the same pieces, so a claim prepared
    /// before an upgrade still keeps its chip from the next claim.
    fn occupies(&self, device: &str) -> Vec<String> {
        let inventory = self.inventory.read().unwrap_or_else(|e| e.into_inner());
        let chip_pieces = |chip: &NeuronChip| -> Vec<String> {
            let index = chip.index;
            std::iter::once(format!("neuron{index}"))
                .chain((0..chip.core_count).map(|k| format!("neuron{index}-core-{k}")))
                .collect()
        };
        match parse_device_ref(device) {
            Some(DeviceRef::Chip(index)) => match inventory.chip(index) {
                Some(chip) => chip_pieces(chip),
                None => vec![format!("neuron{index}")],
            },
            Some(DeviceRef::Core { chip, core }) => vec![format!("neuron{chip}-core-{core}")],
            Some(DeviceRef::Node) => inventory.chips.iter().flat_map(chip_pieces).collect(),
            None => vec![device.to_owned()],
        }
    }
}
