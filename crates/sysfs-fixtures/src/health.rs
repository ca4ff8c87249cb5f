//! Health counters as the drivers expose them, and faults to inject into
//! them.
//!
//! Every generated tree carries the counters with zero values (see
//! `health-signals.md` in the design references for where they live):
//! - EFA: `class/infiniband/<ibdev>/hw_counters/*` (device counters, with
//!   `no_completion_cmds`) and `ports/1/hw_counters/*` (port counters,
//!   with the error counters behind the degraded rates), each directory with
//!   `lifespan` (the counter cache period in ms, not a counter);
//! - Neuron, both layouts a driver can have: the counters below
//!   `neuron<N>/stats/hardware/` (`sram_ecc_uncorrected`,
//!   `mem_ecc_uncorrected`, `mem_ecc_repairable_uncorrected`), the
//!   `stats/hardware/health_status/` directory of driver 2.28+
//!   (`sram_ecc_err_count`, `hbm_ecc_err_count`,
//!   `repairable_hbm_ecc_err_count`, `hw_error_event`,
//!   `unhealthy_components`), and per core
//!   `neuron_core<M>/stats/status/<name>/{total,present}`.
//!
//! [`inject`] works on a sysfs root path alone, so a test, `cargo xtask`
//! or the e2e suite can break one device of a tree a driver is reading
//! right now. Counters only grow, as on hardware; [`clear`] stands for the
//! reboot or driver reload that resets them.

use std::io;
use std::path::{Path, PathBuf};

use crate::FixtureError;

/// EFA device counters (`hw_counters/`).
pub const EFA_DEVICE_COUNTERS: &[&str] = &[
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
];

/// EFA port counters (`ports/1/hw_counters/`).
pub const EFA_PORT_COUNTERS: &[&str] = &[
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];

/// Neuron chip counters below `stats/hardware/` (before driver 2.28).
pub const NEURON_HARDWARE_COUNTERS: &[&str] = &[
    "sram_ecc_uncorrected",
    "mem_ecc_uncorrected",
    "mem_ecc_repairable_uncorrected",
];

/// Neuron chip counters below `stats/hardware/health_status/` (2.28+).
pub const NEURON_HEALTH_STATUS_COUNTERS: &[&str] = &[
    "sram_ecc_err_count",
    "hbm_ecc_err_count",
    "repairable_hbm_ecc_err_count",
    "hw_error_event",
];

/// Per-core status counters (`neuron_core<M>/stats/status/<name>/`).
pub const NEURON_CORE_STATUS: &[&str] = &[
    "hw_error",
    "hw_hbm_ue_error",
    "hw_repairable_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "hw_collectives_error",
];

/// The directory of one EFA's RDMA device.
pub fn efa_ib_dir(sys: &Path, ibdev: &str) -> PathBuf {
    sys.join("class/infiniband").join(ibdev)
}

/// The class directory of Neuron chip `chip`.
pub fn neuron_dir(sys: &Path, chip: u32) -> PathBuf {
    sys.join(format!("devices/virtual/neuron_device/neuron{chip}"))
}

/// One fault to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `hw_counters/no_completion_cmds` = 1: an admin command timed out and
    /// the driver closed the admin queue.
    EfaAdminQueueClosed { ibdev: String },
    /// Reading the port counters fails (a counter file that cannot be read
    /// as a file stands for the kernel's EIO).
    EfaPortCountersUnreadable { ibdev: String },
    /// A port counter grows by `by` (error-rate faults), and `tx_pkts` with
    /// it: errors of sending come with packets sent.
    EfaPortCounter {
        ibdev: String,
        counter: String,
        by: u64,
    },
    /// `sram_ecc_uncorrected` (both layouts) grows by one.
    NeuronSramUncorrected { chip: u32 },
    /// `mem_ecc_uncorrected` / `hbm_ecc_err_count` grows by one.
    NeuronHbmUncorrected { chip: u32 },
    /// `mem_ecc_repairable_uncorrected` / `repairable_hbm_ecc_err_count`
    /// grows by one.
    NeuronHbmRepairable { chip: u32 },
    /// `health_status/unhealthy_components` lists these.
    NeuronUnhealthyComponents { chip: u32, components: Vec<String> },
    /// `neuron_core<core>/stats/status/<status>/total` grows by one
    /// (`hw_nc_ue_error`, `hw_dma_abort_error`, ...).
    NeuronCoreStatus {
        chip: u32,
        core: u32,
        status: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FixtureError + '_ {
    move |source| FixtureError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, content: &str) -> Result<(), FixtureError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    std::fs::write(path, content).map_err(io_err(path))
}

