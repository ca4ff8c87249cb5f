//! The EFAs of this node as `dra-core` scans them ([`EfaInventory`]).
//!
//! `dra-core` runs the scan at start, on kernel uevents of the `pci`,
//! `infiniband` and `infiniband_verbs` subsystems (add, remove, bind,
//! unbind, change) and on the periodic rescan; see the rescan loop of `dra-core`. A
//! discovery reads a few files per PCI function; a scan makes one only when
//! the fingerprint (five directories and the `efa` module's
//! version) changed, or every [`FULL_SCAN_EVERY`] scans, and reuses the
//! last one otherwise (see `benches/rescan.rs` for the measured cost).
//! Health is read on every scan. An EFA that is present but unusable is logged once when
//! it becomes unusable (not on every rescan) and counted in the metrics.
//!
//! Health ([`crate::health`]): each scan reads the counters of every EFA.
//! An EFA that was published and then vanished or lost its `efa` binding
//! stays published, tainted `device-lost` (fatal): EC2 does not detach an
//! EFA from a running instance, so that is a failure, and pods bound to it
//! must see it rather than a silently shrinking pool. It is published again
//! untainted when it comes back; a driver restart forgets it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dra_core::{
    ApiSupport, DeviceHealth, DeviceInventory, HealthCondition, HostPaths, NodeDriver,
    ScannedDevice, Severity,
};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use topology::held::{HeldFile, HeldListing};
use topology::reuse::{DiscoveryCache, Fingerprint};
use topology::{PciAddress, SysfsRoot};

use crate::attributes;
use crate::discovery::{self, DiscoveryError, UnusableReason};
use crate::health::{self, CounterSample, EfaCounters};
use crate::prepare::EfaDriver;
use crate::sharing::{self, EfaFlags, SharingFlag};

/// Subsystems whose events can change the EFA set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "infiniband", "infiniband_verbs"];

/// The driver's own metrics (the rescan metrics are `dra-core`'s:
/// `aws_dra_efa_devices`, `aws_dra_efa_rescans_total`,
/// `aws_dra_efa_rescan_duration_seconds`).
#[derive(Debug, Clone)]
pub struct EfaMetrics {
    /// EFAs present but not published, by reason.
    pub unusable: IntGaugeVec,
    /// EFAs that became unusable, by reason (counted once per transition;
    /// `aws_dra_efa_unusable_transitions_total`, not `..._devices_total`,
    /// which would share the gauge's stem).
    pub unusable_total: IntCounterVec,
}

impl EfaMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = EfaMetrics {
            unusable: IntGaugeVec::new(
                Opts::new(
                    "aws_dra_efa_unusable_devices",
                    "EFAs present on the node but not published, by reason",
                ),
                &["reason"],
            )?,
            unusable_total: IntCounterVec::new(
                Opts::new(
                    "aws_dra_efa_unusable_transitions_total",
                    "EFAs that became unusable (unbound driver, missing RDMA or verbs device, unreadable sysfs)",
                ),
                &["reason"],
            )?,
        };
        registry.register(Box::new(m.unusable.clone()))?;
        registry.register(Box::new(m.unusable_total.clone()))?;
        Ok(m)
    }
}

/// Why the inventory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("registering the EFA metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Where the EFAs are, and what was already warned about.
#[derive(Debug)]
pub struct EfaInventory {
    root: SysfsRoot,
    dev_root: std::path::PathBuf,
    unusable: BTreeMap<PciAddress, UnusableReason>,
    metrics: Option<EfaMetrics>,
    /// Every EFA published so far, by device name, as last published.
    published: BTreeMap<String, Arc<Device>>,
    /// The last counter sample of each EFA, for the error rates.
    samples: BTreeMap<String, CounterSample>,
    /// The counter files of each EFA, by device name, held open while the
    /// discovery is reused (closed at every full discovery).
    counters: BTreeMap<String, EfaCounters>,
    /// The last discovery and the devices built from it, reused while
    /// nothing it depends on changed.
    discoveries: DiscoveryCache<Fingerprint, (discovery::Discovery, Vec<Arc<Device>>)>,
    /// What the fingerprint of [`Self::discoveries`] reads.
    fingerprint: FingerprintFiles,
    /// `--sharing`, the flag in effect (the Node's label may replace it),
    /// and whether EFAs are shared by capacity.
    sharing_arg: SharingFlag,
    sharing_flag: SharingFlag,
    shared: bool,
}

