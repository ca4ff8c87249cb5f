//! Logical NeuronCores: which LNC a claim gets and which core indices that
//! makes visible.
//!
//! LNC is how many physical NeuronCores the Neuron runtime fuses into one
//! logical core. A chip with `C` physical cores has `C / LNC` logical cores;
//! logical cores are numbered across the node by chip index, so chip `N`
//! owns logical cores `N*L … N*L+L-1` with `L = C / LNC` (trn2, LNC=2:
//! chip 0 → 0-3, chip 1 → 4-7; LNC=1: chip 1 → 8-15). That is the numbering
//! `NEURON_RT_VISIBLE_CORES` uses.

use std::fmt;

use topology::NeuronGeneration;

use crate::config::NeuronConfig;
use crate::discovery::{ChipType, NeuronChip};

/// A valid LNC for a given chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogicalNeuronCore {
    One,
    Two,
}

impl LogicalNeuronCore {
    pub fn get(self) -> u32 {
        match self {
            LogicalNeuronCore::One => 1,
            LogicalNeuronCore::Two => 2,
        }
    }
}

impl fmt::Display for LogicalNeuronCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

/// An LNC the chip does not support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "NeuronConfig logicalNeuronCore: {value} is not supported on chip {index} ({chip_type}, {cores} physical cores); allowed on this chip: {allowed}"
)]
pub struct LncError {
    pub value: u32,
    pub index: u32,
    pub chip_type: &'static str,
    pub cores: u32,
    pub allowed: &'static str,
}

/// Whether LNC=2 exists on this chip: Trainium2/Trainium3 (8 physical
/// cores); for a chip of unknown type, 8 physical cores.
pub fn supports_lnc2(chip: &NeuronChip) -> bool {
    match chip.chip_type {
        ChipType::Known(NeuronGeneration::Trainium2 | NeuronGeneration::Trainium3) => {
            chip.core_count.is_multiple_of(2)
        }
        ChipType::Known(_) => false,
        ChipType::Unknown => chip.core_count == 8,
    }
}

/// The instance default: 2 where LNC=2 exists, else 1.
pub fn default_lnc(chip: &NeuronChip) -> LogicalNeuronCore {
    if supports_lnc2(chip) {
        LogicalNeuronCore::Two
    } else {
        LogicalNeuronCore::One
    }
}

/// The effective LNC of `chip` under `config` (already resolved class vs
/// claim by `dra-core`): the configured value if the chip supports it, the
/// default when none is configured.
pub fn effective_lnc(
    chip: &NeuronChip,
    config: Option<&NeuronConfig>,
) -> Result<LogicalNeuronCore, LncError> {
    let allowed = if supports_lnc2(chip) { "1, 2" } else { "1" };
    let err = |value| LncError {
        value,
        index: chip.index,
        chip_type: chip.chip_type.name(),
        cores: chip.core_count,
        allowed,
    };
    match config.and_then(|c| c.logical_neuron_core) {
        None => Ok(default_lnc(chip)),
        Some(1) => Ok(LogicalNeuronCore::One),
        Some(2) if supports_lnc2(chip) => Ok(LogicalNeuronCore::Two),
        Some(v) => Err(err(v)),
    }
}

/// The effective LNC of a core device of `chip` (a single physical core):
/// the configured value if the chip supports it, else 1. A physical core
/// is an LNC=1 unit; LNC=2 fuses two of them, so it is only used when asked
/// for (and then needs whole pairs, checked at prepare).
pub fn effective_core_lnc(
    chip: &NeuronChip,
    config: Option<&NeuronConfig>,
) -> Result<LogicalNeuronCore, LncError> {
    match config.and_then(|c| c.logical_neuron_core) {
        None => Ok(LogicalNeuronCore::One),
        Some(_) => effective_lnc(chip, config),
    }
}

/// Logical core indices of `chip` under `lnc`.
pub fn logical_cores(chip: &NeuronChip, lnc: LogicalNeuronCore) -> std::ops::Range<u32> {
    let per_chip = (chip.core_count / lnc.get()).max(1);
    let start = chip.index * per_chip;
    start..start + per_chip
}

/// `0-7`, `0-3,8-11`, `5`: sorted, merged, comma-separated inclusive ranges.
pub fn range_list(indices: impl IntoIterator<Item = u32>) -> String {
    let mut all: Vec<u32> = indices.into_iter().collect();
    all.sort_unstable();
    all.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut iter = all.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while end
            .checked_add(1)
            .is_some_and(|next| iter.peek() == Some(&next))
        {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn chip(index: u32, cores: u32, t: ChipType) -> NeuronChip {
        NeuronChip {
            index,
            core_count: cores,
            connected: None,
            chip_type: t,
            device_node: PathBuf::from(format!("/dev/neuron{index}")),
            pci: None,
        }
    }

    #[test]
    fn ranges() {
        assert_eq!(range_list([]), "");
        assert_eq!(range_list([5]), "5");
        assert_eq!(range_list(0..8), "0-7");
        assert_eq!(range_list((0..4).chain(8..12)), "0-3,8-11");
        assert_eq!(range_list([3, 1, 2, 2, 9]), "1-3,9");
    }

    #[test]
    fn numbering_and_rules() {
        let trn2 = ChipType::Known(NeuronGeneration::Trainium2);
        let trn1 = ChipType::Known(NeuronGeneration::Trainium1);
        let c = chip(1, 8, trn2);
        assert_eq!(logical_cores(&c, LogicalNeuronCore::Two), 4..8);
        assert_eq!(logical_cores(&c, LogicalNeuronCore::One), 8..16);
        assert_eq!(default_lnc(&c), LogicalNeuronCore::Two);
        let t1 = chip(3, 2, trn1);
        assert_eq!(logical_cores(&t1, LogicalNeuronCore::One), 6..8);
        assert_eq!(default_lnc(&t1), LogicalNeuronCore::One);
        let two = NeuronConfig {
            logical_neuron_core: Some(2),
            ultraserver_mode: None,
        };
        assert_eq!(
            effective_lnc(&t1, Some(&two)).unwrap_err().to_string(),
            "NeuronConfig logicalNeuronCore: 2 is not supported on chip 3 (Trainium, 2 physical cores); allowed on this chip: 1"
        );
        let three = NeuronConfig {
            logical_neuron_core: Some(3),
            ultraserver_mode: None,
        };
        assert_eq!(
            effective_lnc(&c, Some(&three)).unwrap_err().to_string(),
            "NeuronConfig logicalNeuronCore: 3 is not supported on chip 1 (Trainium2, 8 physical cores); allowed on this chip: 1, 2"
        );
        // Unknown type: the core count decides.
        assert!(supports_lnc2(&chip(0, 8, ChipType::Unknown)));
        assert!(!supports_lnc2(&chip(0, 2, ChipType::Unknown)));
    }
}
