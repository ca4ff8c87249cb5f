//! The EFAs of this node as `dra-core` scans them ([`EfaInventory`]).
//!
//! `dra-core` runs the scan at start, on kernel uevents of the `pci`,
//! `infiniband` and `infiniband_verbs` subsystems (add, remove, bind,
//! unbind, change) and on the periodic rescan; see `dra_core::rescan`. A
//! scan reads a few files per PCI function (see `benches/rescan.rs` for its
//! measured cost). An EFA that is present but unusable is logged once when
//! it becomes unusable (not on every rescan) and counted in the metrics.
//!
//! Health ([`crate::health`]): each scan reads the counters of every EFA.
//! An EFA that was published and then vanished or lost its `efa` binding
//! stays published, tainted `device-lost` (fatal): EC2 does not detach an
//! EFA from a running instance, so that is a failure, and pods bound to it
//! must see it rather than a silently shrinking pool. It is published again
//! untainted when it comes back; a driver restart forgets it.

use std::collections::BTreeMap;

use dra_core::cli::NoExtraArgs;
use std::time::Instant;

use dra_core::{
    DeviceHealth, DeviceInventory, HealthCondition, HostPaths, ScannedDevice, Severity,
};
use k8s_openapi::api::resource::v1::Device;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use topology::{PciAddress, SysfsRoot};

use crate::attributes;
use crate::discovery::{self, DiscoveryError, UnusableReason};
use crate::health::{self, CounterSample};
use crate::prepare::EfaDriver;

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
    published: BTreeMap<String, Device>,
    /// The last counter sample of each EFA, for the error rates.
    samples: BTreeMap<String, CounterSample>,
}

impl EfaInventory {
    pub fn new(host: &HostPaths, metrics: Option<EfaMetrics>) -> Self {
        EfaInventory {
            root: SysfsRoot::new(&host.sysfs_root),
            dev_root: host.dev_root.clone(),
            unusable: BTreeMap::new(),
            metrics,
            published: BTreeMap::new(),
            samples: BTreeMap::new(),
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

    /// Every usable EFA with its health, and every EFA published before
    /// that is now gone or unbound (tainted `device-lost`), in name order.
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, InventoryError> {
        let found = discovery::discover(&self.root)?;
        self.note_unusable(&found.unusable);
        let now = Instant::now();
        let ib_class = self.root.class_dir("infiniband");
        let mut samples = BTreeMap::new();
        let mut out: BTreeMap<String, ScannedDevice> = BTreeMap::new();
        for (efa, device) in found.efas.iter().zip(attributes::devices(&found)) {
            let (conditions, sample) = health::read(
                &ib_class.join(&efa.rdma_device),
                self.samples.get(&device.name),
                now,
            );
            if let Some(sample) = sample {
                samples.insert(device.name.clone(), sample);
            }
            self.published.insert(device.name.clone(), device.clone());
            out.insert(
                device.name.clone(),
                ScannedDevice {
                    device,
                    health: DeviceHealth { conditions },
                },
            );
        }
        for (name, device) in &self.published {
            if out.contains_key(name) {
                continue;
            }
            let unbound = self
                .unusable
                .keys()
                .any(|a| attributes::device_name(*a) == *name);
            out.insert(
                name.clone(),
                ScannedDevice {
                    device: device.clone(),
                    health: DeviceHealth {
                        conditions: vec![HealthCondition {
                            dimension: "device-lost".into(),
                            severity: Severity::Fatal,
                            value: if unbound { "unbound" } else { "vanished" }.into(),
                        }],
                    },
                },
            );
        }
        self.samples = samples;
        Ok(out.into_values().collect())
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
}
