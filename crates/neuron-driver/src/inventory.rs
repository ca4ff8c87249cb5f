//! The Neuron chips of this node as `dra-core` scans them
//! ([`NeuronInventory`]).
//!
//! sysfs does not emit inotify events for class directories, so chips that
//! appear or disappear (module reload, driver unbind, a chip the kernel
//! driver takes offline) are found by a rescan, which `dra-core` runs on
//! uevents of the `pci` and `neuron_device` subsystems and periodically (see
//! the rescan loop of `dra-core`). A discovery reads three small files per
//! chip; a scan makes one only when the fingerprint changed or every
//! [`FULL_SCAN_EVERY`] scans, and reuses the last one otherwise. Health is
//! read on every scan, through held files ([`HeldFiles`]). A chip's PCI
//! lookup (an ioctl that opens the chip) is not repeated on rescans: the
//! [`BdfCache`] keeps it while the chip stays. Each successful scan replaces
//! the [`SharedInventory`] that prepare reads.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use dra_core::{ApiSupport, DeviceHealth, DeviceInventory, HostPaths, NodeDriver, ScannedDevice};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use prometheus::Registry;
use topology::SysfsRoot;
use topology::reuse::{DiscoveryCache, Fingerprint};

use crate::attributes::network_node_layers;
use crate::bdf::{BdfSource, NeuronIoctl};
use crate::discovery::{BdfCache, DiscoveryError, NEURON_CLASS, NodeInventory, discover};
use crate::health::{self, HeldFiles};
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
    /// Why the Node's label replaced the flag (or was ignored), if it did.
    flag_from_label: Option<String>,
    mode: PartitionMode,
    /// Whether the API server keeps counters (`None`: not asked): the
    /// whole-node device of an UltraServer node needs them.
    counters: Option<bool>,
    /// `networkNodeLayerN` from the Node's labels (`run` only).
    network_node_layers: BTreeMap<u32, String>,
    /// The UltraServer state last logged, to log each change once.
    logged_ultraserver: Option<UltraServer>,
    /// The last discovery, reused while nothing it depends on changed.
    discoveries: DiscoveryCache<(Fingerprint, ultraserver::Files), Found>,
    /// The chips' health files, held open while the discovery is reused.
    held: HeldFiles,
}

/// A full discovery at least every this many scans (every 10 minutes at
/// the default 10 s rescan), whatever the fingerprint says: the fallback
/// for a change no listed file shows.
pub const FULL_SCAN_EVERY: u32 = DiscoveryCache::<(), ()>::DEFAULT_FULL_EVERY;

/// What changes when a chip comes or goes, its device node appears or
/// goes, the `neuron` module is reloaded at another version, or the
/// UltraServer election ends: the `neuron_device` class listing, the
/// chips' device nodes, the module's version and the class-level
/// UltraServer files. Reading it costs one listing and a few small files,
/// against three files, an `lstat` and the PCI function's sysfs entry per
/// chip for a discovery. `None` when the class cannot be listed or the
/// module's version read (then nothing is reused).
fn fingerprint(
    sysfs: &SysfsRoot,
    dev_root: &std::path::Path,
) -> Option<(Fingerprint, ultraserver::Files)> {
    let class = sysfs.class_dir(NEURON_CLASS);
    let listed = Fingerprint::new().list(&class);
    let nodes: Vec<PathBuf> = listed
        .last_listing()
        .iter()
        .map(|chip| dev_root.join(chip))
        .collect();
    let fingerprint = nodes
        .iter()
        .fold(listed, |f, node| f.exists(node))
        .contents(sysfs.join("module/neuron/version"))
        .finish()?;
    Some((fingerprint, ultraserver::read_files(&class)))
}

