//! The one rescan loop: keeps the published devices and their health in
//! step with the hardware, for every driver.
//!
//! Two triggers feed one rescan:
//! - kernel uevents of the subsystems the inventory names
//!   ([`DeviceInventory::UEVENT_SUBSYSTEMS`]), after a short settle delay
//!   ([`UEVENT_SETTLE`]), because one hot-plug emits a burst of events
//!   (function, driver bind, class devices);
//! - a periodic rescan (`--rescan-interval`, default
//!   [`DEFAULT_RESCAN_INTERVAL`]) as the fallback for lost events (socket
//!   overrun), a pod that cannot open the uevent socket, sysfs mounted from
//!   elsewhere (fixtures), and for health signals that only a read shows
//!   (error counters send no uevent).
//!
//! The loop runs on a thread of its own, which scans too (sysfs reads and
//! ioctls block; see `serve` for why not on the async runtime). The
//! device list goes to the publisher only when it differs from the last one
//! sent, so steady state writes nothing. Health goes to kubelet's health
//! stream when a device's state or message changed, and otherwise once
//! half the health-check timeout has passed since the last report, with a
//! fresh timestamp: kubelet turns a device Unknown when it hears nothing of
//! it for that timeout. (Sending on every scan cost a gRPC message to
//! kubelet and a wake-up of the claim status writer each time, for nothing
//! new.) A scan
//! that fails keeps the devices published last: a transient sysfs problem
//! must not unpublish healthy devices.
//!
//! Health also becomes device taints here ([`crate::scan::taints`]): the device
//! list sent to the publisher carries them, so a health change is a device
//! change, published like any other. Each change of a condition is logged
//! once at WARN and counted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::resource::v1::Device;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::{mpsc, watch};

use crate::daemon::node_driver::NodeDriver;
use crate::kubelet::health::{DeviceHealthStatus, HealthState};
use crate::publish::PoolContent;
use crate::scan::inventory::{DeviceInventory, ScannedDevice, Severity};
use crate::scan::taints::{TaintBook, Transition};
use crate::scan::uevent::{UeventSocket, forward_uevents};

/// Default period of the fallback rescan, the same for every driver.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(10);
/// How long to wait after a uevent for the rest of its burst.
pub(crate) const UEVENT_SETTLE: Duration = Duration::from_millis(250);

/// What caused a rescan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum Trigger {
    Start,
    Uevent,
    Interval,
}

impl Trigger {
    /// The `trigger` label of the rescan metric.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Uevent => "uevent",
            Trigger::Interval => "interval",
        }
    }
}

/// Metrics of the rescans, named after the binary (`aws_dra_efa_devices`,
/// `aws_dra_neuron_rescans_total`, ...).
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct RescanMetrics {
    /// Devices currently published.
    pub devices: IntGauge,
    /// Successful rescans, by trigger.
    pub rescans_total: IntCounterVec,
    /// Duration of whole rescans.
    pub rescan_seconds: Histogram,
    /// Published devices by health state (`healthy`, `degraded`, `unhealthy`).
    pub devices_by_health: IntGaugeVec,
    /// Changes of a device's condition (appeared, changed, cleared), by dimension.
    pub health_transitions: IntCounterVec,
}

impl RescanMetrics {
    /// Creates the metrics `<prefix>_devices`, `<prefix>_rescans_total` and
    /// `<prefix>_rescan_duration_seconds` and registers them in `registry`.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn register(registry: &Registry, prefix: &str) -> Result<Self, prometheus::Error> {
        let m = RescanMetrics {
            devices: IntGauge::new(
                format!("{prefix}_devices"),
                "Usable devices currently published",
            )?,
            rescans_total: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_rescans_total"),
                    "sysfs rescans, by trigger",
                ),
                &["trigger"],
            )?,
            rescan_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    format!("{prefix}_rescan_duration_seconds"),
                    "Duration of a whole sysfs rescan",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0]),
            )?,
            devices_by_health: IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_devices_by_health"),
                    "Published devices by health state (healthy, degraded, unhealthy)",
                ),
                &["state"],
            )?,
            health_transitions: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_health_transitions_total"),
                    "Device health condition changes (appeared, changed, cleared), by dimension",
                ),
                &["dimension"],
            )?,
        };
        registry.register(Box::new(m.devices.clone()))?;
        registry.register(Box::new(m.rescans_total.clone()))?;
        registry.register(Box::new(m.rescan_seconds.clone()))?;
        registry.register(Box::new(m.devices_by_health.clone()))?;
        registry.register(Box::new(m.health_transitions.clone()))?;
        Ok(m)
    }
}

