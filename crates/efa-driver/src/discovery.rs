//! Finding the node's EFAs in sysfs.
//!
//! An EFA is a PCI function with vendor `0x1d0f`, device `0xefa0`–`0xefa3`
//! ([`topology::classify`]), bound to the `efa` kernel driver, with an RDMA
//! device (`<function>/infiniband/<ibdev>`) and its user-verbs node
//! (`<function>/infiniband_verbs/uverbsN`, or `class/infiniband_verbs/*/ibdev`
//! on kernels that do not link it below the function). Only such functions
//! are usable; an EFA that is present but unbound or without RDMA/verbs
//! device is reported as [`UnusableEfa`] so the caller can warn and count it.
//! ENA NICs, NVMe controllers and Neuron chips share the vendor id and are
//! never EFAs.
//!
//! Cost: the scan reads `vendor` and `device` of every PCI function and the
//! full attribute set only of EFA candidates, so a rescan stays cheap on
//! hosts with hundreds of functions (see `benches/rescan.rs`).
//!
//! Limits: the PCI function is the unit; SR-IOV virtual functions would be
//! listed like any other function (EC2 does not expose EFA VFs to instances).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use topology::sysfs::{list_dir, read_attr, read_hex_u16_attr};
use topology::{
    DeviceGroups, DeviceKind, InstanceType, PciAddress, PciDevice, PcieRoot, SysfsRoot, classify,
    device_groups_for_efa,
};

/// The kernel driver an EFA must be bound to.
pub const EFA_KERNEL_DRIVER: &str = "efa";
/// Directory of the user-verbs device nodes, relative to the dev root.
pub const INFINIBAND_DEV_DIR: &str = "infiniband";

/// A usable EFA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Efa {
    pub address: PciAddress,
    /// PCI device id (`0xefa0` … `0xefa3`).
    pub device_id: u16,
    pub pcie_root: PcieRoot,
    /// `None` where sysfs says `-1`.
    pub numa_node: Option<u32>,
    /// The RDMA (ib) device name, e.g. `rdmap79s0`.
    pub rdma_device: String,
    /// N of `/dev/infiniband/uverbsN`.
    pub uverbs: u32,
    /// `infiniband/<ibdev>/fw_ver` when the kernel reports a non-empty one.
    pub firmware_version: Option<String>,
    /// AWS device groups, only on EFA-enabled Neuron instance types.
    pub device_groups: Option<DeviceGroups>,
}

impl Efa {
    /// `uverbsN`.
    pub fn uverbs_name(&self) -> String {
        format!("uverbs{}", self.uverbs)
    }

    /// EFA hardware generation: `0xefa0` is 1, `0xefa1` 2, and so on.
    pub fn generation(&self) -> u16 {
        self.device_id.saturating_sub(0xefa0) + 1
    }
}

/// Why an EFA function is not published.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum UnusableReason {
    /// No driver, or another driver (e.g. `vfio-pci`), is bound.
    DriverNotBound { driver: Option<String> },
    /// The `efa` driver is bound but registered no RDMA device.
    NoRdmaDevice,
    /// The RDMA device has no user-verbs node.
    NoUverbsDevice { rdma_device: String },
    /// sysfs could not be read for this function.
    Unreadable { error: String },
    /// The function's ids are not an EFA's (a device name pointing at an
    /// ENA, or ids that changed under a racing hot-plug).
    NotAnEfa { vendor: u16, device: u16 },
}

impl UnusableReason {
    /// Short label for the metric.
    pub fn label(&self) -> &'static str {
        match self {
            UnusableReason::DriverNotBound { .. } => "driver_not_bound",
            UnusableReason::NoRdmaDevice => "no_rdma_device",
            UnusableReason::NoUverbsDevice { .. } => "no_uverbs_device",
            UnusableReason::Unreadable { .. } => "unreadable",
            UnusableReason::NotAnEfa { .. } => "not_an_efa",
        }
    }
}

