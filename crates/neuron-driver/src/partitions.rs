//! NeuronCores as partitions of a chip.
//!
//! Where a node opts in (below) and the API server serves partitionable
//! devices (`DRAPartitionableDevices`, beta and on from 1.36), each chip is
//! published twice over: as its
//! whole-chip device `neurondeviceN` and as one device per physical
//! NeuronCore, `neurondeviceN-core-K`. All of them draw on the chip's
//! counter set (named like the chip device), which holds one counter per
//! core (`core-K`, value 1):
//! - a core device consumes its own core's counter;
//! - the whole-chip device consumes every core's counter.
//!
//! So the scheduler can hand out cores of a chip to several claims, or the
//! whole chip to one, never both, and never one core twice.
//!
//! Cores are opt-in: `--partitions chips` (the default) publishes whole
//! chips only, as AWS's own Neuron DRA driver does. Every device a node
//! publishes is walked by the scheduler for every claim it tries on that
//! node, so a trn2.48xlarge with its 128 cores costs the scheduler about
//! nine devices for each one a whole-chip claim can use (measured with the
//! real kube-scheduler: docs/performance.md, "At fleet scale"). A node pool
//! that serves `aws.amazon.com/neuroncore` or claims for single cores opts
//! in with `--partitions auto` (or the Node label [`PARTITIONS_LABEL`],
//! which overrides the flag on that node).
//!
//! With cores opted in: on older servers (1.34, 1.35 with default gates)
//! the counter fields would be dropped on write, so only whole chips are
//! published, without counters. `auto` asks the API server at start-up
//! (`dra-core` runs the probe); `cores` forces them.

use std::collections::BTreeMap;
use std::fmt;

use dra_core::ApiSupport;
use dra_core::attributes::int;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceCapacity, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::attributes::{
    NODE_DEVICE_NAME, chip_device, device_name, node_device, parse_device_name, parse_index,
};
use crate::discovery::{NeuronChip, NodeInventory};
use crate::lnc::supports_lnc2;

/// `resourceType` of a core device (a chip's is
/// [`crate::attributes::RESOURCE_TYPE`]).
pub const CORE_RESOURCE_TYPE: &str = "neuron_core";

/// The Node label that sets `--partitions` for one node (a node pool's
/// label): `chips`, `auto` or `cores`, read once at start-up.
pub const PARTITIONS_LABEL: &str = "neuron.aws.com/partitions";

/// `--partitions`: what to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PartitionsFlag {
    /// Cores too where the API server serves partitionable devices, else
    /// whole chips only (`discover`, which asks no server: whole chips).
    Auto,
    /// Whole chips only (the default: cores cost the scheduler on every
    /// claim, see the module doc).
    #[default]
    Chips,
    /// Whole chips and their cores, sharing the chip's counters.
    Cores,
}

/// The neuron driver's own flags of `run` and `discover`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct NeuronFlags {
    /// Publish NeuronCores as partitions of their chip: chips (whole chips
    /// only), auto (cores too where the API server keeps counters) or
    /// cores. The Node label `neuron.aws.com/partitions` overrides it.
    #[arg(long, env = "NEURON_PARTITIONS", value_enum, default_value_t = PartitionsFlag::Chips)]
    pub partitions: PartitionsFlag,
}

impl PartitionsFlag {
    /// The flag a Node label [`PARTITIONS_LABEL`] asks for; `None` for a
    /// value that is none of `chips`, `auto` or `cores`.
    pub fn from_label(value: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(value.trim(), true).ok()
    }

    /// The flag in effect: the Node's label where it has a valid one, else
    /// the flag. Returns why, for the start-up log line.
    pub fn with_node_label(self, labels: &BTreeMap<String, String>) -> (Self, Option<String>) {
        match labels.get(PARTITIONS_LABEL) {
            None => (self, None),
            Some(value) => match Self::from_label(value) {
                Some(flag) => (flag, Some(format!("Node label {PARTITIONS_LABEL}={value}"))),
                None => (
                    self,
                    Some(format!(
                        "Node label {PARTITIONS_LABEL}={value:?} is none of chips, auto, cores: ignored"
                    )),
                ),
            },
        }
    }
}

/// What is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartitionMode {
    /// One device per chip (every API server).
    #[default]
    Chips,
    /// One device per chip and one per core, on the chip's counter set.
    Cores,
}