/// How the loop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct RescanConfig {
    pub interval: Duration,
    pub settle: Duration,
}

impl Default for RescanConfig {
    fn default() -> Self {
        RescanConfig {
            interval: DEFAULT_RESCAN_INTERVAL,
            settle: UEVENT_SETTLE,
        }
    }
}

impl RescanConfig {
    /// The health-check timeout told to kubelet: six rescans, and never
    /// less than 60 s. Unchanged health is reported again after half of it
    /// ([`refresh_due`]), so two scans in a row may fail (or a scan may take
    /// two intervals) before kubelet turns the devices Unknown; a driver
    /// that hangs is seen within a minute at the default interval.
    pub(crate) fn health_timeout(&self) -> Duration {
        (self.interval * 6).max(Duration::from_secs(60))
    }
}

/// A rescan did not produce a device list.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum RescanError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Scan(E),
    #[error("the scan thread failed: {0}")]
    Thread(#[from] tokio::task::JoinError),
}

/// The receiving ends: what the publisher and the health stream read.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct DeviceFeeds {
    pub devices: watch::Receiver<PoolContent>,
    pub health: watch::Receiver<Vec<DeviceHealthStatus>>,
    /// The Node labels the last scan calls for (`publish::node_labels`).
    pub node_labels: watch::Receiver<crate::publish::node_labels::NodeLabels>,
}

/// Scans an inventory and sends what changed.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct Rescanner<I> {
    inventory: Arc<Mutex<I>>,
    pool: String,
    devices: watch::Sender<PoolContent>,
    health: watch::Sender<Vec<DeviceHealthStatus>>,
    node_labels: watch::Sender<crate::publish::node_labels::NodeLabels>,
    health_timeout: Option<Duration>,
    metrics: Option<RescanMetrics>,
    taints: Mutex<TaintBook>,
    /// The devices of the content last sent on `devices`, as the scan
    /// shared them: a scan that hands out these same `Arc`s (and the same
    /// counter sets) found the content unchanged, with no copy or compare
    /// of a device (see [`ScannedDevice`]).
    sent: Mutex<Vec<Arc<Device>>>,
}

/// Which pool the devices are published in: `driver` prefixes the taint
/// keys, `pool` (the node name) names the devices in the health stream.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PoolId<'a> {
    pub driver: &'a str,
    pub pool: &'a str,
}

/// The health state label of a device's conditions.
fn state_label(health: &crate::scan::inventory::DeviceHealth) -> &'static str {
    match health.state() {
        HealthState::Unhealthy => "unhealthy",
        _ if health
            .conditions
            .iter()
            .any(|c| c.severity == Severity::Degraded) =>
        {
            "degraded"
        }
        _ => "healthy",
    }
}

/// Scans once, synchronously, and sets the taints (what `discover` prints).
pub(crate) fn scan_with_taints<I: DeviceInventory>(
    inventory: &mut I,
    driver: &str,
) -> Result<PoolContent, I::Error> {
    let mut scanned = inventory.scan()?;
    let transitions =
        TaintBook::new(driver).apply(&mut scanned, k8s_openapi::jiff::Timestamp::now());
    transitions.iter().for_each(Transition::log);
    Ok(PoolContent {
        devices: scanned
            .into_iter()
            .map(|s| Arc::unwrap_or_clone(s.device))
            .collect(),
        counter_sets: inventory.counter_sets(),
    })
}

/// What one scan of the inventory found.
struct Scan {
    scanned: Vec<ScannedDevice>,
    counter_sets: Vec<k8s_openapi::api::resource::v1::CounterSet>,
    node_labels: crate::publish::node_labels::NodeLabels,
}

