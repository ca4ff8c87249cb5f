//! What an allocated Neuron device's entry in its claim's `status.devices`
//! carries in `data`, computed from the same inventory and configuration
//! as its container edits:
//!
//! - `chip`: the chip index N of `/dev/neuronN` (chips and cores); the
//!   whole-node device `neuronnode` has `chips`, every chip's index;
//! - `deviceNode`: `/dev/neuronN` in the container (not for `neuronnode`);
//! - `cores`: the chip's physical NeuronCores this device gives, chip-local
//!   (every core of a whole chip, the one core of a core device);
//! - `logicalNeuronCore`: the effective LNC of the claim (1 or 2);
//! - `visibleCores`: the claim's `NEURON_RT_VISIBLE_CORES` value.
//!
//! A Neuron chip has no network interface: no `networkData`. A claim that
//! no longer resolves (its chip gone since prepare) gets no data.

use dra_core::{AllocatedDevice, DeviceStatus};
use serde_json::{Map, Value, json};

use super::{ENV_LNC, ENV_VISIBLE_CORES, claim_edits, resolve};
use crate::config::NeuronConfig;
use crate::discovery::NodeInventory;

pub(super) fn device_status(
    inventory: &NodeInventory,
    devices: &[AllocatedDevice<NeuronConfig>],
) -> Vec<DeviceStatus> {
    let edits = match claim_edits(inventory, devices) {
        Ok(edits) => edits,
        Err(error) => {
            tracing::debug!(%error, "no Neuron status data: the claim no longer resolves");
            return Vec::new();
        }
    };
    let env = edits.first().map(|e| &e.edits.env);
    let visible = env.and_then(|e| e.get(ENV_VISIBLE_CORES)).cloned();
    let lnc = env
        .and_then(|e| e.get(ENV_LNC))
        .and_then(|v| v.parse::<u32>().ok());
    devices
        .iter()
        .filter_map(|d| {
            let resolved = resolve(inventory, d)
                .inspect_err(|error| {
                    tracing::debug!(device = %d.device, %error, "no Neuron status data for this device")
                })
                .ok()?;
            let mut data = Map::new();
            match resolved.as_slice() {
                [one] => {
                    let cores: Vec<u32> = match one.core {
                        Some(k) => vec![k],
                        None => (0..one.chip.core_count).collect(),
                    };
                    data.insert("chip".into(), json!(one.chip.index));
                    data.insert(
                        "deviceNode".into(),
                        json!(format!("/dev/neuron{}", one.chip.index)),
                    );
                    data.insert("cores".into(), json!(cores));
                }
                many => {
                    let chips: Vec<u32> = many.iter().map(|r| r.chip.index).collect();
                    data.insert("chips".into(), json!(chips));
                }
            }
            if let Some(lnc) = lnc {
                data.insert("logicalNeuronCore".into(), Value::from(lnc));
            }
            if let Some(visible) = &visible {
                data.insert("visibleCores".into(), json!(visible));
            }
            Some(DeviceStatus {
                device: d.device.clone(),
                data,
                network: None,
            })
        })
        .collect()
}
