//! AWS "connected device groups": `resource.aws.com/devicegroup{1,4,8,16}_id`.
//!
//! AWS's Neuron and EFA DRA drivers publish these four attributes so that one
//! `matchAttribute` constraint pairs Neuron chips with the EFAs wired to
//! them. We publish byte-identical values, computed from the same published
//! chip → EFA tables (embedded here as Rust data; `data/*.json` are the
//! published files, and a test checks the two agree):
//!
//! - `devicegroup1_id` of chip `i` is the address of its EFA;
//! - for N in 4, 8, 16 the group of chip `i` is chips `i/N*N ..+N`; their EFA
//!   addresses, deduplicated, sorted as strings, joined with `,`, SHA-256'd,
//!   first 16 lowercase hex characters;
//! - an EFA gets the values of the chip(s) paired with it.
//!
//! Only instance types listed as EFA-enabled get values. For families
//! without a table, [`derive_pairing`] pairs chips with EFAs from the PCIe
//! tree, and [`check_table`] reports where a table and the tree disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sha2::{Digest, Sha256};

use crate::instance::InstanceType;
use crate::pci::{PciAddress, PciDevice};
use crate::proximity::{Proximity, nearest, proximity};

/// Instance types on which AWS publishes the device-group attributes
/// (`efa-enabled-instances.json`).
pub const EFA_ENABLED_INSTANCE_TYPES: &[&str] = &[
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "trn2e.48xlarge",
    "trn2u.48xlarge",
    "trn3.48xlarge",
    "trn3p.48xlarge",
    "trn3pd98.48xlarge",
    "trn3s.48xlarge",
    "trn3-dev0.48xlarge",
    "trn3-dev1.48xlarge",
];

/// Instance family → table name (`instance-family-mappings.json`).
pub const FAMILY_TABLES: &[(&str, &str)] = &[
    ("trn1", "trn1"),
    ("trn1n", "trn1n"),
    ("trn2", "trn2"),
    ("trn2e", "trn2"),
    ("trn2u", "trn2"),
    ("trn3", "trn3"),
    ("trn3p", "trn3"),
    ("trn3pd98", "trn3"),
    ("trn3s", "trn3"),
    ("trn3-dev0", "trn3pds"),
    ("trn3-dev1", "trn3pds"),
];

const fn at(bus: u8, device: u8) -> PciAddress {
    match PciAddress::new(0, bus, device, 0) {
        Some(a) => a,
        None => panic!("invalid address in a built-in table"),
    }
}

const fn bus0(bus: u8) -> PciAddress {
    at(bus, 0)
}

/// The published tables: name → EFA address of chip 0, 1, 2, ...
#[rustfmt::skip]
pub const PUBLISHED_TABLES: &[(&str, [PciAddress; 16])] = &[
    (
        "trn1",
        [
            at(0x10, 0x1a), at(0x10, 0x1a), at(0xa0, 0x1a), at(0xa0, 0x1a),
            at(0x20, 0x19), at(0x20, 0x19), at(0x90, 0x19), at(0x90, 0x19),
            at(0x20, 0x1a), at(0x20, 0x1a), at(0x90, 0x1a), at(0x90, 0x1a),
            at(0x10, 0x19), at(0x10, 0x19), at(0xa0, 0x19), at(0xa0, 0x19),
        ],
    ),
    (
        "trn1n",
        [
            at(0x10, 0x17), at(0x10, 0x1a), at(0xa0, 0x17), at(0xa0, 0x1a),
            at(0x20, 0x19), at(0x20, 0x18), at(0x90, 0x19), at(0x90, 0x18),
            at(0x20, 0x17), at(0x20, 0x1a), at(0x90, 0x17), at(0x90, 0x1a),
            at(0x10, 0x19), at(0x10, 0x18), at(0xa0, 0x19), at(0xa0, 0x18),
        ],
    ),
    (
        "trn2",
        [
            bus0(0xc9), bus0(0xb4), bus0(0xb3), bus0(0xca),
            bus0(0x6c), bus0(0x57), bus0(0x56), bus0(0x6d),
            bus0(0x98), bus0(0x83), bus0(0x82), bus0(0x99),
            bus0(0xf5), bus0(0xe0), bus0(0xdf), bus0(0xf6),
        ],
    ),
    (
        "trn3",
        [
            bus0(0xbe), bus0(0xa9), bus0(0xa8), bus0(0xbf),
            bus0(0x61), bus0(0x4c), bus0(0x4b), bus0(0x62),
            bus0(0x8d), bus0(0x78), bus0(0x77), bus0(0x8e),
            bus0(0xea), bus0(0xd5), bus0(0xd4), bus0(0xeb),
        ],
    ),
    (
        "trn3pds",
        [
            bus0(0xa9), bus0(0xa8), bus0(0xbf), bus0(0xbe),
            bus0(0xd5), bus0(0xd4), bus0(0xeb), bus0(0xea),
            bus0(0x4c), bus0(0x4b), bus0(0x62), bus0(0x61),
            bus0(0x78), bus0(0x77), bus0(0x8e), bus0(0x8d),
        ],
    ),
];

