//! An EFA's health, from its `hw_counters` (see `docs/health.md`).
//!
//! - Fatal `admin-queue-closed`: `hw_counters/no_completion_cmds` > 0. An
//!   admin command timed out and the kernel driver closed the admin queue;
//!   every later admin command fails. Value: the count.
//! - Fatal `port-counters-unreadable`: reading a port counter
//!   (`ports/1/hw_counters/`: the rate counters below and `tx_pkts`) fails
//!   with an error other than "no such file" (the kernel answers EIO once
//!   the admin queue is closed). Value: `eio`.
//! - Fatal `device-lost`: set by the inventory for a published EFA that
//!   vanished or was unbound (value `vanished` or `unbound`).
//! - Degraded, per second between two scans: `rdma_read_wr_err`,
//!   `rdma_write_wr_err`, `unresponsive_remote_events`,
//!   `impaired_remote_conn_events`, `retrans_timeout_events` above 100/s,
//!   `retrans_pkts` above 1000/s (AWS's node monitoring agent thresholds).
//!   Dimension `<counter>-rate` with dashes, value: the rate.
//!
//! The rate counters count errors of what the EFA sends (work requests it
//! posted, packets it retransmitted, remotes it sent to). While `tx_pkts`
//! has not moved since the last sample the EFA sent nothing, so they are
//! not read: the sample is carried forward to this scan, and the rates are
//! zero. An idle p5 therefore reads two counters per EFA per scan instead of
//! eight (a third of the driver's CPU at rest went to those reads); the first
//! packet sent brings the full read back at the next scan, and any growth
//! the skipped reads missed is counted then, over one interval.
//!
//! A counter file that does not exist is "not reported" (older kernel
//! drivers, older Nitro versions), never unhealthy. Counters only grow
//! until a reboot or a driver reload; a fatal condition therefore stays
//! until then, and a rate clears at the first scan under the threshold.

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use topology::held::HeldFile;

use dra_core::{HealthCondition, Severity};

/// The port counter read for `port-counters-unreadable` besides the rate
/// counters: reported by every EFA generation.
pub const PROBE_COUNTER: &str = "tx_pkts";

/// Error counters behind the degraded rates, with their per-second limits.
pub const RATE_THRESHOLDS: [(&str, f64); 6] = [
    ("rdma_read_wr_err", 100.0),
    ("rdma_write_wr_err", 100.0),
    ("unresponsive_remote_events", 100.0),
    ("impaired_remote_conn_events", 100.0),
    ("retrans_timeout_events", 100.0),
    ("retrans_pkts", 1000.0),
];

/// What one read of the rate counters saw, for the next read's rates: the
/// probe counter (`tx_pkts`), then the [`RATE_THRESHOLDS`] counters in
/// order (`None`: not reported).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CounterSample {
    at: Instant,
    sent: Option<u64>,
    values: [Option<u64>; RATE_THRESHOLDS.len()],
}

/// Is this read error the device's (EIO and the like) rather than ours
/// (permission) or a counter that is not there? A stale handle never gets
/// here: the held reader reads the path again and answers for it.
fn is_device_error(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    )
}

/// The counter files of one EFA, held open between scans
/// ([`topology::held`], whose policy decides what a failed read means).
///
/// An idle rescan of a p5 read 256 counters (8 per EFA): most of what a
/// driver at rest costs. So the seven counters judged (`no_completion_cmds`
/// and the rate counters, these only after packets were sent: see the
/// module docs) are held open and read
/// with one `pread` each; a counter the kernel stops answering fails that
/// `pread` with EIO at once.
///
/// The probe counter (`tx_pkts`) is held and read so too. (Until
/// 2026-12-06 it was opened anew on every scan through the port counter
/// directory, so that the sysfs fixtures' unreadable counter, a directory
/// in the file's place, was seen at once; a held handle of the old file
/// keeps reading it. The kernel's EIO reaches a held handle at once, and
/// the fixtures' stand-in is seen at the next full discovery, which drops
/// every handle. That saves an `openat` with its lookup and a `close` per
/// EFA and scan.)
#[derive(Debug)]
pub struct EfaCounters {
    /// `no_completion_cmds`, then the [`RATE_THRESHOLDS`] counters in order.
    held: [HeldFile; HELD],
    /// [`PROBE_COUNTER`].
    sent: HeldFile,
}