/// Adds `by` to the counter at `path`, when the file exists (a layout the
/// tree does not have is left alone).
fn grow(path: &Path, by: u64) -> Result<bool, FixtureError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path)(e)),
    };
    let current: u64 = text.trim().parse().unwrap_or(0);
    write(path, &format!("{}\n", current.saturating_add(by)))?;
    Ok(true)
}

/// Grows the first existing counter of `paths`, or fails naming them.
fn grow_any(paths: &[PathBuf], by: u64) -> Result<(), FixtureError> {
    let mut grew = false;
    for p in paths {
        grew |= grow(p, by)?;
    }
    if grew {
        Ok(())
    } else {
        Err(FixtureError::Io {
            path: paths.first().cloned().unwrap_or_default(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such counter in this tree"),
        })
    }
}

/// Injects `fault` into the tree at `sys`.
pub fn inject(sys: &Path, fault: &Fault) -> Result<(), FixtureError> {
    match fault {
        Fault::EfaAdminQueueClosed { ibdev } => grow_any(
            &[efa_ib_dir(sys, ibdev).join("hw_counters/no_completion_cmds")],
            1,
        ),
        Fault::EfaPortCountersUnreadable { ibdev } => {
            let file = efa_ib_dir(sys, ibdev).join("ports/1/hw_counters/tx_pkts");
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&file)(e)),
            }
            // Reading a directory fails with an error other than NotFound,
            // as reading the real file fails with EIO.
            std::fs::create_dir_all(&file).map_err(io_err(&file))
        }
        Fault::EfaPortCounter { ibdev, counter, by } => {
            let port = efa_ib_dir(sys, ibdev).join("ports/1/hw_counters");
            grow_any(&[port.join(counter)], *by)?;
            // The error counters count errors of what the EFA sends: a
            // retransmitted packet is a packet sent, and a failed request
            // or a lost remote comes with traffic. (An unreadable tx_pkts,
            // a directory in its place, is left as it is.)
            let sent = port.join("tx_pkts");
            if counter != "tx_pkts" && sent.is_file() {
                grow(&sent, *by)?;
            }
            Ok(())
        }
        Fault::NeuronSramUncorrected { chip } => {
            let d = neuron_dir(sys, *chip).join("stats/hardware");
            grow_any(
                &[
                    d.join("sram_ecc_uncorrected"),
                    d.join("health_status/sram_ecc_err_count"),
                ],
                1,
            )
        }
        Fault::NeuronHbmUncorrected { chip } => {
            let d = neuron_dir(sys, *chip).join("stats/hardware");
            grow_any(
                &[
                    d.join("mem_ecc_uncorrected"),
                    d.join("health_status/hbm_ecc_err_count"),
                ],
                1,
            )
        }
        Fault::NeuronHbmRepairable { chip } => {
            let d = neuron_dir(sys, *chip).join("stats/hardware");
            grow_any(
                &[
                    d.join("mem_ecc_repairable_uncorrected"),
                    d.join("health_status/repairable_hbm_ecc_err_count"),
                ],
                1,
            )
        }
        Fault::NeuronUnhealthyComponents { chip, components } => write(
            &neuron_dir(sys, *chip).join("stats/hardware/health_status/unhealthy_components"),
            &format!("{}\n", components.join(",")),
        ),
        Fault::NeuronCoreStatus { chip, core, status } => {
            let d = neuron_dir(sys, *chip)
                .join(format!("neuron_core{core}/stats/status"))
                .join(status);
            grow_any(&[d.join("total")], 1)?;
            grow_any(&[d.join("present")], 1)
        }
    }
}

/// Resets every health counter of the tree to zero, as a reboot or a
/// driver reload does (and undoes [`Fault::EfaPortCountersUnreadable`]).
pub fn clear(sys: &Path) -> Result<(), FixtureError> {
    let ib = sys.join("class/infiniband");
    for ibdev in list(&ib)? {
        write_efa_counters(&ib.join(&ibdev))?;
    }
    let neuron = sys.join("devices/virtual/neuron_device");
    for name in list(&neuron)? {
        let Some(chip) = name.strip_prefix("neuron").and_then(|n| n.parse().ok()) else {
            continue;
        };
        let cores = list(&neuron.join(&name))?
            .iter()
            .filter(|n| n.starts_with("neuron_core"))
            .count();
        write_neuron_counters(sys, chip, u32::try_from(cores).unwrap_or(0))?;
    }
    Ok(())
}

fn list(dir: &Path) -> Result<Vec<String>, FixtureError> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err(dir)(e)),
    }
}

