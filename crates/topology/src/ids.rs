//! PCI ids of the devices the drivers care about, and a classifier.
//!
//! Devices are identified by vendor/device id (and, for EFA, the bound
//! driver by the caller's choice), never by a human-readable name: ENA and
//! NVMe functions share Amazon's vendor id with EFA and Neuron.

use crate::pci::PciDevice;

pub const VENDOR_AMAZON: u16 = 0x1d0f;
pub const VENDOR_NVIDIA: u16 = 0x10de;

/// EFA generations (all "Elastic Fabric Adapter (EFA)" in pci.ids).
pub const EFA_DEVICE_IDS: &[u16] = &[0xefa0, 0xefa1, 0xefa2, 0xefa3];
/// ENA network adapter (a decoy for EFA discovery).
pub const ENA_DEVICE_ID: u16 = 0xec20;

/// Neuron chip generations by PCI device id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NeuronGeneration {
    Inferentia1,
    Trainium1,
    Inferentia2,
    Trainium2,
    Trainium3,
}

impl NeuronGeneration {
    pub fn from_device_id(id: u16) -> Option<Self> {
        Some(match id {
            0x7064..=0x7067 => NeuronGeneration::Inferentia1,
            0x7164 => NeuronGeneration::Trainium1,
            0x7264 => NeuronGeneration::Inferentia2,
            0x7364 => NeuronGeneration::Trainium2,
            0x7564 | 0x7565 => NeuronGeneration::Trainium3,
            _ => return None,
        })
    }
}

/// What kind of device a PCI function is, as far as the drivers care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Efa,
    Neuron(NeuronGeneration),
    /// An NVIDIA display or 3D controller (class 0x03xxxx).
    NvidiaGpu,
    Other,
}

/// Classifies by vendor, device id and class; the bound driver is not
/// consulted (an EFA without the `efa` driver is still an EFA, just not
/// usable, which is the driver's call to make).
pub fn classify(dev: &PciDevice) -> DeviceKind {
    match dev.vendor {
        VENDOR_AMAZON if EFA_DEVICE_IDS.contains(&dev.device) => DeviceKind::Efa,
        VENDOR_AMAZON => match NeuronGeneration::from_device_id(dev.device) {
            Some(g) => DeviceKind::Neuron(g),
            None => DeviceKind::Other,
        },
        VENDOR_NVIDIA if dev.class >> 16 == 0x03 => DeviceKind::NvidiaGpu,
        _ => DeviceKind::Other,
    }
}