/// Counters held open: `no_completion_cmds` and the rate counters.
const HELD: usize = 1 + RATE_THRESHOLDS.len();

/// The port counters' directory under the RDMA device directory.
const PORT_COUNTERS: &str = "ports/1/hw_counters";

impl EfaCounters {
    /// The counters of the EFA whose RDMA device directory is `ibdir`;
    /// each is opened at its first read.
    pub fn new(ibdir: PathBuf) -> Self {
        let port = ibdir.join(PORT_COUNTERS);
        EfaCounters {
            held: std::array::from_fn(|slot| match slot.checked_sub(1) {
                None => HeldFile::new(ibdir.join("hw_counters/no_completion_cmds")),
                Some(rate) => HeldFile::new(port.join(RATE_THRESHOLDS[rate].0)),
            }),
            sent: HeldFile::new(port.join(PROBE_COUNTER)),
        }
    }
}

/// The conditions of the EFA whose counters are `counters`, and the
/// sample for the next call's rates.
pub fn read(
    counters: &mut EfaCounters,
    previous: Option<&CounterSample>,
    now: Instant,
) -> (Vec<HealthCondition>, Option<CounterSample>) {
    let mut conditions = Vec::new();
    match counters.held[0].read_u64() {
        Ok(Some(n)) if n > 0 => conditions.push(HealthCondition {
            dimension: "admin-queue-closed".into(),
            severity: Severity::Fatal,
            value: n.to_string(),
        }),
        Ok(_) => {}
        Err(e) if is_device_error(&e) => conditions.push(HealthCondition {
            dimension: "admin-queue-closed".into(),
            severity: Severity::Fatal,
            value: "eio".into(),
        }),
        Err(_) => {}
    }
    // One counter every EFA reports is read first, so that the signal is
    // there even where the rate counters are not.
    // Every port counter read is an admin command to the device, so once
    // the admin queue is closed they all fail alike: when this one fails,
    // the others tell nothing more.
    let (sent, mut unreadable) = match counters.sent.read_u64() {
        Ok(sent) => (sent, false),
        Err(e) => (None, is_device_error(&e)),
    };
    let quiet = previous.filter(|p| !unreadable && sent.is_some() && p.sent == sent);
    let mut degraded = Vec::new();
    let sample = match quiet {
        // Nothing sent since the last sample: no error of sending either.
        Some(prev) => CounterSample { at: now, ..*prev },
        None => {
            let mut values = [None; RATE_THRESHOLDS.len()];
            if !unreadable {
                for (slot, value) in values.iter_mut().enumerate() {
                    match counters.held[1 + slot].read_u64() {
                        Ok(v) => *value = v,
                        Err(e) if is_device_error(&e) => unreadable = true,
                        Err(_) => {}
                    }
                }
            }
            let sample = CounterSample {
                at: now,
                sent,
                values,
            };
            if let Some(prev) = previous {
                degraded = rates(prev, &sample);
            }
            sample
        }
    };
    if unreadable {
        conditions.push(HealthCondition {
            dimension: "port-counters-unreadable".into(),
            severity: Severity::Fatal,
            value: "eio".into(),
        });
    }
    conditions.extend(degraded);
    (conditions, Some(sample))
}

