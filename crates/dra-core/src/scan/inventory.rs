//! What a driver says about its hardware: the [`DeviceInventory`] trait.
//! It knows nothing of preparing devices (the `Driver` trait of `prepare`),
//! publishing or kubelet: `run` pairs an inventory with its driver through
//! `NodeDriver`, and a program may use the inventory with the publisher
//! alone.
//!
//! A driver implements one scan: hardware in, devices (name, attributes,
//! capacity) with each device's health out. Everything around it is
//! `dra-core`'s: when to scan (uevents of the subsystems the inventory
//! names, a periodic rescan, see `daemon::rescan`), on which thread (a
//! blocking one: sysfs reads and ioctls block), publishing what changed, the
//! kubelet's health stream, metrics, and the command line (`daemon::runner`).
//!
//! Health is modelled as a list of conditions per device, each on one
//! dimension (what is wrong, e.g. `sram-ecc-uncorrected`), with a severity
//! and a value (a short code or a count). A device without conditions is
//! healthy, which is what every scan reports until the drivers read their
//! health signals.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{CounterSet, Device};
use prometheus::Registry;

/// Health of one device as the driver sees it: the summary of its
/// conditions that kubelet's health stream and the claim status carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Unknown,
    Healthy,
    Unhealthy,
}

/// How bad a condition is. The order is the order of escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Still usable, worse than it should be (error rates above a threshold).
    Degraded,
    /// Unusable until something on the node recovers it (a repair on reset).
    Recoverable,
    /// Unusable until the hardware is replaced or the node rebooted.
    Fatal,
}

/// One thing wrong with a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthCondition {
    /// What is wrong, as a DNS label (`admin-queue-closed`).
    pub dimension: String,
    pub severity: Severity,
    /// A short code or the count that crossed the line.
    pub value: String,
}

impl fmt::Display for HealthCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={} ({:?})", self.dimension, self.value, self.severity)
    }
}

/// A device's health as one scan saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DeviceHealth {
    pub conditions: Vec<HealthCondition>,
}

impl DeviceHealth {
    /// No conditions.
    pub fn healthy() -> Self {
        Self::default()
    }

    /// What kubelet is told: unhealthy when a condition keeps pods off the
    /// device (recoverable or fatal); degraded devices still serve.
    pub fn state(&self) -> HealthState {
        if self
            .conditions
            .iter()
            .any(|c| c.severity >= Severity::Recoverable)
        {
            HealthState::Unhealthy
        } else {
            HealthState::Healthy
        }
    }

    /// One line for humans (kubelet shows it in the pod's status).
    pub fn message(&self) -> String {
        self.conditions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// One device found by a scan.
///
/// The device is shared, not owned: an inventory that keeps its devices
/// between scans (the EFA driver's reused discovery) hands out the same
/// [`Arc`] every scan, and the rescan loop then sees in a pointer compare
/// that the device is as published, where it used to copy, compare and
/// drop every device's attributes on every scan at rest. A device is
/// changed only through [`Arc::make_mut`] (the taints), which copies it
/// while anyone else holds it, so an `Arc` that is pointer-equal to one
/// the loop kept is the device the loop kept.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedDevice {
    pub device: Arc<Device>,
    pub health: DeviceHealth,
}

impl ScannedDevice {
    /// A device with nothing wrong.
    pub fn healthy(device: impl Into<Arc<Device>>) -> Self {
        ScannedDevice {
            device: device.into(),
            health: DeviceHealth::healthy(),
        }
    }
}

/// Where the host's trees are (`--sysfs-root`, `--dev-root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    pub sysfs_root: PathBuf,
    pub dev_root: PathBuf,
}

/// What the API server accepts, as far as an inventory cares. `run` probes
/// it before the first scan when the inventory asks
/// ([`DeviceInventory::wants_api_probe`]); `discover` has no API server and
/// passes [`ApiSupport::unknown`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiSupport {
    /// Partitionable devices (`sharedCounters` / `consumesCounters`):
    /// `None` when not probed.
    pub partitionable_devices: Option<bool>,
    /// Why, in words, for the driver's log line.
    pub reason: String,
    /// Consumable capacity (device `allowMultipleAllocations`, capacity
    /// `requestPolicy`): `None` when not probed.
    pub consumable_capacity: Option<bool>,
    /// Why, in words, for consumable capacity.
    pub consumable_capacity_reason: String,
}

impl ApiSupport {
    /// Not probed (no API server, as in `discover`).
    pub fn unknown() -> Self {
        ApiSupport {
            partitionable_devices: None,
            reason: "no API server was asked".into(),
            consumable_capacity: None,
            consumable_capacity_reason: "no API server was asked".into(),
        }
    }
}

