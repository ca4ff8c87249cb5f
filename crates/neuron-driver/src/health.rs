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

use std::path::Path;

use dra_core::{HealthCondition, Severity};

fn counter(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The largest value among the counters that exist.
fn max_of(dir: &Path, names: &[&str]) -> Option<u64> {
    names.iter().filter_map(|n| counter(&dir.join(n))).max()
}

fn condition(dimension: &str, severity: Severity, value: String) -> HealthCondition {
    HealthCondition {
        dimension: dimension.into(),
        severity,
        value,
    }
}

/// The conditions of the chip whose class directory is `chip_dir`
/// (`devices/virtual/neuron_device/neuron<N>`).
pub fn read(chip_dir: &Path) -> Vec<HealthCondition> {
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
        if let Some(n) = max_of(&hw, &names).filter(|n| *n > 0) {
            out.push(condition(dimension, severity, n.to_string()));
        }
    }
    if let Ok(text) = std::fs::read_to_string(hw.join("health_status/unhealthy_components")) {
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
    let cores: Vec<_> = std::fs::read_dir(chip_dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("neuron_core"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    for (dimension, status) in [
        ("core-uncorrectable", "hw_nc_ue_error"),
        ("core-dma-abort", "hw_dma_abort_error"),
    ] {
        let total: u64 = cores
            .iter()
            .filter_map(|c| counter(&c.join("stats/status").join(status).join("total")))
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
        assert!(read(&chip).is_empty(), "zeroed: healthy");
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
        assert_eq!(dims(&read(&chip)), want);
        assert!(
            read(&neuron_dir(&f.sys, 3)).is_empty(),
            "other chips stay healthy"
        );

        // Only the 2.28+ layout: the same conditions.
        let hw = chip.join("stats/hardware");
        for n in sysfs_fixtures::health::NEURON_HARDWARE_COUNTERS {
            std::fs::remove_file(hw.join(n)).unwrap();
        }
        assert_eq!(dims(&read(&chip)), want);
        // Only the old layout, on another chip.
        let other = neuron_dir(&f.sys, 5);
        std::fs::remove_dir_all(other.join("stats/hardware/health_status")).unwrap();
        inject(&f.sys, &Fault::NeuronHbmRepairable { chip: 5 }).unwrap();
        assert_eq!(
            dims(&read(&other)),
            vec![("hbm-ecc-repairable", Severity::Recoverable, "1")]
        );
        // Nothing reported at all: healthy.
        std::fs::remove_dir_all(other.join("stats")).unwrap();
        assert!(read(&other).is_empty());
    }
}
