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
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use dra_core::{HealthCondition, Severity};

/// The health files of the node's chips, held open between scans, and each
/// chip's NeuronCore directories.
///
/// A rescan of a trn2 reads about 23 files per chip, 370 for the node,
/// every 10 s: most of what the driver costs at rest. A file read by path
/// resolves the whole path and makes five system calls; a held one is read
/// again with one `pread` at offset 0, which makes sysfs run the
/// attribute's `show` again, so the value is as fresh as a new open's. A
/// handle whose attribute the kernel removed (driver reload, chip gone:
/// ENODEV) is dropped and the file read by path. A file that does not exist
/// is tried again on the next scan, so one that appears is seen at once.
/// The inventory drops everything at each full discovery.
#[derive(Debug, Default)]
pub struct HeldFiles {
    files: HashMap<PathBuf, File>,
    cores: HashMap<PathBuf, Vec<PathBuf>>,
}

/// Longest file read: a sysfs attribute is at most a page.
const FILE_BYTES: usize = 4096;

impl HeldFiles {
    /// The text of the file at `path`, `None` when it cannot be read.
    fn text(&mut self, path: &Path) -> Option<String> {
        if !self.files.contains_key(path) {
            let file = File::open(path).ok()?;
            self.files.insert(path.to_path_buf(), file);
        }
        let file = self.files.get(path)?;
        let mut buf = [0u8; FILE_BYTES];
        match file.read_at(&mut buf, 0) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => {
                // Stale (ENODEV) or failing: the path decides, and the
                // next read opens the file again.
                self.files.remove(path);
                std::fs::read_to_string(path).ok()
            }
        }
    }

    fn counter(&mut self, path: &Path) -> Option<u64> {
        self.text(path)?.trim().parse().ok()
    }

    /// The largest value among the counters that exist.
    fn max_of(&mut self, dir: &Path, names: &[&str]) -> Option<u64> {
        names
            .iter()
            .filter_map(|n| self.counter(&dir.join(n)))
            .max()
    }

    /// The `neuron_core<M>` directories of the chip at `chip_dir`, listed
    /// once (a chip's cores change only with the chip, which a full
    /// discovery sees).
    fn cores(&mut self, chip_dir: &Path) -> Vec<PathBuf> {
        if let Some(cores) = self.cores.get(chip_dir) {
            return cores.clone();
        }
        let Ok(entries) = std::fs::read_dir(chip_dir) else {
            return Vec::new();
        };
        let cores: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("neuron_core"))
            .map(|e| e.path())
            .collect();
        self.cores.insert(chip_dir.to_path_buf(), cores.clone());
        cores
    }
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
    let hw = chip_dir.join("stats/hardware");
    let mut out = Vec::new();
    for (dimension, severity, names) in [
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
    ] {
        if let Some(n) = held.max_of(&hw, &names).filter(|n| *n > 0) {
            out.push(condition(dimension, severity, n.to_string()));
        }
    }
    if let Some(text) = held.text(&hw.join("health_status/unhealthy_components")) {
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
    let cores = held.cores(chip_dir);
    for (dimension, status) in [
        ("core-uncorrectable", "hw_nc_ue_error"),
        ("core-dma-abort", "hw_dma_abort_error"),
    ] {
        let total: u64 = cores
            .iter()
            .filter_map(|c| held.counter(&c.join("stats/status").join(status).join("total")))
            .sum();
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
        assert!(!held.files.is_empty(), "held open");
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