impl fmt::Display for PartitionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionMode::Chips => "chips",
            PartitionMode::Cores => "cores",
        })
    }
}

/// The mode for a flag and what the API server supports, with the reason
/// (logged once at start-up).
pub fn resolve(flag: PartitionsFlag, support: &ApiSupport) -> (PartitionMode, String) {
    match (flag, support.partitionable_devices) {
        (PartitionsFlag::Chips, _) => (PartitionMode::Chips, "--partitions chips".into()),
        (PartitionsFlag::Cores, Some(false)) => (
            PartitionMode::Cores,
            format!(
                "--partitions cores, although {}: the API server will drop the cores' counters, \
                 so core devices and whole chips could be allocated twice; use auto or chips here",
                support.reason
            ),
        ),
        (PartitionsFlag::Cores, _) => (PartitionMode::Cores, "--partitions cores".into()),
        (PartitionsFlag::Auto, Some(true)) => (
            PartitionMode::Cores,
            format!("--partitions auto: {}", support.reason),
        ),
        (PartitionsFlag::Auto, _) => (
            PartitionMode::Chips,
            format!("--partitions auto: {}", support.reason),
        ),
    }
}

/// `neurondevice<chip>-core-<core>`.
pub fn core_device_name(chip: u32, core: u32) -> String {
    format!("{}-core-{core}", device_name(chip))
}

/// A device name we publish, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRef {
    /// A whole chip.
    Chip(u32),
    /// Core `core` (physical, within the chip) of chip `chip`.
    Core { chip: u32, core: u32 },
    /// The whole-node device of an UltraServer node: every chip.
    Node,
}

/// Parses `neurondeviceN`, `neurondeviceN-core-K` and `neuronnode`, and the names of
/// before the rename (`neuron-device-N`, `neuron-device-N-core-K`).
pub fn parse_device_ref(name: &str) -> Option<DeviceRef> {
    if name == NODE_DEVICE_NAME {
        return Some(DeviceRef::Node);
    }
    let rest = name
        .strip_prefix(crate::attributes::DEVICE_NAME_PREFIX)
        .or_else(|| name.strip_prefix(crate::attributes::LEGACY_DEVICE_NAME_PREFIX))?;
    match rest.split_once("-core-") {
        None => parse_device_name(name).map(DeviceRef::Chip),
        Some((chip, core)) => Some(DeviceRef::Core {
            chip: parse_index(chip)?,
            core: parse_index(core)?,
        }),
    }
}

/// The name of a chip's counter set (the chip's device name).
pub fn counter_set_name(chip: u32) -> String {
    device_name(chip)
}

fn counter_name(core: u32) -> String {
    format!("core-{core}")
}

fn one() -> Counter {
    Counter {
        value: Quantity("1".into()),
    }
}

/// A chip's counter set: one counter of 1 per physical core.
pub fn counter_set(chip: &NeuronChip) -> CounterSet {
    CounterSet {
        name: counter_set_name(chip.index),
        counters: (0..chip.core_count)
            .map(|k| (counter_name(k), one()))
            .collect(),
    }
}

/// The device of core `core` of `chip`: the chip's attributes (device
/// groups, PCI placement, instance type: a core is where its chip is), with
/// `resourceType: neuron_core`, `coreId` (the core's node-wide index at
/// LNC=1, as `NEURON_RT_VISIBLE_CORES` counts) and, on chips that support
/// LNC=2, `lnc2CoreId` (the index of the logical core the core belongs to
/// at LNC=2: two cores with the same value form one such logical core).
pub fn core_device(chip_dev: &Device, chip: &NeuronChip, core: u32) -> Device {
    let mut attrs = chip_dev.attributes.clone().unwrap_or_default();
    attrs.insert(
        "resourceType".into(),
        dra_core::attributes::string(CORE_RESOURCE_TYPE),
    );
    attrs.remove("coreCount");
    attrs.insert("coreId".into(), int(chip.index * chip.core_count + core));
    if supports_lnc2(chip) {
        attrs.insert(
            "lnc2CoreId".into(),
            int(chip.index * (chip.core_count / 2) + core / 2),
        );
    }
    let capacity: BTreeMap<String, DeviceCapacity> = [(
        "cores".to_owned(),
        DeviceCapacity {
            value: Quantity("1".into()),
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    Device {
        name: core_device_name(chip.index, core),
        attributes: Some(attrs),
        capacity: Some(capacity),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counter_set_name(chip.index),
            counters: [(counter_name(core), one())].into_iter().collect(),
        }]),
        ..Default::default()
    }
}

