//! Chips → DRA devices: names, attributes, capacity.
//!
//! Attribute names and types are contracts (ARCHITECTURE.md, and
//! `docs/attributes.md`): driver-domain attributes are written without a
//! domain; the device-group attributes come from `topology` so that they are
//! byte-identical to the EFA driver's; the standard PCI attributes appear
//! only when the chip's PCI function is known.

use std::collections::BTreeMap;

use dra_core::attributes::{PciPlacement, int, string, version};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::discovery::{NeuronChip, NodeInventory};

/// Version of this driver, published as `draDriverVersion`.
pub const DRA_DRIVER_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Value of `resourceType`.
pub const RESOURCE_TYPE: &str = "neuron_device";
/// Prefix of device names.
pub const DEVICE_NAME_PREFIX: &str = "neuron-device-";

/// `neuron-device-<index>`.
pub fn device_name(index: u32) -> String {
    format!("{DEVICE_NAME_PREFIX}{index}")
}

/// The chip index of a device name we published.
pub fn parse_device_name(name: &str) -> Option<u32> {
    parse_index(name.strip_prefix(DEVICE_NAME_PREFIX)?)
}

/// An index as our device names write it: decimal, no sign, no leading zero.
pub(crate) fn parse_index(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

/// The device of one chip.
pub fn chip_device(inventory: &NodeInventory, chip: &NeuronChip, torus: bool) -> Device {
    let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    attrs.insert("deviceId".into(), int(chip.index));
    attrs.insert("resourceType".into(), string(RESOURCE_TYPE));
    attrs.insert("coreCount".into(), int(chip.core_count));
    attrs.insert("draDriverVersion".into(), version(DRA_DRIVER_VERSION));
    if let Some(v) = &inventory.neuron_driver_version {
        attrs.insert("neuronDriverVersion".into(), string(v.clone()));
    }
    if torus {
        attrs.insert("topology_x".into(), int(chip.index / 4));
        attrs.insert("topology_y".into(), int(chip.index % 4));
    }
    if let Some(instance) = &inventory.instance_type {
        attrs.insert("instanceType".into(), string(instance.as_str()));
        if let Some(groups) = topology::device_groups_for_chip(instance, chip.index) {
            for (name, value) in groups.attributes() {
                attrs.insert(
                    format!("{}/{name}", topology::devicegroup::DEVICE_GROUP_DOMAIN),
                    string(value),
                );
            }
        }
    }
    if let Some(pci) = &chip.pci {
        let device = pci.device.as_ref();
        PciPlacement::new(
            pci.address,
            device.map(|d| d.pcie_root),
            device.and_then(|d| d.numa_node),
        )
        .insert_into(&mut attrs);
    }

    let mut capacity = BTreeMap::new();
    capacity.insert(
        "cores".to_owned(),
        DeviceCapacity {
            value: Quantity(chip.core_count.to_string()),
            ..Default::default()
        },
    );
    if let Some(gib) = chip.chip_type.memory_gib() {
        capacity.insert(
            "memory".to_owned(),
            DeviceCapacity {
                value: Quantity(format!("{gib}Gi")),
                ..Default::default()
            },
        );
    }
    Device {
        name: device_name(chip.index),
        attributes: Some(attrs),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// Every chip's device, by index.
pub fn devices(inventory: &NodeInventory) -> Vec<Device> {
    let torus = inventory.is_torus_4x4();
    inventory
        .chips
        .iter()
        .map(|c| chip_device(inventory, c, torus))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(device_name(12), "neuron-device-12");
        assert_eq!(parse_device_name("neuron-device-12"), Some(12));
        assert_eq!(parse_device_name("neuron-device-0"), Some(0));
        for bad in [
            "neuron-device-",
            "neuron-device-01",
            "neuron-device-x",
            "efa-0",
            "neuron-device--1",
        ] {
            assert_eq!(parse_device_name(bad), None, "{bad}");
        }
    }
}
