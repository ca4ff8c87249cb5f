//! Cost of one whole rescan of the trn2.48xlarge fixture (16 chips of 8
//! NeuronCores), NeuronCore partitions published (144 devices) and not (16):
//! `cargo bench -p neuron-driver --bench rescan`. A plain timing harness;
//! `RESCAN_BENCH_COLD=1` evicts the CPU caches between rescans (the loop
//! is `dra_core::testing::rescan_bench`, shared with `efa-driver`'s).

use dra_core::testing::rescan_bench::bench_rescans;
use dra_core::{DeviceInventory, HostPaths};
use neuron_driver::NeuronInventory;
use neuron_driver::bdf::StaticBdf;
use neuron_driver::partitions::PartitionMode;
use topology::PciAddress;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = sysfs_fixtures::generate("trn2.48xlarge", dir.path()).expect("fixture");
    let host = HostPaths {
        sysfs_root: fixture.sys.clone(),
        dev_root: fixture.dev.clone(),
    };
    let bdf = StaticBdf {
        answers: fixture
            .neuron_chips
            .iter()
            .map(|c| {
                (
                    fixture.dev.join(format!("neuron{}", c.index)),
                    Ok(c.bdf.parse::<PciAddress>().expect("fixture BDF")),
                )
            })
            .collect(),
    };
    for (mode, expected) in [(PartitionMode::Cores, 144), (PartitionMode::Chips, 16)] {
        let mut inventory = NeuronInventory::new(&host, Box::new(bdf.clone())).with_mode(mode);
        let first = inventory.scan().expect("scan");
        assert_eq!(first.len(), expected, "{mode}");
        let label = format!("trn2.48xlarge ({mode}, {expected} devices)");
        bench_rescans(&label, 300, &first, || inventory.scan().expect("scan"));
    }
}