/// A discovery and the devices last built from it (with the layout and
/// labels they were built for).
#[derive(Debug)]
struct Found {
    inventory: NodeInventory,
    devices: Option<(Layout, BTreeMap<u32, String>, Vec<Device>)>,
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
            flag_from_label: None,
            mode: PartitionMode::Chips,
            counters: None,
            network_node_layers: BTreeMap::new(),
            logged_ultraserver: None,
            discoveries: DiscoveryCache::new(FULL_SCAN_EVERY),
            held: HeldFiles::default(),
        }
    }

    /// The chips: discovered again when the fingerprint changed or
    /// after [`FULL_SCAN_EVERY`] scans, else the last discovery. Health is
    /// read on every scan whatever this returns.
    fn discover(&mut self) -> Result<NodeInventory, DiscoveryError> {
        let fingerprint = fingerprint(&self.sysfs, &self.dev_root);
        let found = self.discoveries.get(fingerprint, || {
            let inventory = discover(
                &self.sysfs,
                &self.dev_root,
                self.bdf.as_ref(),
                &mut self.cache,
            )?;
            Ok::<_, DiscoveryError>(Found {
                inventory,
                devices: None,
            })
        })?;
        if found.discovered {
            self.held = HeldFiles::default();
        }
        Ok(found.value.inventory.clone())
    }

    /// The devices of `inventory` in `layout`: the last ones built when
    /// the discovery, the layout and the labels are the same.
    fn devices(&mut self, inventory: &NodeInventory, layout: Layout) -> Vec<Device> {
        let Some(found) = self.discoveries.value_mut() else {
            return partitions::devices(inventory, layout);
        };
        if let Some((l, layers, devices)) = &found.devices
            && *l == layout
            && *layers == inventory.network_node_layers
        {
            return devices.clone();
        }
        let devices = partitions::devices(inventory, layout);
        found.devices = Some((
            layout,
            inventory.network_node_layers.clone(),
            devices.clone(),
        ));
        devices
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
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = RELEVANT_SUBSYSTEMS;

    fn open(host: &HostPaths, flags: &NeuronFlags, _: &Registry) -> Result<Self, DiscoveryError> {
        let mut inventory = Self::new(host, Box::new(NeuronIoctl));
        inventory.flag = flags.partitions;
        Ok(inventory)
    }

    /// Always: cores need counters, and so does the whole-node device of
    /// an UltraServer node, which is published whatever `--partitions` says.
    fn wants_api_probe(_: &NeuronFlags) -> bool {
        true
    }

    const RUNTIME_ONLY_ATTRIBUTES: &'static [&'static str] = crate::template::RUNTIME_ONLY;

    fn instance_template(
        instance_type: &str,
        flags: &NeuronFlags,
    ) -> Result<(Vec<Device>, Vec<CounterSet>), String> {
        crate::template::devices(instance_type, flags)
    }

    /// Resolves `--partitions` (or the Node's label) and logs the mode and
    /// why, once.
    fn set_api_support(&mut self, support: &ApiSupport) {
        let (mode, mut reason) = partitions::resolve(self.flag, support);
        if let Some(label) = &self.flag_from_label {
            reason = format!("{label}; {reason}");
        }
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

    /// Also where a node pool opts in to cores (or out):
    /// [`partitions::PARTITIONS_LABEL`] overrides `--partitions`.
    fn set_node_labels(&mut self, labels: &BTreeMap<String, String>) {
        self.network_node_layers = network_node_layers(labels);
        let (flag, why) = self.flag.with_node_label(labels);
        self.flag = flag;
        self.flag_from_label = why;
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
        let mut inventory = self.discover()?;
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
                    health::read(&class.join(format!("neuron{}", c.index)), &mut self.held),
                )
            })
            .collect();
        let layout = self.layout();
        let scanned = self
            .devices(&inventory, layout)
            .into_iter()
            .map(|device| {
                let conditions = match chip_index(&device) {
                    Some(chip) => chip_health.get(&chip).cloned().unwrap_or_default(),
                    None => worst_per_dimension(chip_health.values().flatten()),
                };
                ScannedDevice {
                    device: device.into(),
                    health: DeviceHealth { conditions },
                }
            })
            .collect();
        // A poisoned lock only means a reader panicked; the value is whole.
        *self.shared.write().unwrap_or_else(|e| e.into_inner()) = inventory;
        Ok(scanned)
    }
}

impl NodeDriver for NeuronInventory {
    type Driver = NeuronDriver;

