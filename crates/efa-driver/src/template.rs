//! `discover --instance-type`: the EFAs a node of an instance type
//! publishes, without the node.
//!
//! The EFAs come from the type's model ([`topology::catalog`]) as the
//! [`Discovery`] a scan of such a node would return, and become devices
//! through the same code as a scan's ([`published_devices`]:
//! attributes, device groups, sharing). Only what exists on a running node
//! is a stand-in: PCI addresses (device groups are computed from the
//! published table's addresses, as on a node), root complexes (one per
//! model root, so the EFAs of one root share it, and the Neuron driver's
//! chips of that root share the same stand-in), RDMA device names and the
//! kernel module's version. `dra-core` leaves those attributes,
//! [`RUNTIME_ONLY`], out of what it prints and lists the EFAs sharing each
//! value instead.
//!
//! Device names come from the PCI address, so the template numbers EFAs in
//! PCI address order instead: [`template_name`].

use dra_core::ApiSupport;
use dra_core::attributes::{PCI_BUS_ID, PCIE_ROOT};
use k8s_openapi::api::resource::v1::Device;
use topology::catalog::{self, InstanceModel};
use topology::{EfaTable, InstanceType, PciAddress, PcieRoot, device_groups_for_efa};

use crate::attributes::{EFA_DRIVER_VERSION, FIRMWARE_VERSION, RDMA_DEVICE, published_devices};
use crate::discovery::{Discovery, Efa};
use crate::sharing::{self, EfaFlags};

/// Attributes of an EFA that exist only on a running node: where it sits
/// on the PCI tree (and the device groups, computed from PCI addresses),
/// the name the kernel gives its RDMA device, and the versions of its
/// firmware and of the `efa` kernel module.
pub const RUNTIME_ONLY: &[&str] = &[
    PCIE_ROOT,
    PCI_BUS_ID,
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
    RDMA_DEVICE,
    FIRMWARE_VERSION,
    EFA_DRIVER_VERSION,
];

/// The stand-in of the `efa` module's version: one value, shared by every
/// EFA of a node as the real one is.
const MODULE_VERSION: &str = "runtime";

/// The template's name of the EFA at `position` in PCI address order, two
/// digits (no instance has 100 EFAs), so that name order is PCI order, as
/// on a node.
pub fn template_name(position: u32) -> String {
    format!("efa-{position:02}")
}

/// A stand-in PCI address, unique per position, in a domain no EC2
/// instance uses.
fn stand_in_address(position: u32) -> Option<PciAddress> {
    PciAddress::new(0xffff, u8::try_from(position).ok()?, 0, 0)
}

/// What a scan of a node of `model` would find, with stand-ins for what
/// only a node has (the module doc).
pub fn discovery(model: &InstanceModel) -> Result<Discovery, String> {
    let instance_type: InstanceType = model.instance_type.parse().map_err(|e| format!("{e}"))?;
    // Where AWS publishes the chip → EFA table, the n-th EFA in PCI order
    // is the table's n-th address: the device groups are computed from it.
    let table: Vec<PciAddress> = EfaTable::for_instance(&instance_type)
        .map(|t| t.efas().into_iter().collect())
        .unwrap_or_default();
    let model_efas = model.efas();
    if !table.is_empty() && table.len() != model_efas.len() {
        return Err(format!(
            "the model of {instance_type} has {} EFAs, its device-group table {}",
            model_efas.len(),
            table.len()
        ));
    }
    let mut efas = Vec::new();
    for efa in model_efas {
        let address = match table.get(efa.position as usize) {
            Some(a) => *a,
            None => stand_in_address(efa.position)
                .ok_or_else(|| format!("{instance_type}: too many EFAs"))?,
        };
        let root =
            u8::try_from(efa.root).map_err(|_| format!("{instance_type}: root {}", efa.root))?;
        efas.push(Efa {
            address,
            device_id: model.efa_device_id.unwrap_or_default(),
            pcie_root: PcieRoot::new(0, root),
            numa_node: Some(efa.numa_node),
            rdma_device: format!("rdma-{}", efa.position),
            uverbs: efa.position,
            // Not modelled: adapters may differ, so no group is claimed.
            firmware_version: None,
            device_groups: device_groups_for_efa(&instance_type, address),
        });
    }
    Ok(Discovery {
        instance_type: Some(instance_type),
        efa_driver_version: Some(MODULE_VERSION.to_owned()),
        efas,
        unusable: Vec::new(),
    })
}

/// The devices `discover` would print on a node of `instance_type`, named
/// by [`template_name`], with stand-ins for [`RUNTIME_ONLY`].
pub fn devices(instance_type: &str, flags: &EfaFlags) -> Result<Vec<Device>, String> {
    let model = catalog::model(instance_type).ok_or_else(|| {
        format!(
            "the EFA driver has models of {}",
            catalog::known_instance_types()
        )
    })?;
    let found = discovery(model)?;
    // As `discover`, which asks no API server whether it keeps the
    // consumable-capacity fields.
    let (shared, _) = sharing::resolve(flags.sharing, &ApiSupport::unknown());
    let mut devices = published_devices(&found, shared);
    for (device, efa) in devices.iter_mut().zip(model.efas()) {
        device.name = template_name(efa.position);
    }
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every model builds, with the table's addresses where there is a
    /// table, and an unknown type names the known ones.
    #[test]
    fn every_model_builds() {
        for model in catalog::INSTANCE_MODELS {
            let found = discovery(model).unwrap();
            assert_eq!(
                found.efas.len(),
                model.efas().len(),
                "{}",
                model.instance_type
            );
            let t = found.instance_type.unwrap();
            let grouped = found.efas.iter().all(|e| e.device_groups.is_some());
            assert_eq!(
                grouped,
                EfaTable::for_instance(&t).is_some() || found.efas.is_empty()
            );
        }
        let err = devices("m5.8xlarge", &EfaFlags::default()).unwrap_err();
        assert!(err.contains("p5.48xlarge"), "{err}");
    }
}
