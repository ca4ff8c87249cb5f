use super::*;
use crate::kubelet::health::HealthState;
use crate::scan::inventory::{DeviceHealth, HealthCondition, HostPaths};
use k8s_openapi::api::resource::v1::Device;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fake inventory: the test sets what the next scan finds, or that it
/// fails, and counts the scans.
#[derive(Clone)]
struct Hardware {
    state: Arc<Mutex<Result<Vec<ScannedDevice>, String>>>,
    scans: Arc<AtomicUsize>,
    /// Scans left that panic.
    panics: Arc<AtomicUsize>,
}

impl Default for Hardware {
    fn default() -> Self {
        Hardware {
            state: Arc::new(Mutex::new(Ok(Vec::new()))),
            scans: Arc::default(),
            panics: Arc::default(),
        }
    }
}

impl Hardware {
    fn set(&self, names: &[&str]) {
        *self.state.lock().unwrap() = Ok(names
            .iter()
            .map(|n| {
                ScannedDevice::healthy(Device {
                    name: n.to_string(),
                    ..Default::default()
                })
            })
            .collect());
    }
    fn set_health(&self, name: &str, health: DeviceHealth) {
        if let Ok(list) = &mut *self.state.lock().unwrap() {
            for s in list.iter_mut().filter(|s| s.device.name == name) {
                s.health = health.clone();
            }
        }
    }
    fn fail(&self) {
        *self.state.lock().unwrap() = Err("sysfs gone".into());
    }
    fn scans(&self) -> usize {
        self.scans.load(Ordering::SeqCst)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ScanFailed(String);

struct NullDriver;
impl crate::Driver for NullDriver {
    type Config = NoConfig;
    async fn prepare(
        &self,
        _: &crate::ClaimRef,
        _: &[crate::AllocatedDevice<NoConfig>],
    ) -> Result<Vec<crate::DeviceEdits>, crate::DriverError> {
        Ok(vec![])
    }
}
#[derive(Debug, Clone, serde::Deserialize)]
struct NoConfig {}
impl crate::DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["x/v1"];
    const KIND: &'static str = "X";
}

impl DeviceInventory for Hardware {
    type Flags = crate::daemon::cli::NoExtraArgs;
    type Error = ScanFailed;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = &["pci"];
    fn open(_: &HostPaths, _: &Self::Flags, _: &Registry) -> Result<Self, ScanFailed> {
        Ok(Hardware::default())
    }
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, ScanFailed> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        if self
            .panics
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("a scan panics");
        }
        self.state.lock().unwrap().clone().map_err(ScanFailed)
    }
}

impl crate::daemon::node_driver::NodeDriver for Hardware {
    type Driver = NullDriver;

    fn driver(&self) -> NullDriver {
        NullDriver
    }
}

/// A rescanner of `hw` for pool `pool` of `test.example.com`.
fn rescanner_of(
    hw: &Hardware,
    pool: &str,
    health_timeout: Option<Duration>,
    metrics: Option<RescanMetrics>,
) -> (Rescanner<Hardware>, DeviceFeeds) {
    Rescanner::new(
        hw.clone(),
        PoolId {
            driver: "test.example.com",
            pool,
        },
        health_timeout,
        metrics,
    )
}

fn names(rx: &watch::Receiver<PoolContent>) -> Vec<String> {
    rx.borrow().iter().map(|d| d.name.clone()).collect()
}

#[tokio::test]
async fn sends_devices_only_when_they_change_and_keeps_them_on_failure() {
    let hw = Hardware::default();
    hw.set(&["a", "b"]);
    let registry = Registry::new();
    let metrics = RescanMetrics::register(&registry, "aws_dra_test").unwrap();
    let (rescanner, mut feeds) = rescanner_of(&hw, "node-1", None, Some(metrics.clone()));

    assert!(rescanner.rescan(Trigger::Start).await.unwrap());
    assert!(feeds.devices.has_changed().unwrap());
    feeds.devices.mark_unchanged();
    assert_eq!(names(&feeds.devices), ["a", "b"]);
    assert!(
        !rescanner.rescan(Trigger::Interval).await.unwrap(),
        "same set"
    );
    assert!(!feeds.devices.has_changed().unwrap(), "nothing sent");

    hw.fail();
    let err = rescanner.rescan(Trigger::Interval).await.unwrap_err();
    assert_eq!(err.to_string(), "sysfs gone");
    assert_eq!(names(&feeds.devices), ["a", "b"], "kept on failure");

    hw.set(&["b"]);
    assert!(rescanner.rescan(Trigger::Uevent).await.unwrap());
    assert_eq!(names(&feeds.devices), ["b"]);

    let count = |t: &str| metrics.rescans_total.with_label_values(&[t]).get();
    assert_eq!(
        (count("start"), count("interval"), count("uevent")),
        (1, 1, 1)
    );
    assert_eq!(metrics.devices.get(), 1);
    assert_eq!(metrics.rescan_seconds.get_sample_count(), 3);
    assert!(
        RescanMetrics::register(&registry, "aws_dra_test").is_err(),
        "duplicate names"
    );
}

