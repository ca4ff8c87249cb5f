//! Discovered EFAs → DRA `Device`s: names and attributes.
//!
//! Names and types are contracts (ARCHITECTURE.md, `docs/attributes.md`):
//! CEL compares `"0"` and `0` differently, and a GPU claim pairs with an EFA
//! only if both drivers spell `resource.kubernetes.io/pcieRoot` the same way,
//! which is why the standard ones come from `dra_core::attributes`.
//! Driver-domain attributes are written without a domain. Device names come
//! from the PCI address, so they survive reboots and re-enumeration of the
//! RDMA/uverbs devices.

use std::collections::BTreeMap;

use dra_core::attributes::{PciPlacement, int, string, version};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use topology::devicegroup::DEVICE_GROUP_DOMAIN;
use topology::{InstanceType, PciAddress};

use crate::discovery::{Discovery, Efa};
use crate::sharing;

/// RDMA (ib) device name.
pub const RDMA_DEVICE: &str = "rdmaDevice";
/// EC2 instance type from DMI.
pub const INSTANCE_TYPE: &str = "instanceType";
/// EFA hardware generation (int, 1 for `0xefa0`).
pub const EFA_GENERATION: &str = "efaGeneration";
/// PCI device id, `0xefa1`.
pub const PCI_DEVICE_ID: &str = "pciDeviceId";
/// `fw_ver` of the RDMA device.
pub const FIRMWARE_VERSION: &str = "firmwareVersion";
/// Version of the `efa` kernel module.
pub const EFA_DRIVER_VERSION: &str = "efaDriverVersion";
/// Version of this DRA driver (semver).
pub const DRA_DRIVER_VERSION: &str = "draDriverVersion";

const DEVICE_NAME_PREFIX: &str = "efa-";

/// `0000:4f:00.0` → `efa-0000-4f-00-0` (a DNS label).
pub fn device_name(address: PciAddress) -> String {
    format!(
        "{DEVICE_NAME_PREFIX}{:04x}-{:02x}-{:02x}-{:x}",
        address.domain(),
        address.bus(),
        address.device(),
        address.function()
    )
}

/// The inverse of [`device_name`]; `None` for any other string.
pub fn parse_device_name(name: &str) -> Option<PciAddress> {
    let rest = name.strip_prefix(DEVICE_NAME_PREFIX)?;
    let mut parts = rest.split('-');
    let (d, b, s, f) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    format!("{d}:{b}:{s}.{f}").parse().ok()
}

/// Node-wide facts every device carries.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts<'a> {
    pub instance_type: Option<&'a InstanceType>,
    pub efa_driver_version: Option<&'a str>,
}

/// One EFA as a DRA device.
pub fn efa_device(efa: &Efa, node: &NodeFacts<'_>) -> Device {
    let mut attrs: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
    PciPlacement::new(efa.address, Some(&efa.pcie_root), efa.numa_node).insert_into(&mut attrs);
    let mut put = |k: &str, v: DeviceAttribute| {
        attrs.insert(k.to_owned(), v);
    };
    if let Some(groups) = &efa.device_groups {
        for (name, value) in groups.attributes() {
            put(&format!("{DEVICE_GROUP_DOMAIN}/{name}"), string(value));
        }
    }
    put(RDMA_DEVICE, string(&efa.rdma_device));
    if let Some(t) = node.instance_type {
        put(INSTANCE_TYPE, string(t.as_str()));
    }
    put(EFA_GENERATION, int(efa.generation()));
    put(PCI_DEVICE_ID, string(format!("0x{:04x}", efa.device_id)));
    if let Some(fw) = &efa.firmware_version {
        put(FIRMWARE_VERSION, string(fw));
    }
    if let Some(v) = node.efa_driver_version {
        put(EFA_DRIVER_VERSION, string(v));
    }
    put(DRA_DRIVER_VERSION, version(env!("CARGO_PKG_VERSION")));
    Device {
        name: device_name(efa.address),
        attributes: Some(attrs),
        ..Default::default()
    }
}

/// Every usable EFA of a scan, in PCI address order.
pub fn devices(discovery: &Discovery) -> Vec<Device> {
    let node = NodeFacts {
        instance_type: discovery.instance_type.as_ref(),
        efa_driver_version: discovery.efa_driver_version.as_deref(),
    };
    discovery
        .efas
        .iter()
        .map(|e| efa_device(e, &node))
        .collect()
}

/// Every usable EFA of a scan as published: [`devices`], shared by capacity
/// when `shared` and the instance type's bandwidth per EFA is known. What a
/// scan publishes, and what `discover --instance-type` builds from a model
/// ([`crate::template`]).
pub fn published_devices(found: &Discovery, shared: bool) -> Vec<Device> {
    let mut devices = devices(found);
    if !shared {
        return devices;
    }
    let instance_type = found.instance_type.as_ref().map(|t| t.as_str());
    match instance_type.and_then(sharing::adapter_gbps) {
        Some(gbps) => devices.iter_mut().for_each(|d| sharing::share(d, gbps)),
        None => tracing::warn!(
            instance_type = instance_type.unwrap_or("unknown"),
            "EFA sharing by capacity is on, but the EFA bandwidth of this instance type is \
             not known: EFAs are published exclusive"
        ),
    }
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names() {
        let a: PciAddress = "0000:4f:00.0".parse().unwrap();
        assert_eq!(device_name(a), "efa-0000-4f-00-0");
        assert_eq!(parse_device_name("efa-0000-4f-00-0"), Some(a));
        for bad in [
            "",
            "efa-",
            "efa-0000-4f-00",
            "efa-0000-4f-00-0-1",
            "neuron-device-0",
            "efa-0000-4F-00-0",
            "efa-0000:4f:00.0",
        ] {
            assert_eq!(parse_device_name(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn name_round_trips_and_is_a_dns_label(
            d in any::<u16>(), b in any::<u8>(), s in 0u8..=0x1f, f in 0u8..=7
        ) {
            let a = PciAddress::new(d, b, s, f).unwrap();
            let name = device_name(a);
            prop_assert_eq!(parse_device_name(&name), Some(a));
            prop_assert!(name.len() <= 63);
            prop_assert!(name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,24}") {
            let _ = parse_device_name(&s);
        }
    }
}
