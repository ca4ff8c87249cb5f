//! Cost of one whole rescan (what the hot-plug fallback runs periodically)
//! on the p5.48xlarge fixture: 32 EFAs, 8 GPUs, ~120 PCI functions; the
//! inventory's scan alone, then the rescan thread's whole work (the scan
//! and what `dra-core` does with it).
//! A plain timing harness: `cargo bench -p efa-driver --bench rescan`;
//! `RESCAN_BENCH_COLD=1` evicts the CPU caches between rescans (the loop
//! is `dra_core::testing::rescan_bench`, shared with `neuron-driver`'s).

use dra_core::testing::rescan_bench::bench_rescans;
use dra_core::testing::{PoolId, Rescanner, Trigger};
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
    bench_rescans("p5.48xlarge (32 EFAs)", 500, &first, || {
        inventory.scan().expect("scan")
    });
    // The whole of what the rescan thread does at rest: the scan, then the
    // taints, the health report and the pool compared with what was sent.
    let (rescanner, _feeds) = Rescanner::new(
        EfaInventory::new(&host, None),
        PoolId {
            driver: efa_driver::DRIVER_NAME,
            pool: "node-1",
        },
        None,
        None,
    );
    assert!(rescanner.rescan_here(Trigger::Start).expect("scan"));
    bench_rescans(
        "p5.48xlarge (32 EFAs), scan and publish",
        500,
        &false,
        || rescanner.rescan_here(Trigger::Interval).expect("scan"),
    );
}
