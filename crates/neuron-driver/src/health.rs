//! A Neuron chip's health, from the neuron driver's sysfs counters (see
//! `docs/health.md`).
//!
//! Both layouts are probed, and a file that does not exist is "not
//! reported": the plain counters below `neuron<N>/stats/hardware/` and the
//! `stats/hardware/health_status/` directory of driver 2.28+ (2.31 moved
//! nodes between them); a condition counts the larger of the two.
//!
//! - Fatal `sram-ecc-uncorrected`: `sram_ecc_uncorrected` /
//!   `health_status/sram_ecc_err_count` > 0.
//! - Fatal `hbm-ecc-uncorrected`: `mem_ecc_uncorrected` /
//!   `health_status/hbm_ecc_err_count` > 0 (non-repairable).
//! - Recoverable `hbm-ecc-repairable`: `mem_ecc_repairable_uncorrected` /
//!   `health_status/repairable_hbm_ecc_err_count` > 0; a driver reload or
//!   reboot repairs the row, until then the chip takes no new work.
//! - Fatal `unhealthy-components`: a non-empty
//!   `health_status/unhealthy_components` (value: the list, `+`-joined).
//! - Fatal `core-uncorrectable` / `core-dma-abort`: the sum over cores of
//!   `neuron_core<M>/stats/status/hw_nc_ue_error/total` /
//!   `hw_dma_abort_error/total` > 0.
//!
//! Counters only grow until a reboot or a driver reload resets them; that
//! is what clears these conditions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use dra_core::{HealthCondition, Severity};
use topology::held::HeldFile;

/// The counter conditions, each with its file in the plain layout and in
/// the `health_status/` one.
const COUNTERS: [(&str, Severity, [&str; 2]); 3] = [
    (
        "sram-ecc-uncorrected",
        Severity::Fatal,
        ["sram_ecc_uncorrected", "health_status/sram_ecc_err_count"],
    ),
    (
        "hbm-ecc-uncorrected",
        Severity::Fatal,
        ["mem_ecc_uncorrected", "health_status/hbm_ecc_err_count"],
    ),
    (
        "hbm-ecc-repairable",
        Severity::Recoverable,
        [
            "mem_ecc_repairable_uncorrected",
            "health_status/repairable_hbm_ecc_err_count",
        ],
    ),
];

/// The per-core conditions and the status directory each sums.
const CORE_STATUSES: [(&str, &str); 2] = [
    ("core-uncorrectable", "hw_nc_ue_error"),
    ("core-dma-abort", "hw_dma_abort_error"),
];

/// The health files of the node's chips, held open between scans
/// ([`topology::held`], whose policy decides what a failed read means), by
/// chip directory.
///
/// A rescan of a trn2 reads about 23 files per chip, 370 for the node,
/// every 10 s: most of what the driver costs at rest; held, each is one
/// `pread`. A file that cannot be read counts as not reported, as one that
/// does not exist: no condition of a chip stands for an unreadable counter.
/// The inventory drops everything at each full discovery.
#[derive(Debug, Default)]
pub struct HeldFiles {
    chips: HashMap<PathBuf, ChipFiles>,
}

/// One chip's health files.
#[derive(Debug)]
struct ChipFiles {
    /// Per [`COUNTERS`] entry, its two files.
    counters: [[HeldFile; 2]; 3],
    unhealthy_components: HeldFile,
    /// Per `neuron_core<M>` directory, its [`CORE_STATUSES`] totals; listed
    /// once (a chip's cores change only with the chip, which a full
    /// discovery sees), again while the chip cannot be listed.
    cores: Option<Vec<[HeldFile; 2]>>,
}

impl ChipFiles {
    fn new(chip_dir: &Path) -> Self {
        let hw = chip_dir.join("stats/hardware");
        ChipFiles {
            counters: COUNTERS.map(|(_, _, names)| names.map(|n| HeldFile::new(hw.join(n)))),
            unhealthy_components: HeldFile::new(hw.join("health_status/unhealthy_components")),
            cores: None,
        }
    }

    fn cores(&mut self, chip_dir: &Path) -> &mut [[HeldFile; 2]] {
        if self.cores.is_none()
            && let Ok(entries) = std::fs::read_dir(chip_dir)
        {
            let status = |core: &Path| {
                CORE_STATUSES
                    .map(|(_, s)| HeldFile::new(core.join("stats/status").join(s).join("total")))
            };
            self.cores = Some(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("neuron_core"))
                    .map(|e| status(&e.path()))
                    .collect(),
            );
        }
        self.cores.as_deref_mut().unwrap_or_default()
    }
}

fn counter(file: &mut HeldFile) -> Option<u64> {
    file.read_u64().ok().flatten()
}

fn condition(dimension: &str, severity: Severity, value: String) -> HealthCondition {
    HealthCondition {
        dimension: dimension.into(),
        severity,
        value,
    }
}

