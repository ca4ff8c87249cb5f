//! The Neuron chips of this node as `dra-core` scans them
//! ([`NeuronInventory`]).
//!
//! sysfs does not emit inotify events for class directories, so chips that
//! appear or disappear (module reload, driver unbind, a chip the kernel
//! driver takes offline) are found by a rescan, which `dra-core` runs on
//! uevents of the `pci` and `neuron_device` subsystems and periodically (see
//! `dra_core::rescan`). A scan reads three small files per chip. A chip's
//! PCI lookup (an ioctl that opens the chip) is not repeated on rescans: the
//! [`BdfCache`] keeps it while the chip stays. Each successful scan replaces
//! the [`SharedInventory`] that prepare reads.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use dra_core::{ApiSupport, DeviceHealth, DeviceInventory, HostPaths, ScannedDevice};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use prometheus::Registry;
use topology::SysfsRoot;

use crate::bdf::{BdfSource, NeuronIoctl};
use crate::discovery::{BdfCache, DiscoveryError, discover};
use crate::health;
use crate::partitions::{self, NeuronFlags, PartitionMode, PartitionsFlag};
use crate::prepare::{NeuronDriver, SharedInventory};

/// Subsystems whose uevents can change the chip set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "neuron_device"];

/// Everything a scan needs, owned so that it can move to a blocking thread.
pub struct NeuronInventory {
    sysfs: SysfsRoot,
    dev_root: PathBuf,
    bdf: Box<dyn BdfSource>,
    cache: BdfCache,
    shared: SharedInventory,
    flag: PartitionsFlag,
    mode: PartitionMode,
}

impl NeuronInventory {
    /// `bdf` looks chips' PCI addresses up ([`NeuronIoctl`] on a real node).
    pub fn new(host: &HostPaths, bdf: Box<dyn BdfSource>) -> Self {
        NeuronInventory {
            sysfs: SysfsRoot::new(&host.sysfs_root),
            dev_root: host.dev_root.clone(),
            bdf,
            cache: BdfCache::default(),
            shared: Arc::new(RwLock::new(Default::default())),
            flag: PartitionsFlag::Chips,
            mode: PartitionMode::Chips,
        }
    }

    /// Publishes cores as partitions of their chips, or not (what
    /// `set_api_support` decides from `--partitions` in `run`).
    pub fn with_mode(mut self, mode: PartitionMode) -> Self {
        self.mode = mode;
        self
    }

    /// What is published.
    pub fn mode(&self) -> PartitionMode {
        self.mode
    }

    /// What the last successful scan found (what prepare works from).
    pub fn shared(&self) -> &SharedInventory {
        &self.shared
    }
}

/// The chip a device is on (its `deviceId` attribute; a core device
/// carries its chip's).
fn chip_index(device: &Device) -> Option<i64> {
    device.attributes.as_ref()?.get("deviceId")?.int
}

impl DeviceInventory for NeuronInventory {
    type Flags = NeuronFlags;
    type Error = DiscoveryError;
    type Driver = NeuronDriver;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = RELEVANT_SUBSYSTEMS;

    fn open(host: &HostPaths, flags: &NeuronFlags, _: &Registry) -> Result<Self, DiscoveryError> {
        let mut inventory = Self::new(host, Box::new(NeuronIoctl));
        inventory.flag = flags.partitions;
        Ok(inventory)
    }

    fn wants_api_probe(flags: &NeuronFlags) -> bool {
        flags.partitions != PartitionsFlag::Chips
    }

    /// Resolves `--partitions` and logs the mode and why, once.
    fn set_api_support(&mut self, support: &ApiSupport) {
        let (mode, reason) = partitions::resolve(self.flag, support);
        self.mode = mode;
        if mode == PartitionMode::Cores && support.partitionable_devices == Some(false) {
            tracing::error!(mode = %mode, %reason, "publishing NeuronCores as partitions");
        } else {
            tracing::info!(mode = %mode, %reason, "partition mode");
        }
    }

    fn counter_sets(&self) -> Vec<CounterSet> {
        let inventory = self.shared.read().unwrap_or_else(|e| e.into_inner());
        partitions::counter_sets(&inventory, self.mode)
    }

    /// Every device with the health of its chip ([`crate::health`]).
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, DiscoveryError> {
        let inventory = discover(
            &self.sysfs,
            &self.dev_root,
            self.bdf.as_ref(),
            &mut self.cache,
        )?;
        let class = self.sysfs.class_dir("neuron_device");
        let scanned = partitions::devices(&inventory, self.mode)
            .into_iter()
            .map(|device| {
                let conditions = chip_index(&device)
                    .map(|chip| health::read(&class.join(format!("neuron{chip}"))))
                    .unwrap_or_default();
                ScannedDevice {
                    device,
                    health: DeviceHealth { conditions },
                }
            })
            .collect();
        // A poisoned lock only means a reader panicked; the value is whole.
        *self.shared.write().unwrap_or_else(|e| e.into_inner()) = inventory;
        Ok(scanned)
    }

    fn driver(&self) -> NeuronDriver {
        NeuronDriver::new(self.shared.clone())
    }
}
