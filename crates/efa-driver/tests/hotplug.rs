//! Hot-plug: fixture mutations while dra-core's rescan loop runs the EFA
//! inventory change the published set; a steady state sends nothing.

use std::time::Duration;

use dra_core::HostPaths;
use dra_core::testing::{PoolId, RescanConfig, RescanMetrics, Rescanner, Trigger};
use efa_driver::EfaInventory;
use efa_driver::attributes::device_name;
use efa_driver::inventory::EfaMetrics;
use k8s_openapi::api::resource::v1::Device;
use sysfs_fixtures::{Fixture, generate};
use tokio::sync::{mpsc, watch};
use topology::PciAddress;

fn host(f: &Fixture) -> HostPaths {
    HostPaths {
        sysfs_root: f.sys.clone(),
        dev_root: f.dev.clone(),
    }
}

fn names(devices: &[Device]) -> Vec<String> {
    devices.iter().map(|d| d.name.clone()).collect()
}

fn name(f: &Fixture, i: usize) -> String {
    device_name(f.efas[i].bdf.parse::<PciAddress>().unwrap())
}

/// The devices tainted `device-lost`, with the taint's value, sorted by
/// value then name.
fn lost(rx: &watch::Receiver<dra_core::testing::PoolContent>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = rx
        .borrow()
        .iter()
        .flat_map(|d| {
            d.taints
                .iter()
                .flatten()
                .filter(|t| {
                    t.key == "efa.networking.k8s.aws/device-lost" && t.effect == "NoSchedule"
                })
                .map(|t| (d.name.clone(), t.value.clone().unwrap_or_default()))
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    out
}

async fn next(rx: &mut watch::Receiver<dra_core::testing::PoolContent>) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("watcher reported the change in time")
        .expect("watcher alive");
    names(&rx.borrow_and_update())
}

/// The rescan loop runs on a thread of its own, so a scan can land in the
/// middle of a fixture change (several file operations: an EFA removed is
/// first unbound). Each change is therefore followed by a trigger, as the
/// kernel's uevents follow a real one, with the interval out of the way;
/// the interval itself is `dra-core`'s `the_interval_rescans_without_events`.
#[tokio::test]
async fn periodic_rescan_follows_add_remove_unbind() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("p5.48xlarge", dir.path()).unwrap();
    let registry = prometheus::Registry::new();
    let metrics = EfaMetrics::register(&registry).unwrap();
    let rescans = RescanMetrics::register(&registry, "aws_dra_efa").unwrap();
    let inv = EfaInventory::new(&host(&f), Some(metrics.clone()));
    let (rescanner, feeds) = Rescanner::new(
        inv,
        PoolId {
            driver: "efa.networking.k8s.aws",
            pool: "node",
        },
        None,
        Some(rescans.clone()),
    );
    assert!(rescanner.rescan(Trigger::Start).await.unwrap());
    assert_eq!(feeds.devices.borrow().len(), 32);
    assert!(
        !rescanner.rescan(Trigger::Interval).await.unwrap(),
        "no change, no send"
    );
    let mut rx = feeds.devices.clone();
    rx.mark_unchanged();
    let (trigger_tx, trigger_rx) = mpsc::channel(1);
    let config = RescanConfig {
        interval: Duration::from_secs(3600),
        settle: Duration::from_millis(10),
    };
    let task = tokio::spawn(rescanner.run(trigger_rx, config));
    drop(feeds);
    let rescan = || async {
        trigger_tx.send(Trigger::Uevent).await.unwrap();
    };

    // A published EFA that vanishes or is unbound stays published, tainted
    // device-lost: EC2 does not detach EFAs from running instances.
    f.remove_efa(&f.efas[3].bdf).unwrap();
    rescan().await;
    let got = next(&mut rx).await;
    assert_eq!(got.len(), 32);
    assert_eq!(lost(&rx), vec![(name(&f, 3), "vanished".to_string())]);

    f.unbind_driver(&f.efas[10].bdf).unwrap();
    rescan().await;
    let got = next(&mut rx).await;
    assert_eq!(got.len(), 32);
    assert_eq!(
        lost(&rx),
        vec![
            (name(&f, 10), "unbound".to_string()),
            (name(&f, 3), "vanished".to_string())
        ]
    );
    assert_eq!(
        metrics
            .unusable
            .with_label_values(&["driver_not_bound"])
            .get(),
        1
    );

    f.bind_driver(&f.efas[10].bdf).unwrap();
    f.add_efa(&f.efas[3].bdf).unwrap();
    rescan().await;
    // Both may land in one rescan or two; wait until neither is lost.
    next(&mut rx).await;
    while !lost(&rx).is_empty() {
        next(&mut rx).await;
    }
    let got = names(&rx.borrow());
    assert!(got.contains(&name(&f, 3)) && got.contains(&name(&f, 10)));
    assert_eq!(rescans.devices.get(), 32);
    assert_eq!(
        metrics
            .unusable_total
            .with_label_values(&["driver_not_bound"])
            .get(),
        1,
        "warned and counted once, not on every rescan"
    );

    // Steady state: rescans without a send.
    let scans = |r: &RescanMetrics| r.rescans_total.with_label_values(&["uevent"]).get();
    for _ in 0..5 {
        let before = scans(&rescans);
        rescan().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while scans(&rescans) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "the trigger rescanned"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The thread sends after it counts: give the last scan's send (were
    // there one) time to land; the earlier ones came before the next count.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!rx.has_changed().unwrap(), "nothing changed, nothing sent");
    assert_eq!(
        metrics
            .unusable_total
            .with_label_values(&["driver_not_bound"])
            .get(),
        1,
        "still counted once after more rescans"
    );

    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("watcher stops when the receiver is gone")
        .unwrap();
}

#[tokio::test]
async fn a_uevent_trigger_rescans_without_waiting_for_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("trn2.48xlarge", dir.path()).unwrap();
    let (rescanner, feeds) = Rescanner::new(
        EfaInventory::new(&host(&f), None),
        PoolId {
            driver: "efa.networking.k8s.aws",
            pool: "node",
        },
        None,
        None,
    );
    rescanner.rescan(Trigger::Start).await.unwrap();
    assert_eq!(feeds.devices.borrow().len(), 16);
    let mut rx = feeds.devices.clone();
    rx.mark_unchanged();
    let (trigger_tx, trigger_rx) = mpsc::channel(1);
    let config = RescanConfig {
        interval: Duration::from_secs(3600),
        settle: Duration::from_millis(20),
    };
    tokio::spawn(rescanner.run(trigger_rx, config));
    f.remove_efa(&f.efas[0].bdf).unwrap();
    trigger_tx.send(Trigger::Uevent).await.unwrap();
    let got = next(&mut rx).await;
    assert_eq!(got.len(), 16, "kept, tainted");
    assert_eq!(lost(&rx), vec![(name(&f, 0), "vanished".to_string())]);
}

#[tokio::test]
async fn uevent_socket_opens() {
    // The watcher's real event source: a kernel uevent netlink socket. Its
    // opening needs no privilege; a failure here would leave only rescans.
    dra_core::testing::UeventSocket::open().unwrap();
}
