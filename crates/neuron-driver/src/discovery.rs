//! Neuron chips of this node, from sysfs and `/dev`.
//!
//! What is read (and only read: `reset` in the same directory resets the
//! chip when written, so nothing here ever opens a sysfs file for writing):
//! - `class/neuron_device/neuronN/{core_count, connected_devices}` (root-only
//!   files; `core_count` has no trailing newline);
//! - `devices/virtual/dmi/id/product_name` (instance type) and
//!   `module/neuron/version` (kernel driver version);
//! - `<dev-root>/neuronN` must exist: a chip whose device node is gone
//!   cannot be handed to a container;
//! - the class-level UltraServer files ([`crate::ultraserver`]);
//! - the chip's PCI function through [`BdfSource`] (an ioctl on the device
//!   node), then that function's sysfs entry for `pcieRoot` and NUMA node.
//!
//! A chip whose files cannot be read or parsed is skipped with a warning; the
//! other chips are still published. A node without the class publishes an
//! empty pool.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use topology::sysfs::{list_dir, parse_attr, read_attr};
use topology::{InstanceType, NeuronGeneration, PciAddress, PciDevice, SysfsRoot};

use crate::bdf::{BdfError, BdfSource};
use crate::ultraserver::{self, UltraServer};

/// The sysfs class of Neuron chips.
pub const NEURON_CLASS: &str = "neuron_device";

/// The largest chip index (`neuronN`) discovery accepts. Instances have at
/// most 16 chips (an UltraServer numbers them per node); anything far past
/// that is a kernel or fixture fault, refused for the chip. With
/// [`MAX_CORES_PER_CHIP`] this bounds every node-wide core number
/// (`index * core_count + core`) well inside `u32`, and every per-core loop.
pub const MAX_CHIP_INDEX: u32 = 127;

/// The most NeuronCores a chip may report in `core_count` (Trainium2 has 8).
pub const MAX_CORES_PER_CHIP: u32 = 64;

/// What a chip is, for LNC rules, memory and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChipType {
    Known(NeuronGeneration),
    /// Neither the PCI id nor the instance family said; the core count is
    /// all that is known.
    Unknown,
}

impl ChipType {
    /// From the instance family when the PCI function is unknown.
    pub fn from_family(family: &str) -> ChipType {
        let generation = match family {
            "inf1" => NeuronGeneration::Inferentia1,
            "inf2" => NeuronGeneration::Inferentia2,
            "trn1" | "trn1n" => NeuronGeneration::Trainium1,
            f if f.starts_with("trn2") => NeuronGeneration::Trainium2,
            f if f.starts_with("trn3") => NeuronGeneration::Trainium3,
            _ => return ChipType::Unknown,
        };
        ChipType::Known(generation)
    }

    pub fn name(&self) -> &'static str {
        match self {
            ChipType::Known(NeuronGeneration::Inferentia1) => "Inferentia",
            ChipType::Known(NeuronGeneration::Trainium1) => "Trainium",
            ChipType::Known(NeuronGeneration::Inferentia2) => "Inferentia2",
            ChipType::Known(NeuronGeneration::Trainium2) => "Trainium2",
            ChipType::Known(NeuronGeneration::Trainium3) => "Trainium3",
            ChipType::Unknown => "unknown Neuron chip",
        }
    }

    /// Device memory per chip in GiB, from AWS's instance tables.
    pub fn memory_gib(&self) -> Option<u64> {
        match self {
            ChipType::Known(NeuronGeneration::Inferentia1) => Some(8),
            ChipType::Known(NeuronGeneration::Trainium1 | NeuronGeneration::Inferentia2) => {
                Some(32)
            }
            ChipType::Known(NeuronGeneration::Trainium2) => Some(96),
            ChipType::Known(NeuronGeneration::Trainium3) => Some(144),
            ChipType::Unknown => None,
        }
    }
}

