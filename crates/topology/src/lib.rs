//! Where accelerator and network devices sit on the PCI tree of an AWS node.
//!
//! Pure and synchronous: every path is relative to an injectable sysfs root
//! ([`SysfsRoot`]) so that the same code runs against `/sys` and against
//! generated fixtures. No Kubernetes types: the drivers turn what this crate
//! finds into DRA devices.
//!
//! - [`pci`]: [`PciAddress`], [`PcieRoot`], [`PciDevice`] and [`scan()`];
//! - [`proximity`](mod@proximity): PIX/PXB/PHB/NODE/SYS between two functions, nearest;
//! - [`instance`]: the EC2 instance type from DMI;
//! - [`catalog`]: what each supported instance type holds, without a node
//!   (the model `discover --instance-type` builds its devices from);
//! - [`devicegroup`]: AWS's `devicegroup{1,4,8,16}_id` and chip ↔ EFA pairing;
//! - [`ids`]: vendor/device ids and a classifier;
//! - [`sysfs`]: attribute and link helpers the drivers reuse;
//! - [`held`]: attributes held open between scans, with one stale-handle policy;
//! - [`reuse`]: the last discovery reused while a fingerprint of what could
//!   change it reads the same.
//!
//! Errors never abort a scan: a broken function is reported next to the
//! functions that could be read.

mod address;
pub mod catalog;
pub mod devicegroup;
pub mod error;
pub mod held;
pub mod ids;
pub mod instance;
pub mod pci;
pub mod proximity;
pub mod reuse;
pub mod sysfs;

pub use devicegroup::{
    DeviceGroupId, DeviceGroups, EfaTable, LocatedChip, TableMismatch, check_table, derive_pairing,
    device_groups_for_chip, device_groups_for_efa, is_efa_enabled,
};
pub use error::{Error, Result};
pub use ids::{DeviceKind, NeuronGeneration, classify};
pub use instance::{InstanceType, InstanceTypeError};
pub use pci::{
    CpuList, PciAddress, PciAddressError, PciDevice, PciScan, PcieRoot, ScanError,
    list_pci_addresses, scan,
};
pub use proximity::{Proximity, nearest, nearest_unique, proximity, rank_by_proximity};
pub use sysfs::SysfsRoot;
