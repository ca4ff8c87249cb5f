//! The Neuron kernel driver's sysfs files as discovery reads them: chip
//! entries (`neuronN` with `core_count` and `connected_devices`) and the
//! UltraServer class files, then every device, counter set and LNC range
//! derived from them. Whatever the files hold: never a panic (overflow
//! checks are on), chips with numbers out of range are skipped, and the
//! device count is bounded by the accepted chips and cores.
//!
//! Input: UTF-8 lines. Lines 1-5 are `ultraserver_mode`, `server_id_2`,
//! `server_id_4`, `node_id_2`, `node_id_4` (`-` for an absent file); each
//! further line is a chip, `N|core_count|connected_devices`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{
    BdfCache, MAX_CHIP_INDEX, MAX_CORES_PER_CHIP, NEURON_CLASS, discover,
};
use neuron_driver::lnc::{LogicalNeuronCore, logical_cores, range_list};
use neuron_driver::partitions::{self, PartitionMode};
use neuron_driver::ultraserver::UltraServer;
use topology::SysfsRoot;

const CLASS_FILES: [&str; 5] = [
    "ultraserver_mode",
    "server_id_2",
    "server_id_4",
    "node_id_2",
    "node_id_4",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    let dev = dir.path().join("dev");
    let class = sys.join("class").join(NEURON_CLASS);
    std::fs::create_dir_all(&class).unwrap();
    std::fs::create_dir_all(&dev).unwrap();
    for name in CLASS_FILES {
        match lines.next() {
            Some(v) if v != "-" => std::fs::write(class.join(name), v).unwrap(),
            _ => {}
        }
    }
    // At most 24 chip entries: enough for every shape, few files per run.
    for line in lines.take(24) {
        let mut parts = line.splitn(3, '|');
        let (Some(index), Some(cores)) = (parts.next(), parts.next()) else {
            continue;
        };
        // Only names the kernel could give a class entry.
        if index.is_empty() || index.len() > 12 || !index.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            continue;
        }
        let chip = class.join(format!("neuron{index}"));
        if std::fs::create_dir_all(&chip).is_err() {
            continue;
        }
        std::fs::write(chip.join("core_count"), cores).unwrap();
        if let Some(connected) = parts.next() {
            std::fs::write(chip.join("connected_devices"), connected).unwrap();
        }
        std::fs::write(dev.join(format!("neuron{index}")), "").unwrap();
    }

    let inventory = discover(
        &SysfsRoot::new(&sys),
        &dev,
        &StaticBdf::default(),
        &mut BdfCache::default(),
    )
    .unwrap();
    for chip in &inventory.chips {
        assert!(chip.index <= MAX_CHIP_INDEX);
        assert!((1..=MAX_CORES_PER_CHIP).contains(&chip.core_count));
        let cores = logical_cores(chip, LogicalNeuronCore::One);
        assert!(!range_list(cores).is_empty());
    }
    let cores: usize = inventory.chips.iter().map(|c| c.core_count as usize).sum();
    let devices = partitions::devices(&inventory, PartitionMode::Cores);
    // Chips, their cores and at most one whole-node device.
    assert!(devices.len() <= inventory.chips.len() + cores + 1);
    let _ = partitions::counter_sets(&inventory, PartitionMode::Cores);
    let _ = neuron_driver::devices(&inventory);
    if let UltraServer::Member(member) = &inventory.ultraserver {
        for nodes in member.node_counts() {
            let _ = member.runtime_env(nodes);
        }
        assert!(!member.mode_label().is_empty());
        let _ = member.node_labels();
    }
});