/// Where a chip sits on the PCI tree, when the ioctl answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChipPci {
    pub address: PciAddress,
    /// The function as sysfs shows it; `None` when the address the kernel
    /// gave has no readable sysfs entry (then only `pciBusID` is known).
    pub device: Option<PciDevice>,
}

/// One chip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronChip {
    /// N of `neuronN`.
    pub index: u32,
    /// Physical NeuronCores.
    pub core_count: u32,
    /// Neighbour chip indices (`connected_devices`); `None` when unreadable.
    pub connected: Option<Vec<u32>>,
    pub chip_type: ChipType,
    /// `<dev-root>/neuronN` on the host.
    pub device_node: PathBuf,
    pub pci: Option<ChipPci>,
}

/// Everything discovery learnt about the node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInventory {
    pub instance_type: Option<InstanceType>,
    pub neuron_driver_version: Option<String>,
    /// By index, ascending.
    pub chips: Vec<NeuronChip>,
    /// The node's place in a Trn2 UltraServer ([`crate::ultraserver`]).
    pub ultraserver: UltraServer,
    /// EC2 instance topology from the Node's
    /// `topology.k8s.aws/network-node-layer-N` labels, as `(N, value)`;
    /// empty in `discover` (no Node) and where the labels are absent.
    pub network_node_layers: BTreeMap<u32, String>,
}

impl NodeInventory {
    pub fn chip(&self, index: u32) -> Option<&NeuronChip> {
        self.chips.iter().find(|c| c.index == index)
    }

    /// Whether the chips are wired as a 4×4 2D torus (trn1/trn1n/trn2): every
    /// chip's neighbours are exactly its wrap-around neighbours at
    /// `x = N/4, y = N%4`. Read from `connected_devices`, so a switched
    /// (all-to-all) or ring topology does not qualify.
    pub fn is_torus_4x4(&self) -> bool {
        !self.chips.is_empty()
            && self.chips.iter().all(|c| {
                c.index < 16
                    && c.connected.as_ref().is_some_and(|n| {
                        n.iter().copied().collect::<BTreeSet<u32>>() == torus_neighbours(c.index)
                    })
            })
    }
}

fn torus_neighbours(index: u32) -> BTreeSet<u32> {
    let (x, y) = (index / 4, index % 4);
    [
        ((x + 3) % 4) * 4 + y,
        ((x + 1) % 4) * 4 + y,
        x * 4 + (y + 3) % 4,
        x * 4 + (y + 1) % 4,
    ]
    .into_iter()
    .collect()
}

/// Why a chip was skipped.
#[derive(Debug, thiserror::Error)]
pub enum ChipError {
    #[error("{entry}: not a neuron<N> class entry")]
    BadName { entry: String },
    #[error("chip {index}: {source}")]
    Sysfs {
        index: u32,
        #[source]
        source: topology::Error,
    },
    #[error("chip {index}: {path} is missing")]
    Missing { index: u32, path: PathBuf },
    #[error("chip {index}: {path}: cannot parse {content:?} as a list of chip indices")]
    BadConnected {
        index: u32,
        path: PathBuf,
        content: String,
    },
    #[error("chip {index}: core_count is 0")]
    NoCores { index: u32 },
    #[error("{entry}: {what} {value} is above the largest accepted, {max}")]
    OutOfRange {
        entry: String,
        what: &'static str,
        value: u32,
        max: u32,
    },
}

/// Discovery failed as a whole (the class directory exists but cannot be listed).
#[derive(Debug, thiserror::Error)]
#[error("listing Neuron chips: {0}")]
pub struct DiscoveryError(#[from] topology::Error);

/// Parses `connected_devices`: `12, 3, 4, 1`, or empty. `None` for anything
/// else, an index above [`MAX_CHIP_INDEX`] or more entries than there can be
/// chips included.
pub fn parse_connected(s: &str) -> Option<Vec<u32>> {
    let s = s.trim();
    if s.is_empty() {
        return Some(Vec::new());
    }
    let list: Vec<u32> = s
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .ok()
                .filter(|i| *i <= MAX_CHIP_INDEX)
        })
        .collect::<Option<_>>()?;
    (list.len() <= MAX_CHIP_INDEX as usize + 1).then_some(list)
}