/// A full discovery at least every this many scans (every 10 minutes at
/// the default 10 s rescan), whatever the fingerprint says: the fallback
/// for a change no listed directory shows.
pub const FULL_SCAN_EVERY: u32 = DiscoveryCache::<(), ()>::DEFAULT_FULL_EVERY;

/// What changes when an EFA comes, goes, binds or unbinds, or its kernel
/// driver is reloaded: the names in the PCI device list, the `infiniband`
/// and `infiniband_verbs` classes, the `efa` driver's bound functions and
/// `/dev/infiniband`, and the `efa` module's version. The five directories
/// and the version file are held open between scans
/// ([`topology::held::HeldListing`], [`HeldFile`]): a scan at rest rewinds
/// and reads each directory and `pread`s the version, with no path lookup,
/// open or close, and keeps a digest of each listing, not its names. That
/// against a few files per PCI function (120 on a p5) for a discovery.
#[derive(Debug)]
struct FingerprintFiles {
    listings: [HeldListing; 5],
    module_version: HeldFile,
}

impl FingerprintFiles {
    fn new(root: &SysfsRoot, dev_root: &std::path::Path) -> Self {
        let efa = discovery::EFA_KERNEL_DRIVER;
        FingerprintFiles {
            listings: [
                HeldListing::new(root.pci_devices_dir()),
                HeldListing::new(root.class_dir("infiniband")),
                HeldListing::new(root.class_dir("infiniband_verbs")),
                HeldListing::new(root.join("bus/pci/drivers").join(efa)),
                HeldListing::new(dev_root.join("infiniband")),
            ],
            module_version: HeldFile::new(root.join("module").join(efa).join("version")),
        }
    }

    /// The fingerprint now; `None` when something could not be read (then
    /// nothing is reused).
    fn read(&mut self) -> Option<Fingerprint> {
        let read = self
            .listings
            .iter_mut()
            .fold(Fingerprint::new(), |fp, dir| fp.listed(dir));
        read.held_contents(&mut self.module_version).finish()
    }
}

impl EfaInventory {
    pub fn new(host: &HostPaths, metrics: Option<EfaMetrics>) -> Self {
        let root = SysfsRoot::new(&host.sysfs_root);
        EfaInventory {
            fingerprint: FingerprintFiles::new(&root, &host.dev_root),
            root,
            dev_root: host.dev_root.clone(),
            unusable: BTreeMap::new(),
            metrics,
            published: BTreeMap::new(),
            samples: BTreeMap::new(),
            counters: BTreeMap::new(),
            discoveries: DiscoveryCache::new(FULL_SCAN_EVERY),
            sharing_arg: SharingFlag::Exclusive,
            sharing_flag: SharingFlag::Exclusive,
            shared: false,
        }
    }

    /// Shares every EFA by capacity from the next discovery on (what
    /// `set_api_support` decides in `run`).
    pub fn share_by_capacity(&mut self, shared: bool) {
        if self.shared != shared {
            self.shared = shared;
            self.discoveries.clear();
        }
    }

    /// The devices of a discovery ([`attributes::published_devices`] with
    /// this inventory's sharing).
    fn devices_of(&self, found: &discovery::Discovery) -> Vec<Arc<Device>> {
        attributes::published_devices(found, self.shared)
            .into_iter()
            .map(Arc::new)
            .collect()
    }