/// Whether AWS publishes device groups on this instance type.
pub fn is_efa_enabled(instance: &InstanceType) -> bool {
    EFA_ENABLED_INSTANCE_TYPES.contains(&instance.as_str())
}

/// The table name an instance family maps to, if any.
pub fn table_name(family: &str) -> Option<&'static str> {
    FAMILY_TABLES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, t)| *t)
}

/// One value of a `devicegroupN_id` attribute.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceGroupId(String);

impl DeviceGroupId {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hashed id of a set of EFA addresses (N = 4, 8, 16).
    pub fn of_efas(efas: impl IntoIterator<Item = PciAddress>) -> DeviceGroupId {
        let set: BTreeSet<String> = efas.into_iter().map(|a| a.to_string()).collect();
        let joined = set.into_iter().collect::<Vec<_>>().join(",");
        let digest = Sha256::digest(joined.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        DeviceGroupId(hex[..16].to_owned())
    }
}

impl fmt::Display for DeviceGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The four device-group attribute values of one chip or EFA.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceGroups {
    pub group1: DeviceGroupId,
    pub group4: DeviceGroupId,
    pub group8: DeviceGroupId,
    pub group16: DeviceGroupId,
}

impl DeviceGroups {
    /// `(attribute name without domain, value)`, in 1, 4, 8, 16 order. The
    /// attributes live in the `resource.aws.com` domain.
    pub fn attributes(&self) -> [(&'static str, &str); 4] {
        [
            ("devicegroup1_id", self.group1.as_str()),
            ("devicegroup4_id", self.group4.as_str()),
            ("devicegroup8_id", self.group8.as_str()),
            ("devicegroup16_id", self.group16.as_str()),
        ]
    }
}

/// Domain of the device-group attributes.
pub const DEVICE_GROUP_DOMAIN: &str = "resource.aws.com";

/// A chip index → EFA address pairing (published or derived).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EfaTable {
    chips: BTreeMap<u32, PciAddress>,
}

impl EfaTable {
    pub fn new(chips: BTreeMap<u32, PciAddress>) -> Self {
        EfaTable { chips }
    }

    /// A published table by name (`trn1`, `trn1n`, `trn2`, `trn3`, `trn3pds`).
    pub fn published(name: &str) -> Option<EfaTable> {
        let (_, efas) = PUBLISHED_TABLES.iter().find(|(n, _)| *n == name)?;
        Some(EfaTable {
            chips: efas
                .iter()
                .enumerate()
                .map(|(i, a)| (i as u32, *a))
                .collect(),
        })
    }

    /// The published table for an instance type: `None` unless the type is
    /// EFA-enabled and its family has a table.
    pub fn for_instance(instance: &InstanceType) -> Option<EfaTable> {
        if !is_efa_enabled(instance) {
            return None;
        }
        EfaTable::published(table_name(instance.family())?)
    }

    pub fn chips(&self) -> &BTreeMap<u32, PciAddress> {
        &self.chips
    }

    pub fn efa_for_chip(&self, chip: u32) -> Option<PciAddress> {
        self.chips.get(&chip).copied()
    }

    /// Chips paired with `efa`, ascending.
    pub fn chips_for_efa(&self, efa: PciAddress) -> Vec<u32> {
        self.chips
            .iter()
            .filter(|(_, a)| **a == efa)
            .map(|(c, _)| *c)
            .collect()
    }

    /// Every EFA address in the table, once, ascending.
    pub fn efas(&self) -> BTreeSet<PciAddress> {
        self.chips.values().copied().collect()
    }

    fn group_id(&self, chip: u32, n: u32) -> DeviceGroupId {
        let start = chip / n * n;
        DeviceGroupId::of_efas((start..start + n).filter_map(|c| self.efa_for_chip(c)))
    }

    /// The four values of chip `chip`; `None` when the table has no such chip.
    pub fn groups_for_chip(&self, chip: u32) -> Option<DeviceGroups> {
        let efa = self.efa_for_chip(chip)?;
        Some(DeviceGroups {
            group1: DeviceGroupId(efa.to_string()),
            group4: self.group_id(chip, 4),
            group8: self.group_id(chip, 8),
            group16: self.group_id(chip, 16),
        })
    }