/// Remembers each chip's PCI lookup for as long as the chip stays present,
/// and logs each kind of lookup failure once.
#[derive(Debug, Default)]
pub struct BdfCache {
    known: BTreeMap<u32, Result<PciAddress, BdfError>>,
    logged: BTreeSet<String>,
}

impl BdfCache {
    fn lookup(&mut self, source: &dyn BdfSource, index: u32, node: &Path) -> Option<PciAddress> {
        let result = self
            .known
            .entry(index)
            .or_insert_with(|| source.chip_address(node));
        match result {
            Ok(a) => Some(*a),
            Err(e) => {
                if self.logged.insert(e.kind()) {
                    tracing::warn!(chip = index, error = %e,
                        "chip PCI address unknown: publishing chips without pcieRoot, pciBusID and numaNode (logged once per kind of failure)");
                } else {
                    tracing::debug!(chip = index, error = %e, "chip PCI address unknown");
                }
                None
            }
        }
    }

    /// Forgets chips that are gone, so that a chip that comes back is looked
    /// up again.
    fn retain(&mut self, present: &BTreeSet<u32>) {
        self.known.retain(|i, _| present.contains(i));
    }
}

/// Reads the node's chips. Per-chip problems are logged and the chip skipped.
pub fn discover(
    sysfs: &SysfsRoot,
    dev_root: &Path,
    bdf: &dyn BdfSource,
    cache: &mut BdfCache,
) -> Result<NodeInventory, DiscoveryError> {
    let instance_type = match InstanceType::from_sysfs(sysfs) {
        Ok(t) => t,
        Err(error) => {
            tracing::warn!(%error, "instance type unknown");
            None
        }
    };
    let neuron_driver_version = match sysfs.module_version("neuron") {
        Ok(v) => v.filter(|v| !v.is_empty()),
        Err(error) => {
            tracing::warn!(%error, "neuron kernel module version unknown");
            None
        }
    };
    let family_type = instance_type
        .as_ref()
        .map_or(ChipType::Unknown, |t| ChipType::from_family(t.family()));

    let class = sysfs.class_dir(NEURON_CLASS);
    let entries = list_dir(&class)?.unwrap_or_default();
    let mut chips = Vec::new();
    for entry in entries {
        match read_chip(&class, &entry, dev_root, family_type) {
            Ok(Some(chip)) => chips.push(chip),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "skipping Neuron chip"),
        }
    }
    chips.sort_by_key(|c| c.index);
    let present: BTreeSet<u32> = chips.iter().map(|c| c.index).collect();
    cache.retain(&present);
    for chip in &mut chips {
        if let Some(address) = cache.lookup(bdf, chip.index, &chip.device_node) {
            let device = match PciDevice::read(sysfs, address) {
                Ok(d) => Some(d),
                Err(error) => {
                    tracing::warn!(chip = chip.index, %address, %error,
                        "the chip's PCI function is not readable in sysfs; publishing pciBusID only");
                    None
                }
            };
            if let Some(ChipType::Known(g)) = device
                .as_ref()
                .and_then(|d| NeuronGeneration::from_device_id(d.device))
                .map(ChipType::Known)
            {
                chip.chip_type = ChipType::Known(g);
            }
            chip.pci = Some(ChipPci { address, device });
        }
    }
    let ultraserver = if chips.is_empty() {
        UltraServer::None
    } else {
        ultraserver::read(&class)
    };
    Ok(NodeInventory {
        instance_type,
        neuron_driver_version,
        chips,
        ultraserver,
        network_node_layers: BTreeMap::new(),
    })
}