    /// Every usable EFA with its health, from `discoveries`: discovered
    /// again when the fingerprint changed or after [`FULL_SCAN_EVERY`]
    /// scans, else the last discovery, borrowed: each device is shared with
    /// the scan's answer ([`ScannedDevice`]), not copied, so that the rescan
    /// loop sees it unchanged by pointer. Health is read on every scan.
    fn scan_with(
        &mut self,
        discoveries: &mut DiscoveryCache<Fingerprint, (discovery::Discovery, Vec<Arc<Device>>)>,
    ) -> Result<Vec<ScannedDevice>, InventoryError> {
        let fingerprint = self.fingerprint.read();
        let lookup = discoveries.get(fingerprint, || {
            let found = discovery::discover(&self.root)?;
            let devices = self.devices_of(&found);
            Ok::<_, InventoryError>((found, devices))
        })?;
        let (found, devices) = &*lookup.value;
        if lookup.discovered {
            self.counters.clear();
            // What is unusable changes only with a discovery.
            self.note_unusable(&found.unusable);
        }
        let now = Instant::now();
        let ib_class = self.root.class_dir("infiniband");
        // At rest every map below already holds every EFA: updated in
        // place, with no name copied (a scan used to copy each name four
        // times and build two maps anew).
        let mut out: Vec<ScannedDevice> = Vec::with_capacity(devices.len());
        for (efa, device) in found.efas.iter().zip(devices) {
            let name = &device.name;
            if !self.counters.contains_key(name) {
                let dirs = EfaCounters::new(ib_class.join(&efa.rdma_device));
                self.counters.insert(name.clone(), dirs);
            }
            let Some(dirs) = self.counters.get_mut(name) else {
                continue;
            };
            let (conditions, sample) = health::read(dirs, self.samples.get(name), now);
            match (sample, self.samples.get_mut(name)) {
                (Some(sample), Some(slot)) => *slot = sample,
                (Some(sample), None) => {
                    self.samples.insert(name.clone(), sample);
                }
                (None, _) => {
                    self.samples.remove(name);
                }
            }
            // A reused discovery's devices are as published at its first
            // scan; a new one's are compared before they are kept.
            if lookup.discovered && self.published.get(name) != Some(device) {
                self.published.insert(name.clone(), Arc::clone(device));
            }
            out.push(ScannedDevice {
                device: Arc::clone(device),
                health: DeviceHealth { conditions },
            });
        }
        let scanned = |name: &str| out.iter().any(|s| s.device.name == name);
        if self.samples.len() > out.len() {
            let gone: Vec<String> = self
                .samples
                .keys()
                .filter(|n| !scanned(n))
                .cloned()
                .collect();
            for name in gone {
                self.samples.remove(&name);
            }
        }
        // Every EFA found is in `published`, so only more entries there
        // than EFAs found can mean one that vanished or was unbound.
        if self.published.len() > out.len() {
            let lost: Vec<ScannedDevice> = self
                .published
                .iter()
                .filter(|(name, _)| !scanned(name))
                .map(|(name, device)| {
                    let unbound = self
                        .unusable
                        .keys()
                        .any(|a| attributes::device_name(*a) == *name);
                    ScannedDevice {
                        device: Arc::clone(device),
                        health: DeviceHealth {
                            conditions: vec![HealthCondition {
                                dimension: "device-lost".into(),
                                severity: Severity::Fatal,
                                value: if unbound { "unbound" } else { "vanished" }.into(),
                            }],
                        },
                    }
                })
                .collect();
            out.extend(lost);
        }
        if !out.is_sorted_by(|a, b| a.device.name <= b.device.name) {
            out.sort_by(|a, b| a.device.name.cmp(&b.device.name));
        }
        Ok(out)
    }

    /// Warns once per EFA and reason; forgets EFAs that recovered or left.
    fn note_unusable(&mut self, now: &[discovery::UnusableEfa]) {
        let mut next = BTreeMap::new();
        for u in now {
            if self.unusable.get(&u.address) != Some(&u.reason) {
                tracing::warn!(
                    pci_bus_id = %u.address,
                    reason = %u.reason,
                    "EFA present but not published"
                );
                if let Some(m) = &self.metrics {
                    m.unusable_total
                        .with_label_values(&[u.reason.label()])
                        .inc();
                }
            }
            next.insert(u.address, u.reason.clone());
        }
        if let Some(m) = &self.metrics {
            m.unusable.reset();
            for reason in next.values() {
                m.unusable.with_label_values(&[reason.label()]).inc();
            }
        }
        self.unusable = next;
    }
}