    /// The values of an EFA: those of the lowest chip paired with it (all
    /// its chips agree on every published table; see [`check_table`] for
    /// tables where they would not). `None` for an EFA not in the table.
    pub fn groups_for_efa(&self, efa: PciAddress) -> Option<DeviceGroups> {
        let chip = *self.chips_for_efa(efa).first()?;
        self.groups_for_chip(chip)
    }
}

/// Device groups of chip `chip` on `instance`, from the published table.
pub fn device_groups_for_chip(instance: &InstanceType, chip: u32) -> Option<DeviceGroups> {
    EfaTable::for_instance(instance)?.groups_for_chip(chip)
}

/// Device groups of the EFA at `efa` on `instance`, from the published table.
pub fn device_groups_for_efa(instance: &InstanceType, efa: PciAddress) -> Option<DeviceGroups> {
    EfaTable::for_instance(instance)?.groups_for_efa(efa)
}

/// A Neuron chip whose PCI function is known (the driver learns it from the
/// `NEURON_IOCTL_DEVICE_BDF` ioctl; sysfs alone cannot say).
#[derive(Debug, Clone, Copy)]
pub struct LocatedChip<'a> {
    pub index: u32,
    pub device: &'a PciDevice,
}

/// A pairing derived from the PCIe tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DerivedPairing {
    /// Chips with exactly one EFA below a switch they share.
    pub table: EfaTable,
    /// Chips that share a switch with several EFAs at the same distance.
    pub ambiguous: BTreeMap<u32, Vec<PciAddress>>,
    /// Chips that share no switch with any EFA (e.g. everything flat on a
    /// root bus, as on trn1).
    pub unpaired: Vec<u32>,
}

/// Pairs each chip with the EFA that shares a PCIe switch with it (AWS's
/// pairing rule, for families that have no published table).
pub fn derive_pairing(chips: &[LocatedChip<'_>], efas: &[&PciDevice]) -> DerivedPairing {
    let mut out = DerivedPairing::default();
    for chip in chips {
        let (best, set) = nearest(chip.device, efas.iter().copied());
        match (best, set.as_slice()) {
            (Some(p), [one]) if p.shares_switch() => {
                out.table.chips.insert(chip.index, one.address);
            }
            (Some(p), many) if p.shares_switch() => {
                out.ambiguous
                    .insert(chip.index, many.iter().map(|d| d.address).collect());
            }
            _ => out.unpaired.push(chip.index),
        }
    }
    out
}

/// A disagreement between a chip → EFA table and the PCIe tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableMismatch {
    /// The table names an EFA that is not among the EFAs found.
    EfaMissing { chip: u32, efa: PciAddress },
    /// An EFA was found that the table does not mention.
    EfaNotInTable { efa: PciAddress },
    /// The table's EFA is farther from the chip than another EFA.
    NotNearest {
        chip: u32,
        table_efa: PciAddress,
        table_proximity: Proximity,
        nearest: Vec<PciAddress>,
        nearest_proximity: Proximity,
    },
}

impl fmt::Display for TableMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableMismatch::EfaMissing { chip, efa } => {
                write!(
                    f,
                    "chip {chip}: table names EFA {efa}, which is not present"
                )
            }
            TableMismatch::EfaNotInTable { efa } => {
                write!(f, "EFA {efa} is present but not in the table")
            }
            TableMismatch::NotNearest {
                chip,
                table_efa,
                table_proximity,
                nearest,
                nearest_proximity,
            } => {
                let list: Vec<String> = nearest.iter().map(|a| a.to_string()).collect();
                write!(
                    f,
                    "chip {chip}: table names EFA {table_efa} ({table_proximity}) but {} is nearer ({nearest_proximity})",
                    list.join(", ")
                )
            }
        }
    }
}

