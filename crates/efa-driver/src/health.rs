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
//! A counter file that does not exist is "not reported" (older kernel
//! drivers, older Nitro versions), never unhealthy. Counters only grow
//! until a reboot or a driver reload; a fatal condition therefore stays
//! until then, and a rate clears at the first scan under the threshold.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

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

/// What one read of the rate counters saw, for the next read's rates.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSample {
    at: Instant,
    values: BTreeMap<&'static str, u64>,
}

/// Reads the counter at `path`: `Ok(None)` when not reported.
fn read_counter(path: &Path) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse_counter(&text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn parse_counter(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// Is this read error the device's (EIO and the like) rather than ours
/// (permission)?
fn is_device_error(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    )
}

/// The counter files of one EFA, held open between scans.
///
/// An idle rescan of a p5 reads 256 counters (8 per EFA): most of what a
/// driver at rest costs. A read by path resolves the whole sysfs path
/// through the `infiniband` class link and makes five system calls (open,
/// the size, two reads, close). So the seven counters judged on every scan
/// (`no_completion_cmds` and the rate counters) are opened once and then
/// read with one `pread` at offset 0 each, which makes sysfs run the
/// attribute's `show` again: the value is as fresh as a new open's, and a
/// counter the kernel stops answering fails that `pread` with EIO at once.
///
/// The probe counter (`tx_pkts`) is opened anew on every scan, relative to
/// the held port counter directory (`openat`, one `read`, `close`). That
/// keeps one read per EFA that follows the directory entry itself, which is
/// what the sysfs fixtures model an unreadable counter with (a regular file
/// cannot fail a read with EIO, so the fixture puts a directory in its
/// place, which a held handle of the old file would never see).
///
/// A handle that went stale (the kernel removed the attribute: driver
/// reload, hot removal; reads fail with ENODEV) is dropped and the counter
/// read by path instead; the next read opens it again. The inventory drops
/// every handle at each full discovery.
#[derive(Debug)]
pub struct EfaCounters {
    ibdir: PathBuf,
    /// `no_completion_cmds`, then the [`RATE_THRESHOLDS`] counters in order.
    held: [Option<File>; HELD],
    port_dir: Option<File>,
}

/// Counters held open: `no_completion_cmds` and the rate counters.
const HELD: usize = 1 + RATE_THRESHOLDS.len();

/// The port counters' directory under the RDMA device directory.
const PORT_COUNTERS: &str = "ports/1/hw_counters";

/// Longest counter file read: a `u64` in decimal is 20 digits.
const COUNTER_BYTES: usize = 64;

/// Is this error a stale handle's (the attribute is gone) rather than the
/// device's?
fn is_stale(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(
            e.raw_os_error().map(nix::errno::Errno::from_raw),
            Some(nix::errno::Errno::ENODEV | nix::errno::Errno::ESTALE)
        )
}

fn parse_bytes(buf: &[u8]) -> Option<u64> {
    std::str::from_utf8(buf).ok().and_then(parse_counter)
}

impl EfaCounters {
    /// The counters of the EFA whose RDMA device directory is `ibdir`;
    /// each is opened at its first read.
    pub fn new(ibdir: PathBuf) -> Self {
        EfaCounters {
            ibdir,
            held: Default::default(),
            port_dir: None,
        }
    }

    /// The path of held counter `slot`.
    fn held_path(&self, slot: usize) -> PathBuf {
        match slot.checked_sub(1) {
            None => self.ibdir.join("hw_counters/no_completion_cmds"),
            Some(rate) => self.ibdir.join(PORT_COUNTERS).join(RATE_THRESHOLDS[rate].0),
        }
    }

    /// Reads held counter `slot`: `Ok(None)` when not reported.
    /// The path is built only to open the counter or to fall back to it:
    /// a read through a held handle allocates nothing.
    fn read_held(&mut self, slot: usize) -> io::Result<Option<u64>> {
        let handle = match &self.held[slot] {
            Some(handle) => handle,
            None => match File::open(self.held_path(slot)) {
                Ok(handle) => self.held[slot].insert(handle),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let mut buf = [0u8; COUNTER_BYTES];
        match handle.read_at(&mut buf, 0) {
            Ok(n) => Ok(parse_bytes(&buf[..n])),
            Err(e) if is_stale(&e) => {
                self.held[slot] = None;
                read_counter(&self.held_path(slot))
            }
            Err(e) => Err(e),
        }
    }

    /// Reads port counter `name` through the held port directory (opened
    /// anew each time): `Ok(None)` when not reported.
    fn read_port(&mut self, name: &str) -> io::Result<Option<u64>> {
        let dir = self.ibdir.join(PORT_COUNTERS);
        let handle = match &self.port_dir {
            Some(handle) => handle,
            None => match File::open(&dir) {
                Ok(handle) => self.port_dir.insert(handle),
                // No such directory: not reported (older kernel drivers).
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(_) => return read_counter(&dir.join(name)),
            },
        };
        match read_at(handle, name) {
            Err(e) if is_stale(&e) => {
                // Not reported, or a stale directory: the path decides.
                let by_path = read_counter(&dir.join(name));
                if !matches!(by_path, Ok(None)) {
                    self.port_dir = None;
                }
                by_path
            }
            other => other,
        }
    }
}

/// Reads counter `name` in the directory `dir`: `openat`, one `read`, and
/// `close` when the file is dropped.
fn read_at(dir: &File, name: &str) -> io::Result<Option<u64>> {
    let fd = nix::fcntl::openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(io::Error::from)?;
    let mut file = File::from(fd);
    let mut buf = [0u8; COUNTER_BYTES];
    let n = file.read(&mut buf)?;
    Ok(parse_bytes(&buf[..n]))
}

/// The conditions of the EFA whose counters are `counters`, and the
/// sample for the next call's rates.
pub fn read(
    counters: &mut EfaCounters,
    previous: Option<&CounterSample>,
    now: Instant,
) -> (Vec<HealthCondition>, Option<CounterSample>) {
    let mut conditions = Vec::new();
    match counters.read_held(0) {
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
    let mut values = BTreeMap::new();
    let mut unreadable = false;
    for (slot, (counter, _)) in RATE_THRESHOLDS.iter().enumerate() {
        match counters.read_held(1 + slot) {
            Ok(Some(v)) => {
                values.insert(*counter, v);
            }
            Ok(None) => {}
            Err(e) if is_device_error(&e) => unreadable = true,
            Err(_) => {}
        }
    }
    // One counter every EFA reports is read too, so that the signal is
    // there even where the rate counters are not. Every port counter read
    // is an admin command to the device, so once the admin queue is closed
    // they all fail alike: reading the other thirty-odd counters of the
    // directory told nothing more, and cost two thirds of an idle rescan
    // (32 EFAs on a p5: 1,300 file reads every 10 s).
    if !unreadable
        && matches!(counters.read_port(PROBE_COUNTER), Err(ref err) if is_device_error(err))
    {
        unreadable = true;
    }
    if unreadable {
        conditions.push(HealthCondition {
            dimension: "port-counters-unreadable".into(),
            severity: Severity::Fatal,
            value: "eio".into(),
        });
    }
    if let Some(prev) = previous {
        let seconds = now.duration_since(prev.at).as_secs_f64();
        if seconds > 0.0 {
            for (counter, limit) in RATE_THRESHOLDS {
                let (Some(now_v), Some(then_v)) = (values.get(counter), prev.values.get(counter))
                else {
                    continue;
                };
                let rate = now_v.saturating_sub(*then_v) as f64 / seconds;
                if rate > limit {
                    conditions.push(HealthCondition {
                        dimension: format!("{}-rate", counter.replace('_', "-")),
                        severity: Severity::Degraded,
                        value: format!("{}", rate.round() as u64),
                    });
                }
            }
        }
    }
    (conditions, Some(CounterSample { at: now, values }))
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
        let (c, _) = read(&mut dirs, None, t1);
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
        assert!(dirs.held.iter().all(Option::is_none) && dirs.port_dir.is_none());
    }

    /// Held counters are read again on every call (a value written in
    /// place is seen, as sysfs runs `show` again for a `pread` at 0); a
    /// value longer than a counter is not one; the probe goes through the
    /// directory, so a counter that became unreadable is seen at once.
    #[test]
    fn held_counters_are_fresh_and_the_probe_follows_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let port = dir.path().join(PORT_COUNTERS);
        std::fs::create_dir_all(&port).unwrap();
        std::fs::create_dir_all(dir.path().join("hw_counters")).unwrap();
        let rate = port.join(RATE_THRESHOLDS[0].0);
        std::fs::write(&rate, "18446744073709551615\n").unwrap();
        let mut counters = EfaCounters::new(dir.path().to_path_buf());
        assert_eq!(counters.read_held(1).unwrap(), Some(u64::MAX));
        assert!(counters.held[1].is_some(), "held open");
        std::fs::write(&rate, "7\n").unwrap();
        assert_eq!(counters.read_held(1).unwrap(), Some(7), "read again");
        std::fs::write(&rate, "x".repeat(100)).unwrap();
        assert_eq!(counters.read_held(1).unwrap(), None);
        assert_eq!(counters.read_held(0).unwrap(), None, "not reported");
        assert!(counters.held[0].is_none());

        std::fs::write(port.join(PROBE_COUNTER), "3\n").unwrap();
        assert_eq!(counters.read_port(PROBE_COUNTER).unwrap(), Some(3));
        std::fs::remove_file(port.join(PROBE_COUNTER)).unwrap();
        std::fs::create_dir(port.join(PROBE_COUNTER)).unwrap();
        assert!(
            counters
                .read_port(PROBE_COUNTER)
                .is_err_and(|e| is_device_error(&e))
        );
    }

    /// What a stale handle fails with (the attribute was removed: ENODEV on
    /// sysfs) sends the read back to the path; EIO is the device's.
    #[test]
    fn stale_handles_and_device_errors_are_told_apart() {
        let err = |e: nix::errno::Errno| io::Error::from_raw_os_error(e as i32);
        assert!(is_stale(&err(nix::errno::Errno::ENODEV)));
        assert!(is_stale(&err(nix::errno::Errno::ENOENT)));
        assert!(!is_stale(&err(nix::errno::Errno::EIO)));
        assert!(is_device_error(&err(nix::errno::Errno::EIO)));
    }
}
