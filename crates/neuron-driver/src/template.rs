//! `discover --instance-type`: the devices a node of an instance type
//! publishes, without the node.
//!
//! The chips come from the type's model ([`topology::catalog`]) as the
//! [`NodeInventory`] a discovery of such a node would return, with the
//! chips' PCI functions known (as the ioctl answers them on a node), and
//! become devices and counter sets through the same code as a scan's
//! ([`crate::partitions::devices`], [`crate::partitions::counter_sets`]),
//! with `--partitions` resolved as `discover` resolves it. Only what exists
//! on a running node is a stand-in: PCI addresses, root complexes (one per
//! model root, the same stand-in the EFA driver gives the EFAs of that
//! root), the kernel module's version and, on UltraServer nodes, the ids
//! and modes the kernel's election settles. `dra-core` leaves those
//! attributes, [`RUNTIME_ONLY`], out of what it prints and lists the
//! devices sharing each value instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use dra_core::ApiSupport;
use dra_core::attributes::{PCI_BUS_ID, PCIE_ROOT};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use topology::catalog::{self, InstanceModel, ModelChip};
use topology::ids::VENDOR_AMAZON;
use topology::{InstanceType, PciAddress, PciDevice, PcieRoot};

use crate::discovery::{ChipPci, ChipType, NeuronChip, NodeInventory};
use crate::partitions::{self, Layout, NeuronFlags};
use crate::ultraserver::{MODE_X1, MODE_X2H, MODE_X2V, MODE_X4, Membership, UltraServer};

/// Attributes of a Neuron device that exist only on a running node: where
/// the chip sits on the PCI tree (and the device groups, computed from the
/// PCI addresses of its EFAs), the version of the `neuron` kernel module,
/// and what the UltraServer election settles on a trn2u node.
pub const RUNTIME_ONLY: &[&str] = &[
    PCIE_ROOT,
    PCI_BUS_ID,
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
    "neuronDriverVersion",
    "ultraserverMode",
    "ultraserverServerId2",
    "ultraserverServerId4",
    "ultraserverNodeId2",
    "ultraserverNodeId4",
];

/// The stand-in of every node-specific string: one value, shared by the
/// devices that share the real one.
const STAND_IN: &str = "runtime";

/// The chip's PCI function as the ioctl and sysfs would give it: a
/// stand-in address, unique per chip, in a domain no EC2 instance uses, on
/// the stand-in of its model root complex.
fn chip_pci(instance_type: &str, chip: &ModelChip) -> Result<ChipPci, String> {
    let bad = || format!("{instance_type}: chip {} out of range", chip.index);
    let address = PciAddress::new(0xffff, u8::try_from(chip.index).map_err(|_| bad())?, 0, 0)
        .ok_or_else(bad)?;
    let root = u8::try_from(chip.root).map_err(|_| bad())?;
    let device = PciDevice {
        address,
        sysfs_path: PathBuf::new(),
        vendor: VENDOR_AMAZON,
        // The chip's type comes from the model's generation instead.
        device: 0,
        class: 0,
        subsystem_vendor: None,
        subsystem_device: None,
        driver: Some("neuron".to_owned()),
        numa_node: Some(chip.numa_node),
        local_cpulist: None,
        link_speed: None,
        link_width: None,
        bridges: Vec::new(),
        pcie_root: PcieRoot::new(0, root),
    };
    Ok(ChipPci {
        address,
        device: Some(device),
    })
}

/// A settled UltraServer membership, every mode supported, stand-in ids.
fn ultraserver_member() -> UltraServer {
    UltraServer::Member(Membership {
        modes: BTreeSet::from([MODE_X4, MODE_X2H, MODE_X2V, MODE_X1]),
        server_id_2: STAND_IN.to_owned(),
        server_id_4: STAND_IN.to_owned(),
        node_id_2: 0,
        node_id_4: 0,
    })
}

/// What a discovery of a node of `model` would return, with stand-ins for
/// what only a node has (the module doc).
pub fn inventory(model: &InstanceModel) -> Result<NodeInventory, String> {
    let instance_type: InstanceType = model.instance_type.parse().map_err(|e| format!("{e}"))?;
    let Some(neuron) = model.neuron else {
        return Ok(NodeInventory {
            instance_type: Some(instance_type),
            ..NodeInventory::default()
        });
    };
    let mut chips = Vec::new();
    for chip in model.chips() {
        chips.push(NeuronChip {
            index: chip.index,
            core_count: neuron.cores_per_chip,
            connected: Some(model.connected(chip.index)),
            chip_type: ChipType::Known(neuron.generation),
            device_node: PathBuf::from(format!("/dev/neuron{}", chip.index)),
            pci: Some(chip_pci(model.instance_type, &chip)?),
        });
    }
    Ok(NodeInventory {
        instance_type: Some(instance_type),
        neuron_driver_version: Some(STAND_IN.to_owned()),
        chips,
        ultraserver: if neuron.ultraserver {
            ultraserver_member()
        } else {
            UltraServer::None
        },
        network_node_layers: BTreeMap::new(),
    })
}

/// The devices and counter sets `discover` would print on a node of
/// `instance_type`, with stand-ins for [`RUNTIME_ONLY`].
pub fn devices(
    instance_type: &str,
    flags: &NeuronFlags,
) -> Result<(Vec<Device>, Vec<CounterSet>), String> {
    let model = catalog::model(instance_type).ok_or_else(|| {
        format!(
            "the Neuron driver has models of {}",
            catalog::known_instance_types()
        )
    })?;
    let inventory = inventory(model)?;
    // As `discover`, which asks no API server whether it keeps counters.
    let (mode, _) = partitions::resolve(flags.partitions, &ApiSupport::unknown());
    let layout = Layout {
        mode,
        whole_node: true,
    };
    Ok((
        partitions::devices(&inventory, layout),
        partitions::counter_sets(&inventory, layout),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every model builds; chips are wired as the model says (a torus is
    /// recognised as one); an unknown type names the known ones.
    #[test]
    fn every_model_builds() {
        for model in catalog::INSTANCE_MODELS {
            let inv = inventory(model).unwrap();
            assert_eq!(
                inv.chips.len(),
                model.chips().len(),
                "{}",
                model.instance_type
            );
            let torus = model.neuron.map(|n| n.wiring) == Some(catalog::ChipWiring::Torus4x4);
            assert_eq!(inv.is_torus_4x4(), torus, "{}", model.instance_type);
        }
        let err = devices("m5.8xlarge", &NeuronFlags::default()).unwrap_err();
        assert!(err.contains("trn2u.48xlarge"), "{err}");
    }
}