/// Scans `inventory` on the calling thread (sysfs reads block).
fn scan_inventory<I: DeviceInventory>(inventory: &Mutex<I>) -> Result<Scan, I::Error> {
    let mut inventory = inventory.lock().unwrap_or_else(|e| e.into_inner());
    let scanned = inventory.scan()?;
    Ok(Scan {
        scanned,
        counter_sets: inventory.counter_sets(),
        node_labels: inventory.node_labels(),
    })
}

impl<I: NodeDriver> Rescanner<I> {
    /// The inventory's driver.
    pub(crate) fn driver(&self) -> I::Driver {
        self.lock().driver()
    }
}

impl<I: DeviceInventory> Rescanner<I> {
    /// `id` names the pool; the feeds start empty and the first
    /// [`Self::rescan`] fills them.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new(
        inventory: I,
        id: PoolId<'_>,
        health_timeout: Option<Duration>,
        metrics: Option<RescanMetrics>,
    ) -> (Self, DeviceFeeds) {
        let (devices, devices_rx) = watch::channel(PoolContent::default());
        let (health, health_rx) = watch::channel(Vec::new());
        let (node_labels, node_labels_rx) = watch::channel(Default::default());
        let rescanner = Rescanner {
            inventory: Arc::new(Mutex::new(inventory)),
            pool: id.pool.to_owned(),
            devices,
            health,
            node_labels,
            health_timeout,
            metrics,
            taints: Mutex::new(TaintBook::new(id.driver)),
            sent: Mutex::new(Vec::new()),
        };
        let feeds = DeviceFeeds {
            devices: devices_rx,
            health: health_rx,
            node_labels: node_labels_rx,
        };
        (rescanner, feeds)
    }

    /// Hands the inventory what only the API server knows (the Node's
    /// labels, what the API accepts); the next [`Self::rescan`] uses it.
    pub(crate) fn set_cluster_facts(
        &self,
        node_labels: &std::collections::BTreeMap<String, String>,
        support: &crate::scan::inventory::ApiSupport,
    ) {
        let mut inventory = self.lock();
        inventory.set_node_labels(node_labels);
        inventory.set_api_support(support);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, I> {
        // A poisoned lock means a scan panicked; the inventory holds only
        // caches that the next scan rebuilds.
        self.inventory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scans once on a blocking thread and sends the result; `Ok(true)` when
    /// the device list changed (always on the first scan that finds a
    /// device).
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub async fn rescan(&self, trigger: Trigger) -> Result<bool, RescanError<I::Error>> {
        let started = Instant::now();
        let inventory = self.inventory.clone();
        let scan = tokio::task::spawn_blocking(move || scan_inventory(&inventory))
            .await?
            .map_err(RescanError::Scan)?;
        Ok(self.publish(trigger, started, scan))
    }

    /// [`Self::rescan`] on the calling thread (the rescan thread's; the
    /// drivers' rescan benchmarks time it).
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn rescan_here(&self, trigger: Trigger) -> Result<bool, I::Error> {
        let started = Instant::now();
        let scan = scan_inventory(&self.inventory)?;
        Ok(self.publish(trigger, started, scan))
    }

    /// Sends what a scan found where it changed: the taints it sets, the
    /// health report, the device list, the Node labels; `true` when the
    /// device list changed.
    fn publish(&self, trigger: Trigger, started: Instant, scan: Scan) -> bool {
        let Scan {
            mut scanned,
            counter_sets,
            node_labels,
        } = scan;
        self.node_labels.send_if_modified(|current| {
            let changed = *current != node_labels;
            *current = node_labels;
            changed
        });
        if let Some(m) = &self.metrics {
            m.rescans_total.with_label_values(&[trigger.label()]).inc();
            m.rescan_seconds.observe(started.elapsed().as_secs_f64());
            m.devices
                .set(i64::try_from(scanned.len()).unwrap_or(i64::MAX));
            // Every state is exported, 0 included, so a dashboard can plot
            // unhealthy devices before the first one breaks; counted first,
            // then three gauges set (not one update per device per scan).
            for state in HEALTH_STATES {
                let n = scanned
                    .iter()
                    .filter(|s| state_label(&s.health) == state)
                    .count();
                m.devices_by_health
                    .with_label_values(&[state])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        let transitions = self
            .taints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apply(&mut scanned, k8s_openapi::jiff::Timestamp::now());
        for t in &transitions {
            t.log();
            if let Some(m) = &self.metrics {
                m.health_transitions
                    .with_label_values(&[&t.dimension])
                    .inc();
            }
        }
        let timeout = self.health_timeout.unwrap_or(KUBELET_HEALTH_TIMEOUT);
        self.health.send_if_modified(|sent| {
            // Compared with the scan as it is; the report is built only
            // when it goes.
            let send = !self.reports_the_same(sent, &scanned) || refresh_due(sent, timeout);
            if send {
                *sent = self.health_statuses(&scanned);
            }
            send
        });
        // The devices are compared with those last sent, by pointer first:
        // at rest an inventory that keeps its devices hands out the very
        // ones sent, and nothing is copied or compared field by field.
        let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        let same_devices = sent.len() == scanned.len()
            && sent
                .iter()
                .zip(&scanned)
                .all(|(a, s)| Arc::ptr_eq(a, &s.device) || **a == *s.device);
        sent.clear();
        sent.extend(scanned.iter().map(|s| s.device.clone()));
        drop(sent);
        if same_devices && self.devices.borrow().counter_sets == counter_sets {
            return false;
        }
        let content = PoolContent {
            devices: scanned
                .into_iter()
                .map(|s| Arc::unwrap_or_clone(s.device))
                .collect(),
            counter_sets,
        };
        // `sent` holds what `devices` holds, so past the compare above the
        // content has changed.
        self.devices.send_modify(|current| {
            tracing::info!(
                before = current.devices.len(),
                after = content.devices.len(),
                counter_sets = content.counter_sets.len(),
                trigger = trigger.label(),
                "device set changed"
            );
            *current = content;
        });
        true
    }

    /// Does report `sent` say of the same devices what `scanned` would
    /// (timestamps aside)?
    fn reports_the_same(&self, sent: &[DeviceHealthStatus], scanned: &[ScannedDevice]) -> bool {
        sent.len() == scanned.len()
            && sent.iter().zip(scanned).all(|(r, s)| {
                r.pool == self.pool
                    && r.device == s.device.name
                    && r.state == s.health.state()
                    && r.health_check_timeout == self.health_timeout
                    && r.message == s.health.message()
            })
    }

    fn health_statuses(&self, scanned: &[ScannedDevice]) -> Vec<DeviceHealthStatus> {
        let now = SystemTime::now();
        scanned
            .iter()
            .map(|s| DeviceHealthStatus {
                pool: self.pool.clone(),
                device: s.device.name.clone(),
                state: s.health.state(),
                last_updated: now,
                message: s.health.message(),
                health_check_timeout: self.health_timeout,
            })
            .collect()
    }
}

/// The states of `<prefix>_devices_by_health`.
const HEALTH_STATES: [&str; 3] = ["healthy", "degraded", "unhealthy"];

/// Kubelet's health-check timeout for a device reported without one.
const KUBELET_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// Is the last report `sent` half `timeout` old (or older), so that kubelet
/// must hear of the devices again before it turns them Unknown?
fn refresh_due(sent: &[DeviceHealthStatus], timeout: Duration) -> bool {
    sent.iter()
        .map(|s| s.last_updated)
        .min()
        .is_some_and(|oldest| {
            SystemTime::now()
                .duration_since(oldest)
                .is_ok_and(|age| age >= timeout / 2)
        })
}

/// Opens the kernel uevent socket and forwards the events of `subsystems`
/// to `triggers` as [`Trigger::Uevent`]. Without the socket (a
/// user-namespaced pod) it warns: the periodic rescan is then all there is.
pub(crate) fn forward_kernel_uevents(
    subsystems: &'static [&'static str],
    triggers: mpsc::Sender<Trigger>,
) {
    match UeventSocket::open() {
        Ok(socket) => {
            tokio::spawn(async move {
                forward_uevents(socket, subsystems, triggers, Trigger::Uevent).await
            });
        }
        Err(error) => tracing::warn!(
            %error,
            "no kernel uevents; device changes are seen by the periodic rescan only"
        ),
    }
}

mod serve;

#[cfg(test)]
mod tests;
