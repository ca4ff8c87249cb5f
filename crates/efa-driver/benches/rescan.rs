//! Cost of one whole rescan (what the hot-plug fallback runs periodically)
//! on the p5.48xlarge fixture: 32 EFAs, 8 GPUs, ~120 PCI functions.
//! A plain timing harness: `cargo bench -p efa-driver --bench rescan`.
//!
//! Rescans back to back find the CPU caches warm; a driver at rest rescans
//! once every 10 s and finds them cold. `RESCAN_BENCH_COLD=1` evicts them
//! between rescans (64 MiB written, then 5 ms asleep), which is closer to
//! what an idle node pays per rescan.

use std::time::{Duration, Instant};

use dra_core::{DeviceInventory, HostPaths};
use efa_driver::EfaInventory;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).expect("fixture");
    let host = HostPaths {
        sysfs_root: fixture.sys.clone(),
        dev_root: fixture.dev.clone(),
    };
    let mut inventory = EfaInventory::new(&host, None);
    let first = inventory.scan().expect("scan");
    assert_eq!(first.len(), 32);
    for _ in 0..20 {
        inventory.scan().expect("warm-up");
    }
    let cold = std::env::var_os("RESCAN_BENCH_COLD").is_some_and(|v| v == "1");
    let mut evict = vec![0u8; if cold { 64 << 20 } else { 0 }];
    let runs = 500u32;
    let mut samples: Vec<Duration> = Vec::with_capacity(runs as usize);
    for i in 0..runs {
        if cold {
            evict
                .iter_mut()
                .step_by(64)
                .for_each(|b| *b = b.wrapping_add(i as u8));
            std::hint::black_box(&evict);
            std::thread::sleep(Duration::from_millis(5));
        }
        let t = Instant::now();
        let again = inventory.scan().expect("scan");
        samples.push(t.elapsed());
        assert!(again == first, "steady state must find the same devices");
    }
    samples.sort();
    let total: Duration = samples.iter().sum();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    println!(
        "rescan p5.48xlarge (32 EFAs{}): runs={runs} mean={:?} p50={:?} p90={:?} p99={:?} max={:?}",
        if cold {
            ", caches evicted between rescans"
        } else {
            ""
        },
        total / runs,
        pct(50),
        pct(90),
        pct(99),
        samples[samples.len() - 1]
    );
}