/// One class entry. `Ok(None)`: not a chip entry at all (class-level files
/// such as `node_id_2`, `ultraserver_mode`).
fn read_chip(
    class: &Path,
    entry: &str,
    dev_root: &Path,
    chip_type: ChipType,
) -> Result<Option<NeuronChip>, ChipError> {
    let Some(number) = entry.strip_prefix("neuron") else {
        return Ok(None);
    };
    let dir = class.join(entry);
    if !dir.is_dir() {
        return Ok(None);
    }
    let index = number
        .parse::<u32>()
        .ok()
        .filter(|_| !number.starts_with('+') && (number == "0" || !number.starts_with('0')))
        .ok_or_else(|| ChipError::BadName {
            entry: entry.to_owned(),
        })?;
    if index > MAX_CHIP_INDEX {
        return Err(ChipError::OutOfRange {
            entry: entry.to_owned(),
            what: "chip index",
            value: index,
            max: MAX_CHIP_INDEX,
        });
    }
    let sys = |source| ChipError::Sysfs { index, source };
    let core_path = dir.join("core_count");
    let core_count: u32 = parse_attr(&core_path)
        .map_err(sys)?
        .ok_or(ChipError::Missing {
            index,
            path: core_path,
        })?;
    if core_count == 0 {
        return Err(ChipError::NoCores { index });
    }
    if core_count > MAX_CORES_PER_CHIP {
        return Err(ChipError::OutOfRange {
            entry: entry.to_owned(),
            what: "core_count",
            value: core_count,
            max: MAX_CORES_PER_CHIP,
        });
    }
    let connected_path = dir.join("connected_devices");
    let connected = match read_attr(&connected_path) {
        Ok(Some(s)) => Some(parse_connected(&s).ok_or(ChipError::BadConnected {
            index,
            path: connected_path,
            content: s,
        })?),
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(chip = index, %error, "connected_devices unreadable; no topology attributes");
            None
        }
    };
    let device_node = dev_root.join(format!("neuron{index}"));
    if std::fs::symlink_metadata(&device_node).is_err() {
        return Err(ChipError::Missing {
            index,
            path: device_node,
        });
    }
    Ok(Some(NeuronChip {
        index,
        core_count,
        connected,
        chip_type,
        device_node,
        pci: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_lists() {
        assert_eq!(parse_connected("12, 3, 4, 1\n"), Some(vec![12, 3, 4, 1]));
        assert_eq!(parse_connected("\n"), Some(vec![]));
        assert_eq!(parse_connected("11,1"), Some(vec![11, 1]));
        assert_eq!(parse_connected("1,,2"), None);
        assert_eq!(parse_connected("a"), None);
        assert_eq!(parse_connected("-1"), None);
        assert_eq!(parse_connected("127"), Some(vec![127]));
        assert_eq!(parse_connected("128"), None);
        assert_eq!(parse_connected("4294967295"), None);
        assert_eq!(
            parse_connected(&vec!["1"; 128].join(",")).map(|l| l.len()),
            Some(128)
        );
        assert_eq!(parse_connected(&vec!["1"; 129].join(",")), None);
    }

    #[test]
    fn torus_neighbours_of_corners() {
        assert_eq!(torus_neighbours(0), [1, 3, 4, 12].into());
        assert_eq!(torus_neighbours(15), [3, 11, 12, 14].into());
        assert_eq!(torus_neighbours(6), [2, 5, 7, 10].into());
    }

    #[test]
    fn families_to_chip_types() {
        let cases = [
            ("inf2", "Inferentia2", Some(32)),
            ("trn1", "Trainium", Some(32)),
            ("trn1n", "Trainium", Some(32)),
            ("trn2", "Trainium2", Some(96)),
            ("trn2u", "Trainium2", Some(96)),
            ("trn3", "Trainium3", Some(144)),
            ("m5", "unknown Neuron chip", None),
        ];
        for (family, name, mem) in cases {
            let t = ChipType::from_family(family);
            assert_eq!((t.name(), t.memory_gib()), (name, mem), "{family}");
        }
    }
}
