//! An EFA's `hw_counters` as the health check reads them on two scans: any
//! text in any counter file (numbers past `u64`, signs, garbage, huge
//! files), counters that go down between scans, any time between the
//! scans. Never a panic (overflow checks are on); only the conditions the
//! check documents, a rate only from two readable numbers, and a
//! non-zero `no_completion_cmds` is always the fatal condition.
//!
//! Input: lines. Lines 1-7 are the first scan's `no_completion_cmds` and
//! the six rate counters, lines 8-14 the second scan's, `-` for a missing
//! file; then a line with the seconds between the scans (0-255).
#![no_main]

use std::time::{Duration, Instant};

use efa_driver::health::{EfaCounters, PROBE_COUNTER, RATE_THRESHOLDS, read};
use libfuzzer_sys::fuzz_target;

fn write(ib: &std::path::Path, scan: &[&[u8]]) {
    let port = ib.join("ports/1/hw_counters");
    let mut files = vec![ib.join("hw_counters/no_completion_cmds")];
    files.extend(RATE_THRESHOLDS.iter().map(|(name, _)| port.join(name)));
    for (path, text) in files.iter().zip(scan) {
        if *text == b"-" {
            let _ = std::fs::remove_file(path);
        } else {
            std::fs::write(path, text).unwrap();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    if lines.len() < 15 {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ib = dir.path().join("efa_0");
    std::fs::create_dir_all(ib.join("hw_counters")).unwrap();
    std::fs::create_dir_all(ib.join("ports/1/hw_counters")).unwrap();
    std::fs::write(ib.join("ports/1/hw_counters").join(PROBE_COUNTER), "7\n").unwrap();
    let seconds = lines[14].first().copied().unwrap_or(0);
    let mut counters = EfaCounters::new(ib.clone());
    let t0 = Instant::now();

    let mut previous = None;
    for (scan, at) in [
        (&lines[0..7], t0),
        (&lines[7..14], t0 + Duration::from_secs(u64::from(seconds))),
    ] {
        write(&ib, scan);
        let (conditions, sample) = read(&mut counters, previous.as_ref(), at);
        let admin: Option<u64> = std::str::from_utf8(scan[0])
            .ok()
            .filter(|t| t.len() < 64)
            .and_then(|t| t.trim().parse().ok());
        if admin.is_some_and(|n| n > 0) {
            assert!(
                conditions
                    .iter()
                    .any(|c| c.dimension == "admin-queue-closed"),
                "{conditions:?}"
            );
        }
        for c in &conditions {
            let known = c.dimension == "admin-queue-closed"
                || c.dimension == "port-counters-unreadable"
                || RATE_THRESHOLDS
                    .iter()
                    .any(|(name, _)| c.dimension == format!("{}-rate", name.replace('_', "-")));
            assert!(known, "undocumented condition {c:?}");
            if c.dimension.ends_with("-rate") {
                assert!(previous.is_some(), "a rate from one scan: {c:?}");
                assert!(c.value.parse::<u64>().is_ok(), "{c:?}");
            }
        }
        previous = sample;
    }
});
