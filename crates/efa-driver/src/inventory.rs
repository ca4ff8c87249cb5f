//! The EFAs of this node as `dra-core` scans them ([`EfaInventory`]).
//!
//! `dra-core` runs the scan at start, on kernel uevents of the `pci`,
//! `infiniband` and `infiniband_verbs` subsystems (add, remove, bind,
//! unbind, change) and on the periodic rescan; see `dra_core::rescan`. A
//! scan reads a few files per PCI function (see `benches/rescan.rs` for its
//! measured cost). An EFA that is present but unusable is logged once when
//! it becomes unusable (not on every rescan) and counted in the metrics.

use std::collections::BTreeMap;

use dra_core::cli::NoExtraArgs;
use dra_core::{DeviceInventory, HostPaths, ScannedDevice};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use topology::{PciAddress, SysfsRoot};

use crate::attributes;
use crate::discovery::{self, DiscoveryError, UnusableReason};
use crate::prepare::EfaDriver;

/// Subsystems whose events can change the EFA set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "infiniband", "infiniband_verbs"];

/// The driver's own metrics (the rescan metrics are `dra-core`'s:
/// `efa_driver_devices`, `efa_driver_rescans_total`,
/// `efa_driver_rescan_duration_seconds`).
#[derive(Debug, Clone)]
pub struct EfaMetrics {
    /// EFAs present but not published, by reason.
    pub unusable: IntGaugeVec,
    /// EFAs that became unusable, by reason (counted once per transition).
    pub unusable_total: IntCounterVec,
}

impl EfaMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = EfaMetrics {
            unusable: IntGaugeVec::new(
                Opts::new(
                    "efa_driver_unusable_devices",
                    "EFAs present on the node but not published, by reason",
                ),
                &["reason"],
            )?,
            unusable_total: IntCounterVec::new(
                Opts::new(
                    "efa_driver_unusable_devices_total",
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
}

impl EfaInventory {
    pub fn new(host: &HostPaths, metrics: Option<EfaMetrics>) -> Self {
        EfaInventory {
            root: SysfsRoot::new(&host.sysfs_root),
            dev_root: host.dev_root.clone(),
            unusable: BTreeMap::new(),
            metrics,
        }
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
    type Flags = NoExtraArgs;
    type Error = InventoryError;
    type Driver = EfaDriver;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = RELEVANT_SUBSYSTEMS;

    fn open(host: &HostPaths, _: &NoExtraArgs, metrics: &Registry) -> Result<Self, InventoryError> {
        Ok(Self::new(host, Some(EfaMetrics::register(metrics)?)))
    }

    /// Every usable EFA, in PCI address order, healthy (health signals are
    /// not read yet).
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, InventoryError> {
        let found = discovery::discover(&self.root)?;
        self.note_unusable(&found.unusable);
        Ok(attributes::devices(&found)
            .into_iter()
            .map(ScannedDevice::healthy)
            .collect())
    }

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
}
