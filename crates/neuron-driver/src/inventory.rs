//! The Neuron chips of this node as `dra-core` scans them
//! ([`NeuronInventory`]).
//!
//! sysfs does not emit inotify events for class directories, so chips that
//! appear or disappear (module reload, driver unbind, a chip the kernel
//! driver takes offline) are found by a rescan, which `dra-core` runs on
//! uevents of the `pci` and `neuron_device` subsystems and periodically (see
//! the rescan loop of `dra-core`). A scan reads three small files per chip. A chip's
//! PCI lookup (an ioctl that opens the chip) is not repeated on rescans: the
//! [`BdfCache`] keeps it while the chip stays. Each successful scan replaces
//! the [`SharedInventory`] that prepare reads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use dra_core::{ApiSupport, DeviceHealth, DeviceInventory, HostPaths, ScannedDevice};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use prometheus::Registry;
use topology::SysfsRoot;

use crate::attributes::network_node_layers;
use crate::bdf::{BdfSource, NeuronIoctl};
use crate::discovery::{BdfCache, DiscoveryError, discover};
use crate::health;
use crate::partitions::{self, Layout, NeuronFlags, PartitionMode, PartitionsFlag};
use crate::prepare::{NeuronDriver, SharedInventory};
use crate::ultraserver::{self, UltraServer};

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
    /// Whether the API server keeps counters (`None`: not asked): the
    /// whole-node device of an UltraServer node needs them.
    counters: Option<bool>,
    /// `networkNodeLayerN` from the Node's labels (`run` only).
    network_node_layers: BTreeMap<u32, String>,
    /// The UltraServer state last logged, to log each change once.
    logged_ultraserver: Option<UltraServer>,
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
            counters: None,
            network_node_layers: BTreeMap::new(),
            logged_ultraserver: None,
        }
    }

    /// What is published besides chips: cores per the partition mode, and
    /// the whole-node device on an UltraServer node unless the API server
    /// is known to drop counters (then it could be allocated beside its
    /// own chips, so it is left out, and the reason logged).
    fn layout(&self) -> Layout {
        Layout {
            mode: self.mode,
            whole_node: self.counters != Some(false),
        }
    }

    /// Logs the node's UltraServer state when it changes.
    fn log_ultraserver(&mut self, state: &UltraServer) {
        if self.logged_ultraserver.as_ref() == Some(state) {
            return;
        }
        match state {
            UltraServer::None => {
                if self.logged_ultraserver.is_some() {
                    tracing::info!("not an UltraServer node (any more)");
                }
            }
            UltraServer::Electing { reason } => tracing::warn!(
                %reason,
                "UltraServer ids not known yet: publishing no whole-node device and no UltraServer node labels until a rescan reads them"
            ),
            UltraServer::Member(m) if self.counters == Some(false) => tracing::error!(
                server_id_4 = %m.server_id_4, node_id_4 = m.node_id_4,
                "UltraServer node, but the API server drops counters (DRAPartitionableDevices off): the whole-node device neuronnode is not published, since nothing would keep it from being allocated beside its own chips"
            ),
            UltraServer::Member(m) => tracing::info!(
                server_id_2 = %m.server_id_2, server_id_4 = %m.server_id_4,
                node_id_2 = m.node_id_2, node_id_4 = m.node_id_4, modes = %m.mode_label(),
                "UltraServer node: publishing the whole-node device neuronnode"
            ),
        }
        self.logged_ultraserver = Some(state.clone());
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
/// carries its chip's; the whole-node device has none).
fn chip_index(device: &Device) -> Option<i64> {
    device.attributes.as_ref()?.get("deviceId")?.int
}

/// One condition per dimension, the most severe (the whole-node device is
/// as bad as its worst chip on each dimension).
fn worst_per_dimension<'a>(
    conditions: impl Iterator<Item = &'a dra_core::HealthCondition>,
) -> Vec<dra_core::HealthCondition> {
    let mut worst: BTreeMap<&str, &dra_core::HealthCondition> = BTreeMap::new();
    for c in conditions {
        let slot = worst.entry(c.dimension.as_str()).or_insert(c);
        if c.severity > slot.severity {
            *slot = c;
        }
    }
    worst.into_values().cloned().collect()
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
        self.counters = support.partitionable_devices;
        if mode == PartitionMode::Cores && support.partitionable_devices == Some(false) {
            tracing::error!(mode = %mode, %reason, "publishing NeuronCores as partitions");
        } else {
            tracing::info!(mode = %mode, %reason, "partition mode");
        }
    }

    fn counter_sets(&self) -> Vec<CounterSet> {
        let inventory = self.shared.read().unwrap_or_else(|e| e.into_inner());
        partitions::counter_sets(&inventory, self.layout())
    }

    const NODE_LABELS: &'static [&'static str] = ultraserver::NODE_LABELS;

    fn set_node_labels(&mut self, labels: &BTreeMap<String, String>) {
        self.network_node_layers = network_node_layers(labels);
    }

    /// The UltraServer labels of a member node; none otherwise (also while
    /// the election runs: a stale id is worse than none).
    fn node_labels(&self) -> BTreeMap<String, String> {
        let inventory = self.shared.read().unwrap_or_else(|e| e.into_inner());
        inventory
            .ultraserver
            .membership()
            .map(|m| m.node_labels())
            .unwrap_or_default()
    }

    /// Every device with the health of its chip ([`crate::health`]).
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, DiscoveryError> {
        let mut inventory = discover(
            &self.sysfs,
            &self.dev_root,
            self.bdf.as_ref(),
            &mut self.cache,
        )?;
        inventory.network_node_layers = self.network_node_layers.clone();
        self.log_ultraserver(&inventory.ultraserver.clone());
        let class = self.sysfs.class_dir("neuron_device");
        // Each chip's health, read once: its cores share it, and the
        // whole-node device has every chip's.
        let chip_health: BTreeMap<i64, Vec<dra_core::HealthCondition>> = inventory
            .chips
            .iter()
            .map(|c| {
                (
                    i64::from(c.index),
                    health::read(&class.join(format!("neuron{}", c.index))),
                )
            })
            .collect();
        let scanned = partitions::devices(&inventory, self.layout())
            .into_iter()
            .map(|device| {
                let conditions = match chip_index(&device) {
                    Some(chip) => chip_health.get(&chip).cloned().unwrap_or_default(),
                    None => worst_per_dimension(chip_health.values().flatten()),
                };
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
