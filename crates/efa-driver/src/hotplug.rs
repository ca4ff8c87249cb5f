//! Keeping the published device set in step with the hardware.
//!
//! Two triggers feed one rescan ([`Inventory::rescan`]):
//! - kernel uevents (`NETLINK_KOBJECT_UEVENT`, multicast group 1: events
//!   sent by the kernel only): any `pci`, `infiniband` or `infiniband_verbs`
//!   event (add, remove, bind, unbind, change) schedules a rescan after a
//!   short settle delay, because one hot-plug emits a burst of events
//!   (function, driver bind, RDMA device, verbs device);
//! - a periodic rescan (`--rescan-interval`, default 60 s) as the fallback
//!   for lost events (socket buffer overrun), a pod without the socket, or
//!   sysfs mounted from elsewhere (fixtures).
//!
//! A rescan reads a few files per PCI function (see `benches/rescan.rs` for
//! its measured cost) and sends on the watch channel only when the device
//! list differs from the last one sent, so the publisher writes nothing in
//! steady state. An EFA that is present but unusable is logged once when it
//! becomes unusable (not on every rescan) and counted in the metrics.
//!
//! Limits: uevents reach a pod's network namespace only if it is owned by
//! the initial user namespace (true for ordinary pods, not for user-namespaced
//! ones); the periodic rescan covers that case.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::Device;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::{mpsc, watch};
use topology::{PciAddress, SysfsRoot};

use crate::attributes;
use crate::discovery::{self, DiscoveryError, UnusableReason};

/// Default period of the fallback rescan.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// How long to wait after a uevent for the rest of its burst.
pub const UEVENT_SETTLE: Duration = Duration::from_millis(250);
/// Subsystems whose events can change the EFA set.
pub const RELEVANT_SUBSYSTEMS: &[&str] = &["pci", "infiniband", "infiniband_verbs"];

/// The driver's own metrics.
#[derive(Debug, Clone)]
pub struct EfaMetrics {
    /// Usable EFAs currently published.
    pub devices: IntGauge,
    /// EFAs present but not published, by reason.
    pub unusable: IntGaugeVec,
    /// EFAs that became unusable, by reason (counted once per transition).
    pub unusable_total: IntCounterVec,
    /// Rescans, by trigger (`start`, `uevent`, `interval`).
    pub rescans_total: IntCounterVec,
    /// Duration of whole rescans.
    pub rescan_seconds: Histogram,
}

impl EfaMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = EfaMetrics {
            devices: IntGauge::new("efa_driver_devices", "Usable EFAs currently published")?,
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
            rescans_total: IntCounterVec::new(
                Opts::new("efa_driver_rescans_total", "sysfs rescans, by trigger"),
                &["trigger"],
            )?,
            rescan_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "efa_driver_rescan_duration_seconds",
                    "Duration of a whole sysfs rescan",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0]),
            )?,
        };
        registry.register(Box::new(m.devices.clone()))?;
        registry.register(Box::new(m.unusable.clone()))?;
        registry.register(Box::new(m.unusable_total.clone()))?;
        registry.register(Box::new(m.rescans_total.clone()))?;
        registry.register(Box::new(m.rescan_seconds.clone()))?;
        Ok(m)
    }
}

/// What caused a rescan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Start,
    Uevent,
    Interval,
}

impl Trigger {
    fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Uevent => "uevent",
            Trigger::Interval => "interval",
        }
    }
}

/// The last published device list and what was already warned about.
#[derive(Debug)]
pub struct Inventory {
    root: SysfsRoot,
    last: Option<Vec<Device>>,
    unusable: BTreeMap<PciAddress, UnusableReason>,
    metrics: Option<EfaMetrics>,
}

impl Inventory {
    pub fn new(root: SysfsRoot, metrics: Option<EfaMetrics>) -> Self {
        Inventory {
            root,
            last: None,
            unusable: BTreeMap::new(),
            metrics,
        }
    }

    /// Scans sysfs; `Some(devices)` when the set differs from the last one
    /// returned (always on the first call), `None` when nothing changed.
    pub fn rescan(&mut self, trigger: Trigger) -> Result<Option<Vec<Device>>, DiscoveryError> {
        let started = Instant::now();
        let found = discovery::discover(&self.root)?;
        self.note_unusable(&found.unusable);
        let devices = attributes::devices(&found);
        if let Some(m) = &self.metrics {
            m.rescans_total.with_label_values(&[trigger.label()]).inc();
            m.rescan_seconds.observe(started.elapsed().as_secs_f64());
            m.devices.set(devices.len() as i64);
        }
        if self.last.as_ref() == Some(&devices) {
            return Ok(None);
        }
        tracing::info!(
            devices = devices.len(),
            trigger = trigger.label(),
            "EFA device set changed"
        );
        self.last = Some(devices.clone());
        Ok(Some(devices))
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

/// How the watcher runs.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub rescan_interval: Duration,
    pub settle: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            rescan_interval: DEFAULT_RESCAN_INTERVAL,
            settle: UEVENT_SETTLE,
        }
    }
}

/// Rescans on every trigger and on the interval, sending changed device sets
/// on `tx`. Returns when every receiver of `tx` is gone. A failing rescan
/// keeps the last published set (a transient sysfs problem must not
/// unpublish healthy devices).
pub async fn watch_devices(
    mut inventory: Inventory,
    tx: watch::Sender<Vec<Device>>,
    mut triggers: mpsc::Receiver<Trigger>,
    config: WatchConfig,
) {
    let mut interval = tokio::time::interval(config.rescan_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await; // the first tick is immediate; the caller already scanned
    let mut events_open = true;
    loop {
        let trigger = tokio::select! {
            _ = tx.closed() => return,
            _ = interval.tick() => Trigger::Interval,
            t = triggers.recv(), if events_open => match t {
                Some(t) => {
                    // Let the rest of the burst arrive, then drain it.
                    tokio::time::sleep(config.settle).await;
                    while triggers.try_recv().is_ok() {}
                    t
                }
                None => {
                    events_open = false;
                    continue;
                }
            },
        };
        match inventory.rescan(trigger) {
            Ok(Some(devices)) => {
                if tx.send(devices).is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "EFA rescan failed; keeping the published set"),
        }
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
