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
/// Prefix of chip device names: `neurondevice<N>`, as AWS's Neuron DRA
/// driver names them, so that claims it allocated prepare here.
pub const DEVICE_NAME_PREFIX: &str = "neurondevice";
/// Prefix of the names this driver published before it took AWS's
/// (`neuron-device-<N>`). A claim allocated before an upgrade still names
/// its devices that way, so prepare and the double-allocation guard accept
/// both ([`crate::partitions::parse_device_ref`]); nothing publishes them.
pub const LEGACY_DEVICE_NAME_PREFIX: &str = "neuron-device-";

/// `neurondevice<index>`.
pub fn device_name(index: u32) -> String {
    format!("{DEVICE_NAME_PREFIX}{index}")
}

/// The chip index of a chip device name, current or legacy.
pub fn parse_device_name(name: &str) -> Option<u32> {
    let index = name
        .strip_prefix(DEVICE_NAME_PREFIX)
        .or_else(|| name.strip_prefix(LEGACY_DEVICE_NAME_PREFIX))?;
    parse_index(index)
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
        // AWS's names for the group of 4 (a row) and of 8 (a pair of rows).
        attrs.insert("topology4_id".into(), int(chip.index / 4));
        if inventory.chips.len() >= 8 {
            attrs.insert("topology8_id".into(), int(chip.index / 8));
        }
    }
    insert_network_node_layers(inventory, &mut attrs);
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

/// `networkNodeLayerN` from the Node's EC2 instance topology labels.
fn insert_network_node_layers(
    inventory: &NodeInventory,
    attrs: &mut BTreeMap<String, DeviceAttribute>,
) {
    for (layer, value) in &inventory.network_node_layers {
        attrs.insert(format!("networkNodeLayer{layer}"), string(value.clone()));
    }
}

/// The Node label prefix of the EC2 instance topology layers.
pub const NETWORK_NODE_LAYER_LABEL: &str = "topology.k8s.aws/network-node-layer-";

/// The layers among a Node's labels: `topology.k8s.aws/network-node-layer-N`
/// with N a small decimal number.
pub fn network_node_layers(labels: &BTreeMap<String, String>) -> BTreeMap<u32, String> {
    labels
        .iter()
        .filter_map(|(k, v)| {
            let n = parse_index(k.strip_prefix(NETWORK_NODE_LAYER_LABEL)?)?;
            (1..=9).contains(&n).then(|| (n, v.clone()))
        })
        .collect()
}

/// Name of the whole-node device of a Trn2 UltraServer node.
pub const NODE_DEVICE_NAME: &str = "neuronnode";
/// `resourceType` of the whole-node device.
pub const NODE_RESOURCE_TYPE: &str = "neuron_node";

/// The whole-node device of an UltraServer node: every chip of the node at
/// once, with the UltraServer ids (`None` off UltraServers or while the
/// election runs). Its counters are [`crate::partitions`]'s.
pub fn node_device(inventory: &NodeInventory) -> Option<Device> {
    let us = inventory.ultraserver.membership()?;
    if inventory.chips.is_empty() {
        return None;
    }
    let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    attrs.insert("resourceType".into(), string(NODE_RESOURCE_TYPE));
    attrs.insert("draDriverVersion".into(), version(DRA_DRIVER_VERSION));
    if let Some(v) = &inventory.neuron_driver_version {
        attrs.insert("neuronDriverVersion".into(), string(v.clone()));
    }
    if let Some(instance) = &inventory.instance_type {
        attrs.insert("instanceType".into(), string(instance.as_str()));
    }
    let cores: u32 = inventory.chips.iter().map(|c| c.core_count).sum();
    attrs.insert("deviceCount".into(), int(inventory.chips.len() as u32));
    attrs.insert("coreCount".into(), int(cores));
    attrs.insert("ultraserverMode".into(), string(us.mode_label()));
    attrs.insert(
        "ultraserverServerId2".into(),
        string(us.server_id_2.clone()),
    );
    attrs.insert(
        "ultraserverServerId4".into(),
        string(us.server_id_4.clone()),
    );
    attrs.insert("ultraserverNodeId2".into(), int(us.node_id_2));
    attrs.insert("ultraserverNodeId4".into(), int(us.node_id_4));
    insert_network_node_layers(inventory, &mut attrs);
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "cores".to_owned(),
        DeviceCapacity {
            value: Quantity(cores.to_string()),
            ..Default::default()
        },
    );
    let memory: Option<u64> = inventory
        .chips
        .iter()
        .map(|c| c.chip_type.memory_gib())
        .sum();
    if let Some(gib) = memory {
        capacity.insert(
            "memory".to_owned(),
            DeviceCapacity {
                value: Quantity(format!("{gib}Gi")),
                ..Default::default()
            },
        );
    }
    Some(Device {
        name: NODE_DEVICE_NAME.to_owned(),
        attributes: Some(attrs),
        capacity: Some(capacity),
        ..Default::default()
    })
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
        assert_eq!(device_name(12), "neurondevice12");
        assert_eq!(parse_device_name("neurondevice12"), Some(12));
        assert_eq!(parse_device_name("neurondevice0"), Some(0));
        // Names published before the rename still resolve.
        assert_eq!(parse_device_name("neuron-device-12"), Some(12));
        assert_eq!(parse_device_name("neuron-device-0"), Some(0));
        for bad in [
            "neurondevice",
            "neurondevice01",
            "neurondevice-1",
            "neurondevicex",
            "neuron-device-",
            "neuron-device-01",
            "neuron-device-x",
            "efa-0",
            "neuron-device--1",
        ] {
            assert_eq!(parse_device_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn network_node_layers_from_labels() {
        let labels: BTreeMap<String, String> = [
            ("topology.k8s.aws/network-node-layer-1", "nn-1a"),
            ("topology.k8s.aws/network-node-layer-3", "nn-3c"),
            ("topology.k8s.aws/network-node-layer-2", "nn-2b"),
            ("topology.k8s.aws/network-node-layer-01", "bad"),
            ("topology.k8s.aws/network-node-layer-x", "bad"),
            ("topology.kubernetes.io/zone", "us-east-2a"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let layers = network_node_layers(&labels);
        assert_eq!(
            layers.into_iter().collect::<Vec<_>>(),
            vec![
                (1, "nn-1a".to_owned()),
                (2, "nn-2b".to_owned()),
                (3, "nn-3c".to_owned())
            ]
        );
    }
}