/// The counter set of the whole node on a Trn2 UltraServer node (named
/// like the whole-node device): one counter per chip, `chip-N`, holding
/// the chip's physical cores. The whole-node device consumes all of it; a
/// chip consumes its own counter whole and a core one unit of it, so the
/// whole node and any of its chips or cores are never allocated together.
/// (One set for the node rather than the node device consuming every
/// chip's set: a device may consume from a few counter sets only.)
pub fn node_counter_set(inventory: &NodeInventory) -> CounterSet {
    CounterSet {
        name: NODE_DEVICE_NAME.to_owned(),
        counters: inventory
            .chips
            .iter()
            .map(|c| (chip_counter_name(c.index), cores_counter(c.core_count)))
            .collect(),
    }
}

fn chip_counter_name(chip: u32) -> String {
    format!("chip-{chip}")
}

fn cores_counter(cores: u32) -> Counter {
    Counter {
        value: Quantity(cores.to_string()),
    }
}

/// What is published besides the chips: cores ([`PartitionMode::Cores`])
/// and the whole-node device (`whole_node`, on UltraServer nodes whose ids
/// are known, where the API server keeps counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    pub mode: PartitionMode,
    pub whole_node: bool,
}

/// A partition mode alone: the whole-node device wherever the node is an
/// UltraServer member (what `discover` and a server with counters get).
impl From<PartitionMode> for Layout {
    fn from(mode: PartitionMode) -> Self {
        Layout {
            mode,
            whole_node: true,
        }
    }
}

impl Layout {
    /// Whether the whole-node device is published for `inventory`.
    fn node_device(&self, inventory: &NodeInventory) -> Option<Device> {
        if self.whole_node {
            node_device(inventory)
        } else {
            None
        }
    }
}

/// Every device of the node: whole chips, plus in [`PartitionMode::Cores`]
/// each chip's cores, with the chips consuming all of their counters, plus
/// the whole-node device of an UltraServer node.
pub fn devices(inventory: &NodeInventory, layout: impl Into<Layout>) -> Vec<Device> {
    let layout = layout.into();
    let torus = inventory.is_torus_4x4();
    let node = layout.node_device(inventory);
    let node_share = |chip: u32, cores: u32| DeviceCounterConsumption {
        counter_set: NODE_DEVICE_NAME.to_owned(),
        counters: [(chip_counter_name(chip), cores_counter(cores))]
            .into_iter()
            .collect(),
    };
    let mut out = Vec::new();
    for chip in &inventory.chips {
        let mut chip_dev = chip_device(inventory, chip, torus);
        let mut chip_consumes = Vec::new();
        if layout.mode == PartitionMode::Cores {
            for k in 0..chip.core_count {
                let mut core = core_device(&chip_dev, chip, k);
                if node.is_some()
                    && let Some(consumes) = core.consumes_counters.as_mut()
                {
                    consumes.push(node_share(chip.index, 1));
                }
                out.push(core);
            }
            chip_consumes.push(DeviceCounterConsumption {
                counter_set: counter_set_name(chip.index),
                counters: counter_set(chip).counters,
            });
        }
        if node.is_some() {
            chip_consumes.push(node_share(chip.index, chip.core_count));
        }
        if !chip_consumes.is_empty() {
            chip_dev.consumes_counters = Some(chip_consumes);
        }
        out.push(chip_dev);
    }
    if let Some(mut node) = node {
        let set = node_counter_set(inventory);
        node.consumes_counters = Some(vec![DeviceCounterConsumption {
            counter_set: set.name,
            counters: set.counters,
        }]);
        out.push(node);
    }
    out
}