impl fmt::Display for UnusableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnusableReason::DriverNotBound { driver: None } => {
                write!(f, "no kernel driver bound (expected `{EFA_KERNEL_DRIVER}`)")
            }
            UnusableReason::DriverNotBound { driver: Some(d) } => {
                write!(f, "bound to `{d}`, not `{EFA_KERNEL_DRIVER}`")
            }
            UnusableReason::NoRdmaDevice => f.write_str("no RDMA device under infiniband/"),
            UnusableReason::NoUverbsDevice { rdma_device } => {
                write!(f, "RDMA device {rdma_device} has no uverbs node")
            }
            UnusableReason::Unreadable { error } => write!(f, "unreadable: {error}"),
            UnusableReason::NotAnEfa { vendor, device } => {
                write!(f, "PCI function {vendor:04x}:{device:04x} is not an EFA")
            }
        }
    }
}

/// An EFA that is present but not published.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnusableEfa {
    pub address: PciAddress,
    pub reason: UnusableReason,
}

/// Everything one scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Discovery {
    /// From DMI; `None` when absent or not an EC2 instance type.
    pub instance_type: Option<InstanceType>,
    /// `module/efa/version`.
    pub efa_driver_version: Option<String>,
    /// Usable EFAs in PCI address order.
    pub efas: Vec<Efa>,
    pub unusable: Vec<UnusableEfa>,
}

/// The scan could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// `bus/pci/devices` cannot be listed: wrong `--sysfs-root`, or sysfs is
    /// not mounted.
    #[error("cannot list PCI functions under {root}: {source}")]
    PciBus {
        root: PathBuf,
        #[source]
        source: topology::Error,
    },
}

/// Scans `root` for EFAs.
pub fn discover(root: &SysfsRoot) -> Result<Discovery, DiscoveryError> {
    let (addresses, _not_addresses) =
        topology::list_pci_addresses(root).map_err(|source| DiscoveryError::PciBus {
            root: root.path().to_owned(),
            source,
        })?;
    let instance_type = match InstanceType::from_sysfs(root) {
        Ok(t) => t,
        Err(error) => {
            // Off EC2 (or with a broken DMI file) there is no instance type;
            // the EFAs are still usable.
            tracing::debug!(%error, "instance type unknown");
            None
        }
    };
    let efa_driver_version = root.module_version(EFA_KERNEL_DRIVER).ok().flatten();
    let mut out = Discovery {
        instance_type,
        efa_driver_version,
        ..Discovery::default()
    };
    let mut verbs_by_ibdev: Option<BTreeMap<String, u32>> = None;
    for address in addresses {
        if !is_efa_candidate(root, address) {
            continue;
        }
        match read_efa(
            root,
            address,
            out.instance_type.as_ref(),
            &mut verbs_by_ibdev,
        ) {
            Ok(efa) => out.efas.push(efa),
            Err(reason) => out.unusable.push(UnusableEfa { address, reason }),
        }
    }
    Ok(out)
}

/// Reads the one EFA at `address` (what prepare needs, without a full scan).
pub fn read_one(root: &SysfsRoot, address: PciAddress) -> Result<Efa, UnusableReason> {
    let instance_type = InstanceType::from_sysfs(root).ok().flatten();
    read_efa(root, address, instance_type.as_ref(), &mut None)
}

/// Vendor and device id say EFA. Unreadable ids mean "not one we can use";
/// a function that vanished mid-scan is simply not there.
fn is_efa_candidate(root: &SysfsRoot, address: PciAddress) -> bool {
    let dir = root.pci_devices_dir().join(address.to_string());
    let id = |name: &str| read_hex_u16_attr(dir.join(name)).ok().flatten();
    id("vendor") == Some(topology::ids::VENDOR_AMAZON)
        && id("device").is_some_and(|d| topology::ids::EFA_DEVICE_IDS.contains(&d))
}