    fn driver(&self) -> NeuronDriver {
        NeuronDriver::new(self.shared.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bdf::StaticBdf;
    use sysfs_fixtures::health::{Fault, inject};
    use topology::PciAddress;

    /// Between full discoveries a scan reuses the last one; health is read
    /// on every scan; a chip whose device node goes changes the
    /// fingerprint and is seen at the next scan; a change no listed file
    /// shows (here a chip's core count) is seen within FULL_SCAN_EVERY.
    /// An inventory of a generated trn2.48xlarge (the chips' PCI
    /// addresses answered from the fixture).
    fn trn2(dir: &std::path::Path) -> (sysfs_fixtures::Fixture, NeuronInventory) {
        let fx = sysfs_fixtures::generate("trn2.48xlarge", dir).unwrap();
        let bdf = StaticBdf {
            answers: fx
                .neuron_chips
                .iter()
                .map(|c| {
                    (
                        fx.dev.join(format!("neuron{}", c.index)),
                        Ok(c.bdf.parse::<PciAddress>().unwrap()),
                    )
                })
                .collect(),
        };
        let host = HostPaths {
            sysfs_root: fx.sys.clone(),
            dev_root: fx.dev.clone(),
        };
        let inventory = NeuronInventory::new(&host, Box::new(bdf));
        (fx, inventory)
    }

    /// Whole chips unless the flag or the node pool's label asks for cores
    /// (and the server keeps counters).
    #[test]
    fn cores_only_where_a_node_opts_in() {
        let kept = ApiSupport {
            partitionable_devices: Some(true),
            reason: "kept".into(),
            ..ApiSupport::unknown()
        };
        let dropped = ApiSupport {
            partitionable_devices: Some(false),
            reason: "dropped".into(),
            ..ApiSupport::unknown()
        };
        let label = |v: &str| BTreeMap::from([(partitions::PARTITIONS_LABEL.into(), v.into())]);
        let cases = [
            (None, BTreeMap::new(), &kept, 16),
            (None, label("auto"), &kept, 144),
            (None, label("auto"), &dropped, 16),
            (None, label("bogus"), &kept, 16),
            (Some(PartitionsFlag::Auto), BTreeMap::new(), &kept, 144),
            (Some(PartitionsFlag::Auto), label("chips"), &kept, 16),
        ];
        for (flag, labels, support, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            let (_fx, mut inventory) = trn2(dir.path());
            if let Some(flag) = flag {
                inventory.flag = flag;
            }
            inventory.set_node_labels(&labels);
            inventory.set_api_support(support);
            let devices = inventory.scan().unwrap();
            assert_eq!(
                devices.len(),
                want,
                "{flag:?} {labels:?} {}",
                support.reason
            );
            assert_eq!(inventory.counter_sets().is_empty(), want == 16);
        }
    }

    #[test]
    fn reused_discoveries_see_every_change_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let (fx, inventory) = trn2(dir.path());
        let mut inventory = inventory.with_mode(PartitionMode::Cores);
        let first = inventory.scan().unwrap();
        assert_eq!(first.len(), 144);
        let scans = |inv: &NeuronInventory| inv.discoveries.reused();

        inject(&fx.sys, &Fault::NeuronSramUncorrected { chip: 0 }).unwrap();
        let faulty = inventory.scan().unwrap();
        assert_eq!(scans(&inventory), Some(1), "reused");
        let chip0 = faulty
            .iter()
            .find(|s| s.device.name == "neurondevice0")
            .unwrap();
        assert!(
            !chip0.health.conditions.is_empty(),
            "health read on a reused discovery"
        );

        std::fs::remove_file(fx.dev.join("neuron3")).unwrap();
        let without = inventory.scan().unwrap();
        assert_eq!(scans(&inventory), Some(0), "a full discovery");
        assert!(!without.iter().any(|s| s.device.name == "neurondevice3"));

        let cores = fx.sys.join("class/neuron_device/neuron1/core_count");
        std::fs::write(&cores, "4").unwrap();
        let seen = (1..=FULL_SCAN_EVERY).find(|_| {
            inventory.scan().unwrap();
            inventory
                .shared()
                .read()
                .unwrap()
                .chip(1)
                .map(|c| c.core_count)
                == Some(4)
        });
        assert!(seen.is_some(), "the core count change was never seen");
    }
}
