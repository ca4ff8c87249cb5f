//! The loop of the drivers' rescan benchmarks (`cargo bench -p <driver>
//! --bench rescan`): whole scans of a generated fixture, timed one by one.
//!
//! Scans back to back find the CPU caches warm; a driver at rest rescans
//! once every 10 s and finds them cold. `RESCAN_BENCH_COLD=1` evicts them
//! between scans (64 MiB written, then 5 ms asleep), which is closer to
//! what an idle node pays per rescan.

use std::fmt;
use std::time::{Duration, Instant};

/// Scans run, untimed, before the timed ones: the discovery cache and the
/// held handles settle, as on a driver that has run for a while.
pub const WARM_UP: u32 = 20;

/// The environment variable that evicts the CPU caches between scans.
pub const COLD_ENV: &str = "RESCAN_BENCH_COLD";

/// The environment variable that replaces the number of timed scans (a
/// profiler wants thousands; the default keeps `cargo bench` short).
pub const RUNS_ENV: &str = "RESCAN_BENCH_RUNS";

/// Bytes written between scans to evict the CPU caches.
const EVICT_BYTES: usize = 64 << 20;

/// What the timed scans took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescanFigures {
    pub runs: u32,
    /// Whether the caches were evicted before each scan.
    pub cold: bool,
    pub mean: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl RescanFigures {
    /// The figures of `samples` (one per scan, in any order; at least one).
    fn of(mut samples: Vec<Duration>, cold: bool) -> RescanFigures {
        samples.sort();
        let n = samples.len().max(1);
        let pct = |p: usize| samples.get((n * p / 100).min(n - 1)).copied();
        let total: Duration = samples.iter().sum();
        RescanFigures {
            runs: samples.len() as u32,
            cold,
            mean: total / n as u32,
            p50: pct(50).unwrap_or_default(),
            p90: pct(90).unwrap_or_default(),
            p99: pct(99).unwrap_or_default(),
            max: samples.last().copied().unwrap_or_default(),
        }
    }
}

impl fmt::Display for RescanFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "runs={} mean={:?} p50={:?} p90={:?} p99={:?} max={:?}",
            self.runs, self.mean, self.p50, self.p90, self.p99, self.max
        )
    }
}

/// Runs [`WARM_UP`] scans, then `runs` timed ones (the caches evicted
/// before each when [`COLD_ENV`] is `1`), checks that each found `first`
/// (a node at rest: the same devices every time), and prints
/// `rescan <label>: <figures>`.
pub fn bench_rescans<T: PartialEq>(
    label: &str,
    runs: u32,
    first: &T,
    mut scan: impl FnMut() -> T,
) -> RescanFigures {
    let cold = std::env::var_os(COLD_ENV).is_some_and(|v| v == "1");
    let runs = std::env::var(RUNS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(runs);
    let figures = time_rescans(runs, cold, first, &mut scan);
    let how = if cold {
        ", caches evicted between rescans"
    } else {
        ""
    };
    println!("rescan {label}{how}: {figures}");
    figures
}

fn time_rescans<T: PartialEq>(
    runs: u32,
    cold: bool,
    first: &T,
    scan: &mut impl FnMut() -> T,
) -> RescanFigures {
    for _ in 0..WARM_UP {
        std::hint::black_box(scan());
    }
    let mut evict = vec![0u8; if cold { EVICT_BYTES } else { 0 }];
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..runs {
        if cold {
            evict
                .iter_mut()
                .step_by(64)
                .for_each(|b| *b = b.wrapping_add(i as u8));
            std::hint::black_box(&evict);
            std::thread::sleep(Duration::from_millis(5));
        }
        let start = Instant::now();
        let again = scan();
        samples.push(start.elapsed());
        assert!(again == *first, "steady state must find the same devices");
    }
    RescanFigures::of(samples, cold)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_timed_scan_is_checked_and_counted() {
        let mut scans = 0u32;
        let figures = time_rescans(7, false, &"devices", &mut || {
            scans += 1;
            "devices"
        });
        assert_eq!(scans, WARM_UP + 7);
        assert_eq!(figures.runs, 7);
        assert!(figures.p50 <= figures.p90 && figures.p90 <= figures.p99);
        assert!(figures.p99 <= figures.max && figures.mean <= figures.max);
    }

    #[test]
    #[should_panic(expected = "steady state must find the same devices")]
    fn a_scan_that_finds_something_else_fails_the_bench() {
        let mut scans = 0u32;
        time_rescans(3, false, &0u32, &mut || {
            scans += 1;
            scans.saturating_sub(WARM_UP + 2)
        });
    }

    #[test]
    fn percentiles_of_known_samples() {
        let samples = (1..=100).rev().map(Duration::from_millis).collect();
        let f = RescanFigures::of(samples, true);
        let ms = Duration::from_millis;
        assert_eq!(
            (f.runs, f.mean, f.p50, f.p90, f.p99, f.max),
            (
                100,
                ms(50) + Duration::from_micros(500),
                ms(51),
                ms(91),
                ms(100),
                ms(100)
            )
        );
        assert!(f.to_string().starts_with("runs=100 mean=50.5ms p50=51ms"));
    }
}