/// Writes zeroed EFA counters below the RDMA device directory `ibdir`.
pub(crate) fn write_efa_counters(ibdir: &Path) -> Result<(), FixtureError> {
    for (dir, names) in [
        (ibdir.join("hw_counters"), EFA_DEVICE_COUNTERS),
        (ibdir.join("ports/1/hw_counters"), EFA_PORT_COUNTERS),
    ] {
        for name in names {
            let file = dir.join(name);
            if file.is_dir() {
                std::fs::remove_dir_all(&file).map_err(io_err(&file))?;
            }
            write(&file, "0\n")?;
        }
        write(&dir.join("lifespan"), "12\n")?;
    }
    Ok(())
}

/// Writes zeroed Neuron counters (both layouts) for chip `chip` with
/// `cores` NeuronCores.
pub(crate) fn write_neuron_counters(sys: &Path, chip: u32, cores: u32) -> Result<(), FixtureError> {
    let hw = neuron_dir(sys, chip).join("stats/hardware");
    for name in NEURON_HARDWARE_COUNTERS {
        write(&hw.join(name), "0\n")?;
    }
    for name in NEURON_HEALTH_STATUS_COUNTERS {
        write(&hw.join("health_status").join(name), "0\n")?;
    }
    write(&hw.join("health_status/unhealthy_components"), "\n")?;
    write(&hw.join("health_status/healthcheck_heartbeat"), "0\n")?;
    for core in 0..cores {
        let status = neuron_dir(sys, chip).join(format!("neuron_core{core}/stats/status"));
        for name in NEURON_CORE_STATUS {
            write(&status.join(name).join("total"), "0\n")?;
            write(&status.join(name).join("present"), "0\n")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{generate, instance_types};

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap().trim().to_owned()
    }

    #[test]
    fn every_instance_type_has_zeroed_counters() {
        for it in instance_types() {
            let dir = tempfile::tempdir().unwrap();
            let f = generate(it, dir.path()).unwrap();
            for e in &f.efas {
                let ib = efa_ib_dir(&f.sys, &e.ibdev);
                assert_eq!(
                    read(&ib.join("hw_counters/no_completion_cmds")),
                    "0",
                    "{it}"
                );
                assert_eq!(
                    read(&ib.join("ports/1/hw_counters/retrans_pkts")),
                    "0",
                    "{it}"
                );
            }
            for c in &f.neuron_chips {
                let d = neuron_dir(&f.sys, c.index);
                assert_eq!(read(&d.join("stats/hardware/sram_ecc_uncorrected")), "0");
                assert_eq!(
                    read(&d.join("stats/hardware/health_status/unhealthy_components")),
                    ""
                );
                assert_eq!(
                    read(&d.join(format!(
                        "neuron_core{}/stats/status/hw_nc_ue_error/total",
                        c.core_count - 1
                    ))),
                    "0"
                );
            }
        }
    }

    #[test]
    fn faults_grow_counters_and_clear_resets_them() {
        let dir = tempfile::tempdir().unwrap();
        let f = generate("trn2.48xlarge", dir.path()).unwrap();
        let ibdev = f.efas[0].ibdev.clone();
        let ib = efa_ib_dir(&f.sys, &ibdev);
        inject(
            &f.sys,
            &Fault::EfaAdminQueueClosed {
                ibdev: ibdev.clone(),
            },
        )
        .unwrap();
        inject(
            &f.sys,
            &Fault::EfaAdminQueueClosed {
                ibdev: ibdev.clone(),
            },
        )
        .unwrap();
        assert_eq!(read(&ib.join("hw_counters/no_completion_cmds")), "2");
        inject(
            &f.sys,
            &Fault::EfaPortCountersUnreadable {
                ibdev: ibdev.clone(),
            },
        )
        .unwrap();
        let err = std::fs::read_to_string(ib.join("ports/1/hw_counters/tx_pkts")).unwrap_err();
        assert_ne!(err.kind(), io::ErrorKind::NotFound);

        inject(&f.sys, &Fault::NeuronSramUncorrected { chip: 3 }).unwrap();
        let hw = neuron_dir(&f.sys, 3).join("stats/hardware");
        assert_eq!(read(&hw.join("sram_ecc_uncorrected")), "1");
        assert_eq!(read(&hw.join("health_status/sram_ecc_err_count")), "1");
        inject(
            &f.sys,
            &Fault::NeuronCoreStatus {
                chip: 1,
                core: 2,
                status: "hw_dma_abort_error".into(),
            },
        )
        .unwrap();
        assert!(
            inject(&f.sys, &Fault::NeuronHbmUncorrected { chip: 99 }).is_err(),
            "no such chip"
        );

        clear(&f.sys).unwrap();
        assert_eq!(read(&ib.join("hw_counters/no_completion_cmds")), "0");
        assert_eq!(read(&ib.join("ports/1/hw_counters/tx_pkts")), "0");
        assert_eq!(read(&hw.join("sram_ecc_uncorrected")), "0");
    }
}