/// The devices a scan shares with its inventory: the same ones at rest,
/// compared by pointer; a changed one sent; the inventory's own copy never
/// written (the taints go on the loop's copy).
#[tokio::test]
async fn shared_devices_are_sent_when_they_change_and_never_written() {
    let hw = Hardware::default();
    hw.set(&["a", "b"]);
    let (rescanner, mut feeds) = rescanner_of(&hw, "node-1", None, None);
    assert!(rescanner.rescan(Trigger::Start).await.unwrap());
    feeds.devices.mark_unchanged();
    let kept = |name: &str| -> Arc<Device> {
        let state = hw.state.lock().unwrap();
        let list = state.as_ref().unwrap();
        let found = list.iter().find(|s| s.device.name == name).unwrap();
        found.device.clone()
    };
    let a = kept("a");
    assert!(
        Arc::ptr_eq(&a, &rescanner.sent.lock().unwrap()[0]),
        "the loop keeps the inventory's device, not a copy"
    );

    // The same devices again, as new but equal values: nothing to send.
    hw.set(&["a", "b"]);
    assert!(!rescanner.rescan(Trigger::Interval).await.unwrap());
    assert!(!feeds.devices.has_changed().unwrap());

    // One device changed in a new value: sent, as it is now.
    let changed = Device {
        name: "b".into(),
        node_name: Some("moved".into()),
        ..Default::default()
    };
    if let Ok(list) = &mut *hw.state.lock().unwrap() {
        list[1].device = Arc::new(changed.clone());
    }
    assert!(rescanner.rescan(Trigger::Interval).await.unwrap());
    assert_eq!(feeds.devices.borrow_and_update().devices[1], changed);

    // A fatal condition taints the published device, not the inventory's.
    let broken = DeviceHealth {
        conditions: vec![HealthCondition {
            dimension: "link".into(),
            severity: Severity::Fatal,
            value: "down".into(),
        }],
    };
    hw.set_health("a", broken);
    assert!(rescanner.rescan(Trigger::Interval).await.unwrap());
    assert!(
        feeds.devices.borrow_and_update().devices[0]
            .taints
            .is_some()
    );
    assert_eq!(
        kept("a").taints,
        None,
        "the inventory's device is untouched"
    );
    assert!(
        !rescanner.rescan(Trigger::Interval).await.unwrap(),
        "still tainted"
    );

    // Healed: the taint goes, and the inventory's device is published again.
    hw.set_health("a", DeviceHealth::healthy());
    assert!(rescanner.rescan(Trigger::Interval).await.unwrap());
    assert_eq!(feeds.devices.borrow_and_update().devices[0].taints, None);
    assert!(Arc::ptr_eq(&kept("a"), &rescanner.sent.lock().unwrap()[0]));
}

#[tokio::test]
async fn health_follows_changes_and_is_refreshed_at_half_the_timeout() {
    let hw = Hardware::default();
    hw.set(&["a", "b"]);
    let timeout = Some(Duration::from_secs(30));
    let registry = Registry::new();
    let metrics = RescanMetrics::register(&registry, "aws_dra_test").unwrap();
    let (rescanner, mut feeds) = rescanner_of(&hw, "node-1", timeout, Some(metrics.clone()));
    rescanner.rescan(Trigger::Start).await.unwrap();
    let first = feeds.health.borrow_and_update().clone();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|s| s.pool == "node-1"
        && s.state == HealthState::Healthy
        && s.health_check_timeout == timeout));

    hw.set_health(
        "b",
        DeviceHealth {
            conditions: vec![HealthCondition {
                dimension: "admin-queue-closed".into(),
                severity: Severity::Fatal,
                value: "1".into(),
            }],
        },
    );
    assert!(
        rescanner.rescan(Trigger::Interval).await.unwrap(),
        "a new condition is a new taint: the devices changed"
    );
    let taints = feeds
        .devices
        .borrow()
        .iter()
        .find(|d| d.name == "b")
        .and_then(|d| d.taints.clone())
        .unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0].key, "test.example.com/admin-queue-closed");
    assert_eq!(taints[0].effect, "NoSchedule");
    assert!(
        !rescanner.rescan(Trigger::Interval).await.unwrap(),
        "the same condition again: nothing to publish"
    );
    assert!(
        feeds.health.has_changed().unwrap(),
        "a changed state is reported at once"
    );
    let b = feeds
        .health
        .borrow_and_update()
        .iter()
        .find(|s| s.device == "b")
        .cloned()
        .unwrap();
    assert_eq!(b.state, HealthState::Unhealthy);
    assert_eq!(b.message, "admin-queue-closed=1 (Fatal)");
    rescanner.rescan(Trigger::Interval).await.unwrap();
    assert!(
        !feeds.health.has_changed().unwrap(),
        "unchanged health is not sent again before half the timeout (15 s) passed"
    );
    let by_state = |s: &str| metrics.devices_by_health.with_label_values(&[s]).get();
    assert_eq!((by_state("healthy"), by_state("unhealthy")), (1, 1));
    assert_eq!(
        metrics
            .health_transitions
            .with_label_values(&["admin-queue-closed"])
            .get(),
        1,
        "counted once, not per scan"
    );
}