impl DeviceInventory for EfaInventory {
    type Flags = EfaFlags;
    type Error = InventoryError;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = RELEVANT_SUBSYSTEMS;

    fn open(
        host: &HostPaths,
        flags: &EfaFlags,
        metrics: &Registry,
    ) -> Result<Self, InventoryError> {
        let mut inventory = Self::new(host, Some(EfaMetrics::register(metrics)?));
        inventory.sharing_arg = flags.sharing;
        inventory.sharing_flag = flags.sharing;
        Ok(inventory)
    }

    /// Always: a Node label can turn sharing on whatever the flag says, and
    /// sharing needs a server that keeps the consumable-capacity fields.
    fn wants_api_probe(_: &EfaFlags) -> bool {
        true
    }

    const RUNTIME_ONLY_ATTRIBUTES: &'static [&'static str] = crate::template::RUNTIME_ONLY;

    fn instance_template(
        instance_type: &str,
        flags: &EfaFlags,
    ) -> Result<(Vec<Device>, Vec<CounterSet>), String> {
        crate::template::devices(instance_type, flags).map(|devices| (devices, Vec::new()))
    }

    /// Where a node pool opts in to sharing (or out): [`sharing::SHARING_LABEL`].
    fn set_node_labels(&mut self, labels: &BTreeMap<String, String>) {
        let (flag, why) = self.sharing_arg.with_node_label(labels);
        if let Some(why) = why {
            tracing::info!(reason = why, "EFA sharing from the Node label");
        }
        self.sharing_flag = flag;
    }

    /// Settles whether EFAs are shared by capacity, and logs why once.
    fn set_api_support(&mut self, support: &ApiSupport) {
        let (shared, reason) = sharing::resolve(self.sharing_flag, support);
        tracing::info!(shared, reason, "EFA sharing");
        self.share_by_capacity(shared);
    }

    /// Every usable EFA with its health, and every EFA published before
    /// that is now gone or unbound (tainted `device-lost`), in name order.
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, InventoryError> {
        // Out of `self` for the call, so that a discovery can build the
        // devices with `self`'s settings while the scan reads the last one.
        let mut discoveries = std::mem::take(&mut self.discoveries);
        let scanned = self.scan_with(&mut discoveries);
        self.discoveries = discoveries;
        scanned
    }
}

impl NodeDriver for EfaInventory {
    type Driver = EfaDriver;

    fn driver(&self) -> EfaDriver {
        EfaDriver::new(self.root.clone(), &self.dev_root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_register_once() {
        let registry = Registry::new();
        EfaMetrics::register(&registry).unwrap();
        assert!(EfaMetrics::register(&registry).is_err(), "duplicate names");
    }

    /// The project prefix and the driver, and no stem shared between the
    /// gauge and the counter (OpenMetrics would read `X` and `X_total` as
    /// one family of two types).
    #[test]
    fn metric_names_follow_the_naming_rule() {
        let registry = Registry::new();
        let m = EfaMetrics::register(&registry).unwrap();
        m.unusable.with_label_values(&["not_an_efa"]).set(1);
        m.unusable_total.with_label_values(&["not_an_efa"]).inc();
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "aws_dra_efa_unusable_devices",
                "aws_dra_efa_unusable_transitions_total"
            ]
        );
        let gauge_stem = &names[0];
        assert_ne!(names[1].trim_end_matches("_total"), gauge_stem);
    }

