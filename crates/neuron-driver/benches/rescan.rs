//! Cost of one whole rescan of the trn2.48xlarge fixture (16 chips of 8
//! NeuronCores), NeuronCore partitions published (144 devices) and not (16):
//! `cargo bench -p neuron-driver --bench rescan`. A plain timing harness,
//! as `efa-driver`'s; `RESCAN_BENCH_COLD=1` evicts the CPU caches between
//! rescans (64 MiB written, then 5 ms asleep), closer to what a driver at
//! rest pays every 10 s.

use std::time::{Duration, Instant};

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
    let cold = std::env::var_os("RESCAN_BENCH_COLD").is_some_and(|v| v == "1");
    for (mode, expected) in [(PartitionMode::Cores, 144), (PartitionMode::Chips, 16)] {
        let mut inventory = NeuronInventory::new(&host, Box::new(bdf.clone())).with_mode(mode);
        let first = inventory.scan().expect("scan");
        assert_eq!(first.len(), expected, "{mode}");
        for _ in 0..20 {
            inventory.scan().expect("warm-up");
        }
        let mut evict = vec![0u8; if cold { 64 << 20 } else { 0 }];
        let runs = 300u32;
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
            "rescan trn2.48xlarge ({mode}, {expected} devices{}): runs={runs} mean={:?} p50={:?} p99={:?} max={:?}",
            if cold {
                ", caches evicted between rescans"
            } else {
                ""
            },
            total / runs,
            pct(50),
            pct(99),
            samples[samples.len() - 1]
        );
    }
}