/// The degraded rates between two samples.
fn rates(prev: &CounterSample, now: &CounterSample) -> Vec<HealthCondition> {
    let seconds = now.at.duration_since(prev.at).as_secs_f64();
    if seconds <= 0.0 {
        return Vec::new();
    }
    (RATE_THRESHOLDS.iter().enumerate())
        .filter_map(|(slot, (counter, limit))| {
            let (Some(now_v), Some(then_v)) = (now.values[slot], prev.values[slot]) else {
                return None;
            };
            let rate = now_v.saturating_sub(then_v) as f64 / seconds;
            (rate > *limit).then(|| HealthCondition {
                dimension: format!("{}-rate", counter.replace('_', "-")),
                severity: Severity::Degraded,
                value: format!("{}", rate.round() as u64),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use sysfs_fixtures::health::{Fault, efa_ib_dir, inject};

    fn dims(c: &[HealthCondition]) -> Vec<(String, Severity, String)> {
        c.iter()
            .map(|c| (c.dimension.clone(), c.severity, c.value.clone()))
            .collect()
    }

    #[test]
    fn fatal_degraded_and_not_reported() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let ibdev = f.efas[0].ibdev.clone();
        let ib = efa_ib_dir(&f.sys, &ibdev);
        let mut dirs = EfaCounters::new(ib.clone());
        let t0 = Instant::now();
        let (c, s0) = read(&mut dirs, None, t0);
        assert!(c.is_empty(), "zeroed counters: healthy");

        // 5000 retransmitted packets in 2 s: 2500/s > 1000/s.
        inject(
            &f.sys,
            &Fault::EfaPortCounter {
                ibdev: ibdev.clone(),
                counter: "retrans_pkts".into(),
                by: 5000,
            },
        )
        .unwrap();
        let t1 = t0 + Duration::from_secs(2);
        let (c, s1) = read(&mut dirs, s0.as_ref(), t1);
        assert_eq!(
            dims(&c),
            vec![(
                "retrans-pkts-rate".into(),
                Severity::Degraded,
                "2500".into()
            )]
        );
        // Next scan, no growth: the rate clears.
        let (c, _) = read(&mut dirs, s1.as_ref(), t1 + Duration::from_secs(2));
        assert!(c.is_empty());

        inject(
            &f.sys,
            &Fault::EfaAdminQueueClosed {
                ibdev: ibdev.clone(),
            },
        )
        .unwrap();
        inject(
            &f.sys,
            &Fault::EfaPortCountersUnreadable {
                ibdev: ibdev.clone(),
            },
        )
        .unwrap();
        // Fresh handles, as after a full discovery: the fixture's stand-in
        // for EIO (a directory in the file's place) is seen by an open.
        let (c, _) = read(&mut EfaCounters::new(ib.clone()), None, t1);
        assert_eq!(
            dims(&c),
            vec![
                ("admin-queue-closed".into(), Severity::Fatal, "1".into()),
                (
                    "port-counters-unreadable".into(),
                    Severity::Fatal,
                    "eio".into()
                ),
            ]
        );

        // A driver without the counters reports nothing: healthy. (Fresh
        // handles: a removed sysfs attribute fails a held handle's read with
        // ENODEV, which sends the read to the path, but a removed regular
        // file stays readable through a held handle.)
        std::fs::remove_dir_all(ib.join("hw_counters")).unwrap();
        std::fs::remove_dir_all(ib.join("ports/1/hw_counters")).unwrap();
        let mut dirs = EfaCounters::new(ib.clone());
        let (c, _) = read(&mut dirs, None, t1);
        assert!(c.is_empty());
        assert!(!dirs.held.iter().any(HeldFile::is_open) && !dirs.sent.is_open());
    }

    /// While `tx_pkts` stands still the rate counters are not read, and the
    /// sample moves on to the scan; the first packet sent brings the read
    /// back, and growth the skipped reads missed is counted over the one
    /// interval since the last scan.
    #[test]
    fn rate_counters_are_read_only_after_packets_were_sent() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let ib = efa_ib_dir(&f.sys, &f.efas[0].ibdev);
        let port = ib.join(PORT_COUNTERS);
        let t0 = Instant::now();
        let (c, s0) = read(&mut EfaCounters::new(ib.clone()), None, t0);
        assert!(c.is_empty());

        // Errors counted without a packet sent (not what an EFA does, but
        // it shows the counters are not read): no rate, not opened.
        std::fs::write(port.join("retrans_pkts"), "5000\n").unwrap();
        let mut dirs = EfaCounters::new(ib.clone());
        let t1 = t0 + Duration::from_secs(10);
        let (c, s1) = read(&mut dirs, s0.as_ref(), t1);
        assert!(c.is_empty(), "{c:?}");
        assert!(
            !dirs.held[1..].iter().any(HeldFile::is_open),
            "rates not read"
        );
        let s1 = s1.unwrap();
        assert_eq!((s1.at, s1.values), (t1, s0.unwrap().values));

        // One packet sent: read again; the 5000 count over the last 2 s.
        std::fs::write(port.join(PROBE_COUNTER), "1\n").unwrap();
        let (c, s2) = read(&mut dirs, Some(&s1), t1 + Duration::from_secs(2));
        assert_eq!(
            dims(&c),
            vec![(
                "retrans-pkts-rate".into(),
                Severity::Degraded,
                "2500".into()
            )]
        );
        assert!(dirs.held[1..].iter().all(HeldFile::is_open));
        assert_eq!(s2.unwrap().sent, Some(1));
    }

    /// Each slot is the counter it is judged as: `no_completion_cmds`, then
    /// the rate counters in order below the port, and the probe; they are
    /// held open and read again on every call.
    #[test]
    fn held_counters_are_the_judged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let port = dir.path().join(PORT_COUNTERS);
        std::fs::create_dir_all(&port).unwrap();
        std::fs::create_dir_all(dir.path().join("hw_counters")).unwrap();
        let mut counters = EfaCounters::new(dir.path().to_path_buf());
        assert_eq!(
            counters.held[0].path(),
            dir.path().join("hw_counters/no_completion_cmds")
        );
        for (slot, (name, _)) in RATE_THRESHOLDS.iter().enumerate() {
            assert_eq!(counters.held[1 + slot].path(), port.join(name));
        }
        assert_eq!(counters.sent.path(), port.join(PROBE_COUNTER));
        let rate = port.join(RATE_THRESHOLDS[0].0);
        std::fs::write(&rate, "18446744073709551615\n").unwrap();
        assert_eq!(counters.held[1].read_u64().unwrap(), Some(u64::MAX));
        assert!(counters.held[1].is_open(), "held open");
        std::fs::write(&rate, "7\n").unwrap();
        assert_eq!(counters.held[1].read_u64().unwrap(), Some(7), "read again");
        assert_eq!(counters.held[0].read_u64().unwrap(), None, "not reported");

        std::fs::write(port.join(PROBE_COUNTER), "3\n").unwrap();
        assert_eq!(counters.sent.read_u64().unwrap(), Some(3));
        assert!(counters.sent.is_open(), "held open");
        // The fixtures' unreadable counter, seen by a fresh handle.
        std::fs::remove_file(port.join(PROBE_COUNTER)).unwrap();
        std::fs::create_dir(port.join(PROBE_COUNTER)).unwrap();
        let mut fresh = EfaCounters::new(dir.path().to_path_buf());
        assert!(fresh.sent.read_u64().is_err_and(|e| is_device_error(&e)));
    }

    /// EIO is the device's answer; a counter that is not there, or that we
    /// may not read, is not.
    #[test]
    fn device_errors_are_told_from_ours() {
        let err = |e: nix::errno::Errno| io::Error::from_raw_os_error(e as i32);
        assert!(is_device_error(&err(nix::errno::Errno::EIO)));
        assert!(is_device_error(&err(nix::errno::Errno::EISDIR)));
        assert!(!is_device_error(&err(nix::errno::Errno::ENOENT)));
        assert!(!is_device_error(&err(nix::errno::Errno::EACCES)));
    }
}
