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

use crate::attributes::parse_device_name;
use crate::config::NeuronConfig;
use crate::discovery::NodeInventory;
use crate::lnc::{LncError, LogicalNeuronCore, effective_lnc, logical_cores, range_list};

/// Env var with the visible logical cores.
pub const ENV_VISIBLE_CORES: &str = "NEURON_RT_VISIBLE_CORES";
/// Env var with the LNC.
pub const ENV_LNC: &str = "NEURON_LOGICAL_NC_CONFIG";

/// The latest inventory, shared between the rescan loop and prepare.
pub type SharedInventory = Arc<RwLock<NodeInventory>>;

/// Why a claim cannot be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    #[error("device {0:?} is not a Neuron chip of this driver (expected neuron-device-<index>)")]
    UnknownDevice(String),
    #[error(
        "chip {index} ({device}) is not on this node: no such chip in the current inventory (it \
         was removed after the claim was allocated, or the claim names a chip this node never \
         published)"
    )]
    ChipGone { index: u32, device: String },
    #[error(transparent)]
    Lnc(#[from] LncError),
    #[error(
        "the claim's chips resolve to different logicalNeuronCore values ({details}); one container runs one LNC: give every request of the claim the same NeuronConfig"
    )]
    MixedLnc { details: String },
    #[error("no devices allocated")]
    Empty,
}

/// Container edits for the devices of one claim.
pub fn claim_edits(
    inventory: &NodeInventory,
    devices: &[AllocatedDevice<NeuronConfig>],
) -> Result<Vec<DeviceEdits>, PrepareError> {
    let mut chips = Vec::with_capacity(devices.len());
    for d in devices {
        let index = parse_device_name(&d.device)
            .ok_or_else(|| PrepareError::UnknownDevice(d.device.clone()))?;
        let chip = inventory
            .chip(index)
            .ok_or_else(|| PrepareError::ChipGone {
                index,
                device: d.device.clone(),
            })?;
        let lnc = effective_lnc(chip, d.config.as_ref())?;
        chips.push((d, chip, lnc));
    }
    let lncs: BTreeSet<LogicalNeuronCore> = chips.iter().map(|(_, _, l)| *l).collect();
    let lnc = match lncs.len() {
        0 => return Err(PrepareError::Empty),
        1 => *lncs.iter().next().ok_or(PrepareError::Empty)?,
        _ => {
            let details = chips
                .iter()
                .map(|(d, _, l)| format!("{} (request {}): {l}", d.device, d.request))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(PrepareError::MixedLnc { details });
        }
    };
    let visible = range_list(chips.iter().flat_map(|(_, c, _)| logical_cores(c, lnc)));
    let env: std::collections::BTreeMap<String, String> = [
        (ENV_VISIBLE_CORES.to_owned(), visible),
        (ENV_LNC.to_owned(), lnc.to_string()),
    ]
    .into_iter()
    .collect();
    Ok(chips
        .iter()
        .map(|(d, chip, _)| DeviceEdits {
            device: d.device.clone(),
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode::mapped(
                    format!("/dev/neuron{}", chip.index),
                    &chip.device_node,
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
                tracing::info!(claim = %claim, devices = edits.len(), "prepared Neuron chips")
            }
            Err(error) => tracing::warn!(claim = %claim, %error, "cannot prepare Neuron chips"),
        }
        result.map_err(DriverError::new)
    }
}