/// Kubelet turns a device Unknown when it hears nothing of it for the
/// health-check timeout: unchanged health is sent again, with a fresh
/// timestamp, once half of it has passed.
#[tokio::test]
async fn unchanged_health_is_refreshed_at_half_the_timeout() {
    let hw = Hardware::default();
    hw.set(&["a"]);
    let timeout = Duration::from_millis(400);
    let (rescanner, mut feeds) = rescanner_of(&hw, "n", Some(timeout), None);
    rescanner.rescan(Trigger::Start).await.unwrap();
    let first = feeds.health.borrow_and_update()[0].last_updated;
    rescanner.rescan(Trigger::Interval).await.unwrap();
    assert!(!feeds.health.has_changed().unwrap(), "sent 0 s ago: kept");
    tokio::time::sleep(timeout / 2).await;
    rescanner.rescan(Trigger::Interval).await.unwrap();
    assert!(
        feeds.health.has_changed().unwrap(),
        "half the timeout: sent"
    );
    let again = feeds.health.borrow_and_update()[0].clone();
    assert!(again.last_updated >= first + timeout / 2, "{again:?}");
    assert_eq!(again.state, HealthState::Healthy);
}

/// Hardware with one device, "a", and a rescanner of it (pool "n") that
/// has scanned once, as the daemon does before it starts the loop.
async fn scanned_once() -> (Hardware, Rescanner<Hardware>, DeviceFeeds) {
    let hw = Hardware::default();
    hw.set(&["a"]);
    let (rescanner, feeds) = rescanner_of(&hw, "n", None, None);
    rescanner.rescan(Trigger::Start).await.unwrap();
    (hw, rescanner, feeds)
}

/// A loop that rescans every 50 ms.
const EVERY_50_MS: RescanConfig = RescanConfig {
    interval: Duration::from_millis(50),
    settle: UEVENT_SETTLE,
};

#[tokio::test]
async fn the_loop_follows_interval_and_uevents_and_stops_with_its_receivers() {
    let (hw, rescanner, feeds) = scanned_once().await;
    let (trigger_tx, trigger_rx) = mpsc::channel(1);
    let config = RescanConfig {
        interval: Duration::from_secs(3600),
        settle: Duration::from_millis(20),
    };
    let task = tokio::spawn(rescanner.run(trigger_rx, config));
    let mut devices = feeds.devices.clone();

    // A uevent rescans long before the (one hour) interval.
    hw.set(&["a", "b"]);
    trigger_tx.send(Trigger::Uevent).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), devices.wait_for(|d| d.len() == 2))
        .await
        .expect("rescanned after the uevent")
        .unwrap();
    // A burst inside the settle delay gives one scan, not one per event.
    let before = hw.scans();
    for _ in 0..5 {
        let _ = trigger_tx.try_send(Trigger::Uevent);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        hw.scans() - before <= 2,
        "{} scans for a burst",
        hw.scans() - before
    );

    drop(devices);
    drop(feeds);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop stops when nobody reads the devices")
        .unwrap();
}

#[tokio::test]
async fn the_interval_rescans_without_events() {
    let (hw, rescanner, feeds) = scanned_once().await;
    let (_trigger_tx, trigger_rx) = mpsc::channel(1);
    let config = EVERY_50_MS;
    tokio::spawn(rescanner.run(trigger_rx, config));
    hw.set(&["a", "c"]);
    let mut devices = feeds.devices.clone();
    tokio::time::timeout(Duration::from_secs(10), devices.wait_for(|d| d.len() == 2))
        .await
        .expect("the interval rescanned")
        .unwrap();
}

/// The loop runs on a thread of its own: a scan that panics is one failed
/// rescan, and the next one publishes.
#[tokio::test]
async fn a_scan_that_panics_does_not_end_the_loop() {
    let (hw, rescanner, feeds) = scanned_once().await;
    let (_trigger_tx, trigger_rx) = mpsc::channel(1);
    let config = EVERY_50_MS;
    hw.panics.store(2, Ordering::SeqCst);
    let task = tokio::spawn(rescanner.run(trigger_rx, config));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hw.panics.load(Ordering::SeqCst) > 0 {
        assert!(std::time::Instant::now() < deadline, "no scan ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hw.set(&["a", "c"]);
    let mut devices = feeds.devices.clone();
    tokio::time::timeout(Duration::from_secs(10), devices.wait_for(|d| d.len() == 2))
        .await
        .expect("rescanned after two panics")
        .unwrap();
    assert!(!task.is_finished());
}

#[test]
fn health_timeout_covers_six_rescans_and_a_minute() {
    let t = |s| {
        RescanConfig {
            interval: Duration::from_secs(s),
            settle: UEVENT_SETTLE,
        }
        .health_timeout()
    };
    assert_eq!(t(10), Duration::from_secs(60));
    assert_eq!(t(1), Duration::from_secs(60));
    assert_eq!(t(60), Duration::from_secs(360));
}