    /// Between full discoveries a scan reuses the last one, but an EFA
    /// that goes or unbinds changes the fingerprint and is seen at the
    /// next scan; a change no listing shows (here a function's NUMA node,
    /// which real hardware never changes) is seen within
    /// FULL_SCAN_EVERY scans; health is read on every scan.
    #[test]
    fn reused_discoveries_see_every_change_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let host = HostPaths {
            sysfs_root: fixture.sys.clone(),
            dev_root: fixture.dev.clone(),
        };
        let mut inventory = EfaInventory::new(&host, None);
        let first = inventory.scan().unwrap();
        assert_eq!(first.len(), 32);
        let efa = inventory.discoveries.value().unwrap().0.efas[0].clone();
        let (bdf, name) = (
            efa.address.to_string(),
            attributes::device_name(efa.address),
        );

        // A fault is seen at once although the discovery is reused.
        sysfs_fixtures::health::inject(
            &fixture.sys,
            &sysfs_fixtures::health::Fault::EfaAdminQueueClosed {
                ibdev: efa.rdma_device.clone(),
            },
        )
        .unwrap();
        let faulty = inventory.scan().unwrap();
        assert_eq!(inventory.discoveries.reused(), Some(1));
        let faulty = faulty.iter().find(|d| d.device.name == name).unwrap();
        assert!(
            !faulty.health.conditions.is_empty(),
            "health read on a reused discovery"
        );

        // Unbinding changes the fingerprint: seen at the next scan.
        fixture.unbind_driver(&bdf).unwrap();
        let unbound = inventory.scan().unwrap();
        assert_eq!(inventory.discoveries.reused(), Some(0), "a full discovery");
        let lost = unbound.iter().find(|d| d.device.name == name).unwrap();
        assert_eq!(lost.health.conditions[0].value, "unbound");
        fixture.bind_driver(&bdf).unwrap();

        // A change no listing shows: within FULL_SCAN_EVERY scans.
        inventory.scan().unwrap();
        let numa = |inv: &EfaInventory| inv.discoveries.value().unwrap().0.efas[0].numa_node;
        assert_ne!(numa(&inventory), Some(7));
        let file = fixture
            .sys
            .join("bus/pci/devices")
            .join(&bdf)
            .join("numa_node");
        std::fs::write(&file, "7\n").unwrap();
        let mut seen_after = None;
        for scan in 1..=FULL_SCAN_EVERY {
            inventory.scan().unwrap();
            if numa(&inventory) == Some(7) {
                seen_after = Some(scan);
                break;
            }
        }
        assert!(seen_after.is_some(), "the NUMA change was never seen");
    }

    /// The Node label opts a node in to sharing; EFAs are published shared
    /// (100G per p5 EFA) only where the server keeps the fields, and
    /// exclusive again when it does not or the label goes.
    #[test]
    fn sharing_follows_the_label_and_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let host = HostPaths {
            sysfs_root: fixture.sys.clone(),
            dev_root: fixture.dev.clone(),
        };
        let mut inventory = EfaInventory::new(&host, None);
        let support = |kept| ApiSupport {
            consumable_capacity: Some(kept),
            ..ApiSupport::unknown()
        };
        let label = BTreeMap::from([(sharing::SHARING_LABEL.to_owned(), "capacity".to_owned())]);
        let shared = |inventory: &mut EfaInventory| {
            let scanned = inventory.scan().unwrap();
            assert_eq!(scanned.len(), 32);
            let n = scanned
                .iter()
                .filter(|d| d.device.allow_multiple_allocations == Some(true))
                .count();
            for d in scanned.iter().filter_map(|d| d.device.capacity.as_ref()) {
                assert_eq!(d[sharing::BANDWIDTH].value.0, "100G");
            }
            n
        };
        assert_eq!(shared(&mut inventory), 0, "exclusive by default");
        inventory.set_node_labels(&label);
        inventory.set_api_support(&support(true));
        assert_eq!(shared(&mut inventory), 32);
        inventory.set_api_support(&support(false));
        assert_eq!(shared(&mut inventory), 0, "the server drops the fields");
        inventory.set_node_labels(&BTreeMap::new());
        inventory.set_api_support(&support(true));
        assert_eq!(shared(&mut inventory), 0, "the label is gone");
    }
}