/// The counter sets the devices of `layout` consume.
pub fn counter_sets(inventory: &NodeInventory, layout: impl Into<Layout>) -> Vec<CounterSet> {
    let layout = layout.into();
    let mut sets: Vec<CounterSet> = match layout.mode {
        PartitionMode::Chips => Vec::new(),
        PartitionMode::Cores => inventory.chips.iter().map(counter_set).collect(),
    };
    if layout.node_device(inventory).is_some() {
        sets.push(node_counter_set(inventory));
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(core_device_name(15, 7), "neurondevice15-core-7");
        assert_eq!(parse_device_ref("neurondevice3"), Some(DeviceRef::Chip(3)));
        assert_eq!(
            parse_device_ref("neurondevice15-core-7"),
            Some(DeviceRef::Core { chip: 15, core: 7 })
        );
        // Before the rename.
        assert_eq!(
            parse_device_ref("neuron-device-3"),
            Some(DeviceRef::Chip(3))
        );
        assert_eq!(
            parse_device_ref("neuron-device-15-core-7"),
            Some(DeviceRef::Core { chip: 15, core: 7 })
        );
        for bad in [
            "neurondevice",
            "neurondevice1-core-",
            "neurondevice01-core-1",
            "neurondevice-1",
            "neuron-device-",
            "neuron-device-1-core-",
            "neuron-device-1-core-07",
            "neuron-device-01-core-1",
            "neuron-device-1-core-x",
            "neuron-device-1-cores-1",
            "efa-0",
        ] {
            assert_eq!(parse_device_ref(bad), None, "{bad}");
        }
    }

    #[test]
    fn mode_follows_flag_then_server() {
        let yes = ApiSupport {
            partitionable_devices: Some(true),
            reason: "kept".into(),
            ..ApiSupport::unknown()
        };
        let no = ApiSupport {
            partitionable_devices: Some(false),
            reason: "dropped".into(),
            ..ApiSupport::unknown()
        };
        let unknown = ApiSupport::unknown();
        let cases = [
            (PartitionsFlag::Auto, &yes, PartitionMode::Cores),
            (PartitionsFlag::Auto, &no, PartitionMode::Chips),
            (PartitionsFlag::Auto, &unknown, PartitionMode::Chips),
            (PartitionsFlag::Chips, &yes, PartitionMode::Chips),
            (PartitionsFlag::Cores, &no, PartitionMode::Cores),
            (PartitionsFlag::Cores, &unknown, PartitionMode::Cores),
        ];
        for (flag, support, want) in cases {
            let (mode, reason) = resolve(flag, support);
            assert_eq!(mode, want, "{flag:?} {support:?}");
            assert!(!reason.is_empty());
        }
        assert!(resolve(PartitionsFlag::Cores, &no).1.contains("twice"));
        assert!(resolve(PartitionsFlag::Auto, &no).1.contains("dropped"));
    }

    #[test]
    fn whole_chips_by_default() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            neuron: NeuronFlags,
        }
        // (The tests' environment has no NEURON_PARTITIONS.)
        let cli = <Cli as clap::Parser>::try_parse_from(["x"]).expect("no flags");
        assert_eq!(cli.neuron.partitions, PartitionsFlag::Chips);
        assert_eq!(PartitionsFlag::default(), PartitionsFlag::Chips);
        assert_eq!(
            resolve(cli.neuron.partitions, &ApiSupport::unknown()).0,
            PartitionMode::Chips
        );
    }

    #[test]
    fn node_label_overrides_the_flag() {
        let labels = |v: &str| BTreeMap::from([(PARTITIONS_LABEL.to_owned(), v.to_owned())]);
        let cases = [
            (PartitionsFlag::Chips, None, PartitionsFlag::Chips, false),
            (
                PartitionsFlag::Chips,
                Some("auto"),
                PartitionsFlag::Auto,
                true,
            ),
            (
                PartitionsFlag::Chips,
                Some("Cores"),
                PartitionsFlag::Cores,
                true,
            ),
            (
                PartitionsFlag::Auto,
                Some("chips"),
                PartitionsFlag::Chips,
                true,
            ),
            (
                PartitionsFlag::Auto,
                Some("all"),
                PartitionsFlag::Auto,
                true,
            ),
        ];
        for (flag, label, want, says_why) in cases {
            let node = label.map(labels).unwrap_or_default();
            let (got, why) = flag.with_node_label(&node);
            assert_eq!(got, want, "{flag:?} {label:?}");
            assert_eq!(why.is_some(), says_why, "{flag:?} {label:?}");
        }
        let (_, why) = PartitionsFlag::Auto.with_node_label(&labels("all"));
        assert!(why.is_some_and(|w| w.contains("ignored")));
    }
}
