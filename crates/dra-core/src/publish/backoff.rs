//! Capped exponential backoff with jitter, for retrying API calls.
//!
//! Each failure doubles the base delay up to `max`; the actual delay is drawn
//! uniformly from `[base/2, base]` ("equal jitter") so that the drivers of a
//! whole fleet of nodes do not hit a recovering API server in lockstep.

use std::time::Duration;

/// Backoff bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackoffConfig {
    /// Base delay after the first failure.
    pub initial: Duration,
    /// Largest base delay.
    pub max: Duration,
}

impl Default for BackoffConfig {
    /// 1 s doubling to at most 2 min.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(120),
        }
    }
}

impl BackoffConfig {
    /// The ResourceSlice watch's reconnect policy: 0.5 s doubling to at most
    /// 5 s. After an API server outage the watch is back at most 5 s after
    /// the server (the relist and the repair of a pool take well under a
    /// second more), so a pool deleted or changed during or right after the
    /// outage is whole again within 10 s of the return. The price: while the
    /// server is down each driver tries once every 2.5 to 5 s (a refused
    /// connection), and the relists of a whole fleet arrive spread over
    /// those 5 s, which the API server answers from its watch cache. The
    /// writes keep [`BackoffConfig::default`]: a write that fails with the
    /// server up is retried at once only when the watch shows the server
    /// back (see [`crate::publish::publisher`]).
    pub(crate) const WATCH: Self = Self {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(5),
    };
}

/// Backoff state: failures since the last success.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    failures: u32,
}

impl Backoff {
    /// Fresh state (no failures yet).
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            failures: 0,
        }
    }

    /// Forget past failures (call after a success).
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Delay before the next attempt, with random jitter.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.next_delay_with(rand::random::<f64>())
    }

    /// Delay before the next attempt; `unit` in `[0, 1]` picks the point in the
    /// jitter window (injectable for tests).
    pub(crate) fn next_delay_with(&mut self, unit: f64) -> Duration {
        let exp = self.failures.min(31);
        self.failures = self.failures.saturating_add(1);
        let base = self
            .config
            .initial
            .checked_mul(1u32 << exp)
            .unwrap_or(self.config.max)
            .min(self.config.max);
        let half = base / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// [`Backoff`] as the retry policy of a `kube` watch stream
/// (`WatchStreamExt::backoff`), which resets it on every event the watch
/// delivers.
#[derive(Debug, Clone)]
pub(crate) struct WatchBackoff(Backoff);

impl WatchBackoff {
    /// Fresh state with these bounds.
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self(Backoff::new(config))
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    /// Never ends: a watch is retried for as long as the driver runs.
    fn next(&mut self) -> Option<Duration> {
        Some(self.0.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let mut b = Backoff::new(BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        });
        let upper: Vec<u128> = (0..7).map(|_| b.next_delay_with(1.0).as_millis()).collect();
        assert_eq!(upper, [100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay_with(0.0), Duration::from_millis(50));
        assert_eq!(b.next_delay_with(0.5), Duration::from_millis(150));
    }

    #[test]
    fn watch_backoff_is_capped_at_five_seconds_and_resets() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::new(BackoffConfig::WATCH);
        let delays: Vec<Duration> = (0..20).map(|_| b.next().unwrap()).collect();
        // First retry within [0.25, 0.5] s; never more than 5 s, however
        // long the outage; the capped window is [2.5, 5] s.
        assert!(delays[0] >= Duration::from_millis(250) && delays[0] <= Duration::from_millis(500));
        assert!(
            delays.iter().all(|d| *d <= Duration::from_secs(5)),
            "{delays:?}"
        );
        assert!(
            delays[10..]
                .iter()
                .all(|d| *d >= Duration::from_millis(2500)),
            "{delays:?}"
        );
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(500));
    }

    #[test]
    fn random_jitter_stays_in_window() {
        let mut b = Backoff::new(BackoffConfig::default());
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(500) && d <= Duration::from_secs(120),
                "{d:?}"
            );
        }
    }
}
