//! Keeping the published devices current: kernel uevents and periodic rescans.
//!
//! sysfs does not emit inotify events for class directories, so chips that
//! appear or disappear (module reload, driver unbind, a chip the kernel
//! driver takes offline) are found by a rescan, triggered two ways:
//! - a kernel uevent of the `pci` or `neuron_device` subsystem (through
//!   `dra_core::uevent`), after a short settle delay so one hot-plug's burst
//!   of events gives one rescan;
//! - every `interval` (10 s by default) as the fallback for lost events or a
//!   pod that cannot open the uevent socket. A rescan reads three small files
//!   per chip.
//!
//! A chip's PCI lookup (an ioctl that opens the chip) is not repeated on
//! rescans: the [`BdfCache`] keeps it while the chip stays. The device list is
//! sent to the publisher only when it changed, so steady state writes nothing.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::resource::v1::Device;
use tokio::sync::{mpsc, watch};
use topology::SysfsRoot;

use crate::attributes::devices;
use crate::bdf::BdfSource;
use crate::discovery::{BdfCache, DiscoveryError, NodeInventory, discover};
use crate::prepare::SharedInventory;

/// Default time between rescans.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(10);
/// Subsystems whose uevents can change the chip set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "neuron_device"];
/// How long to wait after a uevent for the rest of its burst.
pub const UEVENT_SETTLE: Duration = Duration::from_millis(250);

/// Everything a rescan needs, owned so that it can move to a blocking thread.
pub struct Scanner {
    pub sysfs: SysfsRoot,
    pub dev_root: PathBuf,
    pub bdf: Box<dyn BdfSource>,
    cache: BdfCache,
}

impl Scanner {
    pub fn new(sysfs: SysfsRoot, dev_root: PathBuf, bdf: Box<dyn BdfSource>) -> Self {
        Scanner {
            sysfs,
            dev_root,
            bdf,
            cache: BdfCache::default(),
        }
    }

    pub fn scan(&mut self) -> Result<NodeInventory, DiscoveryError> {
        discover(
            &self.sysfs,
            &self.dev_root,
            self.bdf.as_ref(),
            &mut self.cache,
        )
    }
}

/// Stores `inventory` and sends its devices when they differ from what was
/// last sent. Returns whether anything was sent.
pub fn apply(
    inventory: NodeInventory,
    shared: &SharedInventory,
    tx: &watch::Sender<Vec<Device>>,
) -> bool {
    let new_devices = devices(&inventory);
    *shared.write().unwrap_or_else(|e| e.into_inner()) = inventory;
    tx.send_if_modified(|current| {
        if *current == new_devices {
            false
        } else {
            let (before, after) = (current.len(), new_devices.len());
            tracing::info!(before, after, "Neuron device set changed");
            *current = new_devices;
            true
        }
    })
}

/// Rescans on every uevent trigger (after [`UEVENT_SETTLE`]) and every
/// `interval`, until every receiver is gone. A failed scan keeps the devices
/// published last (a transient sysfs error must not unpublish healthy chips).
pub async fn watch_devices(
    mut scanner: Scanner,
    shared: SharedInventory,
    tx: watch::Sender<Vec<Device>>,
    mut uevents: mpsc::Receiver<()>,
    interval: Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut uevents_open = true;
    loop {
        tokio::select! {
            _ = tx.closed() => return,
            _ = ticker.tick() => {}
            event = uevents.recv(), if uevents_open => {
                if event.is_none() {
                    uevents_open = false;
                    continue;
                }
                tokio::time::sleep(UEVENT_SETTLE).await;
                while uevents.try_recv().is_ok() {}
            }
        }
        let joined = tokio::task::spawn_blocking(move || {
            let result = scanner.scan();
            (scanner, result)
        })
        .await;
        let (back, result) = match joined {
            Ok(pair) => pair,
            Err(error) => {
                tracing::error!(%error, "Neuron rescan task failed; stopping rescans");
                return;
            }
        };
        scanner = back;
        match result {
            Ok(inventory) => {
                apply(inventory, &shared, &tx);
            }
            Err(error) => {
                tracing::warn!(%error, "Neuron rescan failed; keeping the published devices")
            }
        }
    }
}
