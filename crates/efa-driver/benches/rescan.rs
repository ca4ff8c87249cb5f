//! Cost of one whole rescan (what the hot-plug fallback runs periodically)
//! on the p5.48xlarge fixture: 32 EFAs, 8 GPUs, ~120 PCI functions.
//! A plain timing harness: `cargo bench -p efa-driver --bench rescan`.

use std::time::{Duration, Instant};

use efa_driver::hotplug::{Inventory, Trigger};
use topology::SysfsRoot;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).expect("fixture");
    let mut inventory = Inventory::new(SysfsRoot::new(&fixture.sys), None);
    let first = inventory
        .rescan(Trigger::Start)
        .expect("scan")
        .expect("first scan reports");
    assert_eq!(first.len(), 32);
    for _ in 0..20 {
        inventory.rescan(Trigger::Interval).expect("warm-up");
    }
    let runs = 500u32;
    let mut samples: Vec<Duration> = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        let t = Instant::now();
        let changed = inventory.rescan(Trigger::Interval).expect("scan");
        samples.push(t.elapsed());
        assert!(changed.is_none(), "steady state must report no change");
    }
    samples.sort();
    let total: Duration = samples.iter().sum();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "rescan p5.48xlarge (32 EFAs): runs={runs} mean={:?} p50={:?} p90={:?} p99={:?} max={:?}",
        total / runs,
        pct(50),
        pct(90),
        pct(99),
        samples[samples.len() - 1]
    );
}
