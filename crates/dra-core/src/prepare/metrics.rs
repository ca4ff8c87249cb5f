//! Prometheus metrics of the kubelet-facing runtime, registered into a
//! registry the caller owns (the ops server exposes it on `/metrics`).
//!
//! Names follow the rule in `docs/operations.md` ("Metric names"): the
//! project's prefix [`PREFIX`], never kubelet's `dra_`; then the part that
//! owns the metric (`plugin`, `checkpoint`, `publish`, or the driver for its
//! rescans and its own metrics); base units in the name; `_total` on
//! counters and only there; no two metrics on one stem. The test at the end
//! of this file checks every metric dra-core registers against it.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// The first part of every metric name of ours: kubelet owns `dra_` (its
/// `dra_operations_duration_seconds`, `dra_resource_claims_in_use`, ...).
pub(crate) const PREFIX: &str = "aws_dra_";

/// Handles to the runtime's metrics; cheap to clone.
#[derive(Clone)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct PluginMetrics {
    /// Claims prepared/unprepared, by `operation` and `result` (`success`, `error`).
    claims: IntCounterVec,
    /// Per-claim duration in seconds, by `operation` and `result`.
    duration: HistogramVec,
    /// gRPC calls being served, by `operation`.
    in_flight: IntGaugeVec,
    /// 1 after kubelet reported successful registration, 0 after a failure.
    registered: IntGauge,
    /// `NotifyRegistrationStatus` calls with `plugin_registered=false`.
    registration_failures: IntCounter,
    /// Checkpoint problems, by `reason` (`corrupt`, `newer`, `write`).
    checkpoint_errors: IntCounterVec,
    /// `aws_dra_checkpoint_claims`: claims in the checkpoint (prepared on this node).
    prepared_claims: IntGauge,
    /// `aws_dra_checkpoint_devices`: devices of those claims (one per allocation
    /// result; a device an admin-access claim shares counts once per claim).
    prepared_devices: IntGauge,
    /// Claims that waited for a device's release, by `result`.
    release_waits: IntCounterVec,
    /// Calls (prepare and unprepare) whose changes went to disk in one
    /// checkpoint commit.
    commit_group: prometheus::Histogram,
}