/// The conditions of the chip whose class directory is `chip_dir`
/// (`devices/virtual/neuron_device/neuron<N>`), read through `held`.
pub fn read(chip_dir: &Path, held: &mut HeldFiles) -> Vec<HealthCondition> {
    if !held.chips.contains_key(chip_dir) {
        held.chips
            .insert(chip_dir.to_path_buf(), ChipFiles::new(chip_dir));
    }
    let Some(files) = held.chips.get_mut(chip_dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for ((dimension, severity, _), pair) in COUNTERS.iter().zip(&mut files.counters) {
        // The larger of the two layouts' counters that exist.
        if let Some(n) = pair.iter_mut().filter_map(counter).max().filter(|n| *n > 0) {
            out.push(condition(dimension, *severity, n.to_string()));
        }
    }
    if let Ok(Some(text)) = files.unhealthy_components.read_text() {
        let components: Vec<&str> = text
            .split([',', '\n', ' '])
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        if !components.is_empty() {
            out.push(condition(
                "unhealthy-components",
                Severity::Fatal,
                components.join("+"),
            ));
        }
    }
    let cores = files.cores(chip_dir);
    for (i, (dimension, _)) in CORE_STATUSES.iter().enumerate() {
        let total: u64 = cores.iter_mut().filter_map(|c| counter(&mut c[i])).sum();
        if total > 0 {
            out.push(condition(dimension, Severity::Fatal, total.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sysfs_fixtures::health::{Fault, inject, neuron_dir};

    fn dims(c: &[HealthCondition]) -> Vec<(&str, Severity, &str)> {
        c.iter()
            .map(|c| (c.dimension.as_str(), c.severity, c.value.as_str()))
            .collect()
    }

    #[test]
    fn every_signal_in_both_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate("trn2.48xlarge", dir.path()).unwrap();
        let chip = neuron_dir(&f.sys, 2);
        // One set of held files throughout, as a driver keeps them: the
        // faults are written after the first read opened the files.
        let mut held = HeldFiles::default();
        assert!(read(&chip, &mut held).is_empty(), "zeroed: healthy");
        assert!(
            held.chips
                .values()
                .any(|c| c.unhealthy_components.is_open()),
            "held open"
        );
        let faults = [
            Fault::NeuronSramUncorrected { chip: 2 },
            Fault::NeuronHbmUncorrected { chip: 2 },
            Fault::NeuronHbmRepairable { chip: 2 },
            Fault::NeuronUnhealthyComponents {
                chip: 2,
                components: vec!["hbm".into(), "link_efa".into()],
            },
            Fault::NeuronCoreStatus {
                chip: 2,
                core: 1,
                status: "hw_nc_ue_error".into(),
            },
            Fault::NeuronCoreStatus {
                chip: 2,
                core: 3,
                status: "hw_dma_abort_error".into(),
            },
        ];
        for fault in &faults {
            inject(&f.sys, fault).unwrap();
        }
        let want = vec![
            ("sram-ecc-uncorrected", Severity::Fatal, "1"),
            ("hbm-ecc-uncorrected", Severity::Fatal, "1"),
            ("hbm-ecc-repairable", Severity::Recoverable, "1"),
            ("unhealthy-components", Severity::Fatal, "hbm+link_efa"),
            ("core-uncorrectable", Severity::Fatal, "1"),
            ("core-dma-abort", Severity::Fatal, "1"),
        ];
        assert_eq!(dims(&read(&chip, &mut held)), want);
        assert!(
            read(&neuron_dir(&f.sys, 3), &mut held).is_empty(),
            "other chips stay healthy"
        );

        // Only the 2.28+ layout: the same conditions.
        let hw = chip.join("stats/hardware");
        for n in sysfs_fixtures::health::NEURON_HARDWARE_COUNTERS {
            std::fs::remove_file(hw.join(n)).unwrap();
        }
        assert_eq!(dims(&read(&chip, &mut held)), want);
        // Only the old layout, on another chip.
        let other = neuron_dir(&f.sys, 5);
        std::fs::remove_dir_all(other.join("stats/hardware/health_status")).unwrap();
        inject(&f.sys, &Fault::NeuronHbmRepairable { chip: 5 }).unwrap();
        assert_eq!(
            dims(&read(&other, &mut held)),
            vec![("hbm-ecc-repairable", Severity::Recoverable, "1")]
        );
        // Nothing reported at all: healthy. (Fresh handles: a removed
        // sysfs attribute fails a held handle's read with ENODEV, which
        // sends the read to the path, but a removed regular file stays
        // readable through a held handle.)
        std::fs::remove_dir_all(other.join("stats")).unwrap();
        assert!(read(&other, &mut HeldFiles::default()).is_empty());
    }
}