/// A driver's hardware: how to scan it and what makes it change.
pub trait DeviceInventory: Sized + Send + 'static {
    /// Flags of `run` and `discover` that only this driver has
    /// (`NoExtraArgs` for none).
    type Flags: clap::Args + Clone + fmt::Debug + Send + Sync + 'static;
    /// Why a scan (or opening the inventory) failed as a whole.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Kernel uevent subsystems whose events can change the device set or
    /// its health (e.g. `pci`); each one triggers a rescan.
    const UEVENT_SUBSYSTEMS: &'static [&'static str];

    /// Opens the inventory; `metrics` is where the driver registers metrics
    /// of its own (`dra-core` registers the rescan metrics itself).
    fn open(host: &HostPaths, flags: &Self::Flags, metrics: &Registry)
    -> Result<Self, Self::Error>;

    /// Scans the hardware: every device to publish, in a stable order, with
    /// its health. Runs on a blocking thread. A device that cannot be used
    /// is left out (and logged by the driver, once per change, not on every
    /// scan); an `Err` means the scan could not run at all, and the devices
    /// published last stay published.
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, Self::Error>;

    /// Whether `run` should ask the API server what it supports
    /// ([`ApiSupport`]) before the first scan. Default: no.
    fn wants_api_probe(_flags: &Self::Flags) -> bool {
        false
    }

    /// What the API server supports; called once, when the API server has
    /// first answered (the Node read), and followed by a rescan. Until then
    /// scans run with what [`DeviceInventory::open`] assumed (`discover`,
    /// which has no API server, calls it with [`ApiSupport::unknown`]).
    fn set_api_support(&mut self, _support: &ApiSupport) {}

    /// The counter sets the devices of the last scan consume (partitionable
    /// devices); published in slices of their own in the same pool, in the
    /// same update as the devices. Default: none.
    fn counter_sets(&self) -> Vec<CounterSet> {
        Vec::new()
    }

    /// Node label keys this driver manages on its own Node
    /// (`publish::node_labels`): it sets those [`Self::node_labels`] returns
    /// and removes the others. Default: none (the Node is never written).
    const NODE_LABELS: &'static [&'static str] = &[];

    /// The labels of the driver's Node, once the API server has first
    /// answered, followed by a rescan (`run` only: `discover` has no Node
    /// and never calls it).
    fn set_node_labels(&mut self, _labels: &BTreeMap<String, String>) {}

    /// The values of [`Self::NODE_LABELS`] the last scan calls for; a
    /// managed key left out is removed from the Node. Default: none.
    fn node_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Attributes whose values exist only on a running node (PCI
    /// addresses, names the kernel gives, versions of what is installed):
    /// `discover --instance-type` leaves them out of the devices and says
    /// instead which devices share each value. Default: none.
    const RUNTIME_ONLY_ATTRIBUTES: &'static [&'static str] = &[];

    /// What a node of `instance_type` publishes, without hardware: the
    /// devices and counter sets, built from the driver's model of the type
    /// by the code a scan builds them with, as `discover` would print them
    /// (no Node labels, no API server). Each attribute of
    /// [`Self::RUNTIME_ONLY_ATTRIBUTES`] holds a stand-in value that devices
    /// share exactly where they share the value on a node. `Err` says why
    /// not (an instance type without a model, naming those with one).
    /// Default: no model of any type.
    fn instance_template(
        instance_type: &str,
        _flags: &Self::Flags,
    ) -> Result<(Vec<Device>, Vec<CounterSet>), String> {
        Err(format!(
            "this driver has no models of instance types ({instance_type})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(dimension: &str, severity: Severity) -> HealthCondition {
        HealthCondition {
            dimension: dimension.into(),
            severity,
            value: "1".into(),
        }
    }

    #[test]
    fn state_and_message() {
        let cases = [
            (vec![], HealthState::Healthy, ""),
            (
                vec![condition("rx-errors", Severity::Degraded)],
                HealthState::Healthy,
                "rx-errors=1 (Degraded)",
            ),
            (
                vec![condition("hbm-ue-repairable", Severity::Recoverable)],
                HealthState::Unhealthy,
                "hbm-ue-repairable=1 (Recoverable)",
            ),
            (
                vec![
                    condition("rx-errors", Severity::Degraded),
                    condition("admin-queue-closed", Severity::Fatal),
                ],
                HealthState::Unhealthy,
                "rx-errors=1 (Degraded); admin-queue-closed=1 (Fatal)",
            ),
        ];
        for (conditions, state, message) in cases {
            let health = DeviceHealth { conditions };
            assert_eq!(health.state(), state, "{health:?}");
            assert_eq!(health.message(), message);
        }
        assert!(
            Severity::Degraded < Severity::Recoverable && Severity::Recoverable < Severity::Fatal
        );
    }
}