impl PluginMetrics {
    /// Creates the metrics and registers them; fails if already registered.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let claims = IntCounterVec::new(
            Opts::new(
                "aws_dra_plugin_claims_total",
                "Claims prepared or unprepared, by operation and result.",
            ),
            &["operation", "result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "aws_dra_plugin_claim_duration_seconds",
                "Time to prepare or unprepare one claim, by operation and result.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            &["operation", "result"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "aws_dra_plugin_requests_in_flight",
                "NodePrepareResources/NodeUnprepareResources calls being served.",
            ),
            &["operation"],
        )?;
        let registered = IntGauge::new(
            "aws_dra_plugin_registered",
            "1 when kubelet reported the plugin registered, 0 when it reported a failure.",
        )?;
        let registration_failures = IntCounter::new(
            "aws_dra_plugin_registration_failures_total",
            "Registration failures reported by kubelet (plugin_registered=false): the node gets no \
             allocations until it registers; the driver logs kubelet's error.",
        )?;
        let checkpoint_errors = IntCounterVec::new(
            Opts::new(
                "aws_dra_checkpoint_errors_total",
                "Checkpoint problems, by reason: corrupt (unparsable, moved aside), newer (written by a \
                 newer driver: refused and kept), write (could not be written).",
            ),
            &["reason"],
        )?;
        let prepared_claims = IntGauge::new(
            "aws_dra_checkpoint_claims",
            "Claims prepared on this node, as the checkpoint records them (set at start from what a \
             previous run left, then on every prepare and unprepare).",
        )?;
        let prepared_devices = IntGauge::new(
            "aws_dra_checkpoint_devices",
            "Devices of the claims prepared on this node, as the checkpoint records them: one per \
             allocation result (a device admin-access claims share counts once per claim).",
        )?;
        let release_waits = IntCounterVec::new(
            Opts::new(
                "aws_dra_plugin_device_release_waits_total",
                "Claims whose device was still prepared for another claim, so that prepare \
                 waited for its unprepare; by result (released: the device was freed in time, \
                 timed_out: refused at the bound).",
            ),
            &["result"],
        )?;
        let commit_group = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "aws_dra_plugin_commit_group_calls",
                "Prepare and unprepare calls served together by one checkpoint commit \
                 (group commit: kubelet's concurrent calls share one pass and one disk wait).",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )?;
        registry.register(Box::new(commit_group.clone()))?;
        registry.register(Box::new(claims.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(registered.clone()))?;
        registry.register(Box::new(registration_failures.clone()))?;
        registry.register(Box::new(checkpoint_errors.clone()))?;
        registry.register(Box::new(prepared_claims.clone()))?;
        registry.register(Box::new(prepared_devices.clone()))?;
        registry.register(Box::new(release_waits.clone()))?;
        Ok(Self {
            claims,
            duration,
            in_flight,
            registered,
            registration_failures,
            checkpoint_errors,
            prepared_claims,
            prepared_devices,
            release_waits,
            commit_group,
        })
    }

    pub(crate) fn commit_group(&self, calls: usize) {
        self.commit_group.observe(calls as f64);
    }

    pub(crate) fn claim_done(&self, operation: &str, ok: bool, seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.claims.with_label_values(&[operation, result]).inc();
        self.duration
            .with_label_values(&[operation, result])
            .observe(seconds);
    }

    pub(crate) fn in_flight(&self, operation: &str) -> InFlight {
        let gauge = self.in_flight.with_label_values(&[operation]);
        gauge.inc();
        InFlight(gauge)
    }

    pub(crate) fn registration(&self, ok: bool) {
        self.registered.set(i64::from(ok));
        if !ok {
            self.registration_failures.inc();
        }
    }

    pub(crate) fn release_wait_done(&self, released: bool) {
        let result = if released { "released" } else { "timed_out" };
        self.release_waits.with_label_values(&[result]).inc();
    }

    pub(crate) fn checkpoint_error(&self, reason: &str) {
        self.checkpoint_errors.with_label_values(&[reason]).inc();
    }

    /// The prepared gauges, from the claims and devices a checkpoint records
    /// (counted by the checkpoint store, so that this module need not know
    /// the checkpoint's layout).
    pub(crate) fn prepared(&self, claims: usize, devices: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.prepared_claims.set(count(claims));
        self.prepared_devices.set(count(devices));
    }
}

/// Decrements the in-flight gauge when the call ends, however it ends.
pub(crate) struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn render(registry: &Registry) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap()
    }

    #[test]
    fn registers_once_and_counts() {
        let registry = Registry::new();
        let m = PluginMetrics::register(&registry).unwrap();
        assert!(PluginMetrics::register(&registry).is_err());
        m.claim_done("prepare", true, 0.01);
        m.registration(false);
        {
            let _g = m.in_flight("prepare");
            assert!(
                render(&registry)
                    .contains("aws_dra_plugin_requests_in_flight{operation=\"prepare\"} 1")
            );
        }
        let text = render(&registry);
        assert!(
            text.contains(
                "aws_dra_plugin_claims_total{operation=\"prepare\",result=\"success\"} 1"
            )
        );
        assert!(text.contains("aws_dra_plugin_requests_in_flight{operation=\"prepare\"} 0"));
        assert!(text.contains("aws_dra_plugin_registration_failures_total 1"));
        assert!(text.contains("aws_dra_plugin_registered 0"));
        // Exported from the start, 0 before any checkpoint was read.
        assert!(text.contains("aws_dra_checkpoint_claims 0"));
        assert!(text.contains("aws_dra_checkpoint_devices 0"));
    }
}