/// Compares `table` with the PCIe tree: every table EFA must exist and be
/// among the EFAs nearest to its chip. Chips absent from `chips` are not
/// checked (their PCI function is unknown). Empty result = agreement.
pub fn check_table(
    table: &EfaTable,
    chips: &[LocatedChip<'_>],
    efas: &[&PciDevice],
) -> Vec<TableMismatch> {
    let mut out = Vec::new();
    let table_efas = table.efas();
    for efa in efas {
        if !table_efas.contains(&efa.address) {
            out.push(TableMismatch::EfaNotInTable { efa: efa.address });
        }
    }
    for (&chip, &efa_addr) in table.chips() {
        let Some(efa) = efas.iter().find(|e| e.address == efa_addr) else {
            out.push(TableMismatch::EfaMissing {
                chip,
                efa: efa_addr,
            });
            continue;
        };
        let Some(located) = chips.iter().find(|c| c.index == chip) else {
            continue;
        };
        let (best, set) = nearest(located.device, efas.iter().copied());
        let table_proximity = proximity(located.device, efa);
        if let Some(best) = best
            && table_proximity > best
        {
            out.push(TableMismatch::NotNearest {
                chip,
                table_efa: efa_addr,
                table_proximity,
                nearest: set.iter().map(|d| d.address).collect(),
                nearest_proximity: best,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(s: &str) -> InstanceType {
        s.parse().unwrap()
    }

    #[test]
    fn check_value_trn2_chip0() {
        let g = device_groups_for_chip(&it("trn2.48xlarge"), 0).unwrap();
        assert_eq!(g.group1.as_str(), "0000:c9:00.0");
        assert_eq!(g.group4.as_str(), "13713e551cd37c19");
        assert_eq!(g.group8.as_str(), "3593812b8066a078");
        assert_eq!(g.group16.as_str(), "821d14afaf11327d");
        // Aliases map to the same table.
        assert_eq!(
            device_groups_for_chip(&it("trn2u.48xlarge"), 0),
            Some(g.clone())
        );
        let efa: PciAddress = "0000:c9:00.0".parse().unwrap();
        assert_eq!(device_groups_for_efa(&it("trn2.48xlarge"), efa), Some(g));
    }

    #[test]
    fn not_efa_enabled_gets_nothing() {
        for t in [
            "inf2.48xlarge",
            "trn1.2xlarge",
            "p5.48xlarge",
            "trn2.3xlarge",
        ] {
            assert_eq!(device_groups_for_chip(&it(t), 0), None, "{t}");
        }
        assert_eq!(device_groups_for_chip(&it("trn2.48xlarge"), 16), None);
        assert!(EfaTable::for_instance(&it("trn3-dev1.48xlarge")).is_some());
    }

    #[test]
    fn trn1_shared_efa_chips_agree() {
        let table = EfaTable::for_instance(&it("trn1.32xlarge")).unwrap();
        assert_eq!(table.efas().len(), 8);
        for efa in table.efas() {
            let chips = table.chips_for_efa(efa);
            assert_eq!(chips.len(), 2, "{efa}");
            let a = table.groups_for_chip(chips[0]).unwrap();
            let b = table.groups_for_chip(chips[1]).unwrap();
            assert_eq!(a, b, "{efa}");
        }
    }

    #[test]
    fn hash_is_order_and_duplicate_insensitive() {
        let a: PciAddress = "0000:10:19.0".parse().unwrap();
        let b: PciAddress = "0000:10:1a.0".parse().unwrap();
        assert_eq!(
            DeviceGroupId::of_efas([a, b]),
            DeviceGroupId::of_efas([b, a, b])
        );
        assert_ne!(DeviceGroupId::of_efas([a]), DeviceGroupId::of_efas([b]));
    }

    /// The Rust tables must equal the published JSON files kept in `data/`.
    #[test]
    fn tables_match_published_json() {
        let files = [
            ("trn1", include_str!("../data/trn1.json")),
            ("trn1n", include_str!("../data/trn1n.json")),
            ("trn2", include_str!("../data/trn2.json")),
            ("trn3", include_str!("../data/trn3.json")),
            ("trn3pds", include_str!("../data/trn3pds.json")),
        ];
        assert_eq!(files.len(), PUBLISHED_TABLES.len());
        for (name, json) in files {
            let map: BTreeMap<String, String> = serde_json::from_str(json).unwrap();
            let table = EfaTable::published(name).unwrap();
            assert_eq!(map.len(), table.chips().len(), "{name}");
            for (chip, efa) in map {
                let chip: u32 = chip.parse().unwrap();
                assert_eq!(
                    table.efa_for_chip(chip).unwrap().to_string(),
                    efa,
                    "{name} chip {chip}"
                );
            }
        }
        let enabled: BTreeMap<String, bool> =
            serde_json::from_str(include_str!("../data/efa-enabled-instances.json")).unwrap();
        let ours: BTreeSet<&str> = EFA_ENABLED_INSTANCE_TYPES.iter().copied().collect();
        let theirs: BTreeSet<&str> = enabled
            .iter()
            .filter(|(_, v)| **v)
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(ours, theirs);
        let families: BTreeMap<String, String> =
            serde_json::from_str(include_str!("../data/instance-family-mappings.json")).unwrap();
        let ours: BTreeMap<String, String> = FAMILY_TABLES
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(ours, families);
    }
}
