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
use std::io;
use std::path::Path;
use std::time::Instant;

use dra_core::{HealthCondition, Severity};

/// The port counter read for `port-counters-unreadable` besides the rate
/// counters: reported by every EFA generation.
pub const PROBE_COUNTER: &str = "tx_pkts";

/// Error counters behind the degraded rates, with their per-second limits.
pub const RATE_THRESHOLDS: &[(&str, f64)] = &[
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
        Ok(text) => Ok(text.trim().parse().ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Is this read error the device's (EIO and the like) rather than ours
/// (permission)?
fn is_device_error(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    )
}

/// The conditions of the EFA whose RDMA device directory is `ibdir`, and
/// the sample for the next call's rates.
pub fn read(
    ibdir: &Path,
    previous: Option<&CounterSample>,
    now: Instant,
) -> (Vec<HealthCondition>, Option<CounterSample>) {
    let mut conditions = Vec::new();
    match read_counter(&ibdir.join("hw_counters/no_completion_cmds")) {
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
    let port = ibdir.join("ports/1/hw_counters");
    let mut values = BTreeMap::new();
    let mut unreadable = false;
    for (counter, _) in RATE_THRESHOLDS {
        match read_counter(&port.join(counter)) {
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
        && matches!(read_counter(&port.join(PROBE_COUNTER)), Err(ref err) if is_device_error(err))
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
                if rate > *limit {
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
        let t0 = Instant::now();
        let (c, s0) = read(&ib, None, t0);
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
        let (c, s1) = read(&ib, s0.as_ref(), t1);
        assert_eq!(
            dims(&c),
            vec![(
                "retrans-pkts-rate".into(),
                Severity::Degraded,
                "2500".into()
            )]
        );
        // Next scan, no growth: the rate clears.
        let (c, _) = read(&ib, s1.as_ref(), t1 + Duration::from_secs(2));
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
        let (c, _) = read(&ib, None, t1);
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

        // A driver without the counters reports nothing: healthy.
        std::fs::remove_dir_all(ib.join("hw_counters")).unwrap();
        std::fs::remove_dir_all(ib.join("ports/1/hw_counters")).unwrap();
        let (c, _) = read(&ib, None, t1);
        assert!(c.is_empty());
    }
}
