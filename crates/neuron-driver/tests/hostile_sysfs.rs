//! Numbers from sysfs are input like any other: a chip whose files carry
//! values no Neuron kernel driver writes is skipped, and the chips beside it
//! are published as usual. Without the bounds, `core_count` near `u32::MAX`
//! overflowed the node-wide core numbering (a panic in a checked build) and
//! made the per-core loops allocate billions of devices.

use std::path::Path;

use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{
    BdfCache, MAX_CHIP_INDEX, MAX_CORES_PER_CHIP, NEURON_CLASS, NodeInventory, discover,
};
use neuron_driver::lnc::{LogicalNeuronCore, logical_cores, range_list};
use neuron_driver::partitions::{self, PartitionMode};
use sysfs_fixtures::{Fixture, generate};
use topology::SysfsRoot;

fn scan(fixture: &Fixture) -> NodeInventory {
    discover(
        &SysfsRoot::new(&fixture.sys),
        &fixture.dev,
        &StaticBdf::default(),
        &mut BdfCache::default(),
    )
    .unwrap()
}

fn class(fixture: &Fixture) -> std::path::PathBuf {
    fixture.sys.join("class").join(NEURON_CLASS)
}

fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap();
}

/// Adds a chip entry `neuron<index>` with its device node.
fn add_chip(fixture: &Fixture, index: &str, core_count: &str) {
    let dir = class(fixture).join(format!("neuron{index}"));
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir.join("core_count"), core_count);
    write(&dir.join("connected_devices"), "");
    write(&fixture.dev.join(format!("neuron{index}")), "");
}

#[test]
fn chips_with_out_of_range_numbers_are_skipped_and_the_rest_published() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = generate("inf2.48xlarge", dir.path()).unwrap();
    let good = scan(&fixture).chips.len();
    assert_eq!(good, 12);

    // Chip 0: a core count no chip has; chip 1: one past the bound.
    write(&class(&fixture).join("neuron0/core_count"), "4294967295\n");
    write(
        &class(&fixture).join("neuron1/core_count"),
        &format!("{}\n", MAX_CORES_PER_CHIP + 1),
    );
    // Chip 2: neighbours that cannot exist.
    write(
        &class(&fixture).join("neuron2/connected_devices"),
        "1, 4294967295\n",
    );
    // Entries whose index is past the bound, one at u32::MAX.
    add_chip(&fixture, &(MAX_CHIP_INDEX + 1).to_string(), "2");
    add_chip(&fixture, "4294967295", "2");
    // The largest accepted numbers are accepted.
    add_chip(
        &fixture,
        &MAX_CHIP_INDEX.to_string(),
        &MAX_CORES_PER_CHIP.to_string(),
    );

    let inventory = scan(&fixture);
    let indices: Vec<u32> = inventory.chips.iter().map(|c| c.index).collect();
    assert!(!indices.contains(&0), "{indices:?}");
    assert!(!indices.contains(&1), "{indices:?}");
    assert!(!indices.contains(&(MAX_CHIP_INDEX + 1)), "{indices:?}");
    assert!(!indices.contains(&u32::MAX), "{indices:?}");
    // Chip 2's neighbour list is refused as any unparsable list is: the
    // chip is skipped. The largest legal chip is there.
    assert!(!indices.contains(&2), "{indices:?}");
    assert!(indices.contains(&MAX_CHIP_INDEX), "{indices:?}");
    assert_eq!(indices.len(), good - 3 + 1, "{indices:?}");

    // Everything derived from the numbers stays in range: every core of
    // every chip as a device, their node-wide ids, LNC ranges.
    let devices = partitions::devices(&inventory, PartitionMode::Cores);
    let cores: u32 = inventory.chips.iter().map(|c| c.core_count).sum();
    assert_eq!(devices.len(), inventory.chips.len() + cores as usize);
    let last = inventory.chips.last().unwrap();
    let range = logical_cores(last, LogicalNeuronCore::One);
    assert_eq!(range.end, (MAX_CHIP_INDEX + 1) * MAX_CORES_PER_CHIP);
    assert_eq!(
        range_list([u32::MAX - 1, u32::MAX]),
        format!("{}-{}", u32::MAX - 1, u32::MAX)
    );
}