fn read_efa(
    root: &SysfsRoot,
    address: PciAddress,
    instance_type: Option<&InstanceType>,
    verbs_by_ibdev: &mut Option<BTreeMap<String, u32>>,
) -> Result<Efa, UnusableReason> {
    let unreadable = |e: topology::Error| UnusableReason::Unreadable {
        error: e.to_string(),
    };
    let pci = PciDevice::read(root, address).map_err(unreadable)?;
    if classify(&pci) != DeviceKind::Efa {
        return Err(UnusableReason::NotAnEfa {
            vendor: pci.vendor,
            device: pci.device,
        });
    }
    if pci.driver.as_deref() != Some(EFA_KERNEL_DRIVER) {
        return Err(UnusableReason::DriverNotBound { driver: pci.driver });
    }
    let ib_dir = pci.sysfs_path.join("infiniband");
    let rdma_device = list_dir(&ib_dir)
        .map_err(unreadable)?
        .and_then(|names| names.into_iter().next())
        .ok_or(UnusableReason::NoRdmaDevice)?;
    let uverbs = uverbs_of(root, &pci, &rdma_device, verbs_by_ibdev)
        .map_err(unreadable)?
        .ok_or_else(|| UnusableReason::NoUverbsDevice {
            rdma_device: rdma_device.clone(),
        })?;
    let firmware_version = read_attr(ib_dir.join(&rdma_device).join("fw_ver"))
        .ok()
        .flatten()
        .filter(|v| !v.is_empty());
    let device_groups = instance_type.and_then(|t| device_groups_for_efa(t, address));
    Ok(Efa {
        address,
        device_id: pci.device,
        pcie_root: pci.pcie_root,
        numa_node: pci.numa_node,
        rdma_device,
        uverbs,
        firmware_version,
        device_groups,
    })
}

/// `uverbsN` → N.
fn uverbs_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("uverbs")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The uverbs index of `ibdev`: from the function's own `infiniband_verbs/`
/// when the kernel links it there, otherwise from `class/infiniband_verbs`
/// (read once per scan, only when needed).
fn uverbs_of(
    root: &SysfsRoot,
    pci: &PciDevice,
    ibdev: &str,
    class_map: &mut Option<BTreeMap<String, u32>>,
) -> topology::Result<Option<u32>> {
    let own = pci.sysfs_path.join("infiniband_verbs");
    if let Some(names) = list_dir(&own)? {
        for name in names {
            let Some(n) = uverbs_index(&name) else {
                continue;
            };
            if read_attr(own.join(&name).join("ibdev"))?.as_deref() == Some(ibdev) {
                return Ok(Some(n));
            }
        }
        return Ok(None);
    }
    if class_map.is_none() {
        let class = root.class_dir("infiniband_verbs");
        let mut map = BTreeMap::new();
        for name in list_dir(&class)?.unwrap_or_default() {
            let Some(n) = uverbs_index(&name) else {
                continue;
            };
            if let Some(dev) = read_attr(class.join(&name).join("ibdev"))? {
                map.insert(dev, n);
            }
        }
        *class_map = Some(map);
    }
    Ok(class_map.as_ref().and_then(|m| m.get(ibdev).copied()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uverbs_names() {
        let cases = [
            ("uverbs0", Some(0)),
            ("uverbs31", Some(31)),
            ("uverbs", None),
            ("uverbs-1", None),
            ("abi_version", None),
            ("uverbs1x", None),
        ];
        for (name, want) in cases {
            assert_eq!(uverbs_index(name), want, "{name}");
        }
    }

    #[test]
    fn generation_from_device_id() {
        let mut efa = Efa {
            address: "0000:4f:00.0".parse().unwrap(),
            device_id: 0xefa0,
            pcie_root: PcieRoot::new(0, 0x44),
            numa_node: None,
            rdma_device: "rdmap79s0".into(),
            uverbs: 0,
            firmware_version: None,
            device_groups: None,
        };
        for (id, generation) in [(0xefa0, 1), (0xefa1, 2), (0xefa2, 3), (0xefa3, 4)] {
            efa.device_id = id;
            assert_eq!(efa.generation(), generation);
        }
    }

    #[test]
    fn missing_pci_bus_is_an_error_naming_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let err = discover(&SysfsRoot::new(dir.path())).unwrap_err();
        assert!(
            err.to_string().contains(&dir.path().display().to_string()),
            "{err}"
        );
    }
}
