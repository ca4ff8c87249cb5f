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
            "Registration failures reported by kubelet.",
        )?;
        let checkpoint_errors = IntCounterVec::new(
            Opts::new(
                "aws_dra_checkpoint_errors_total",
                "Checkpoint files found corrupt, of a newer version, or not writable.",
            ),
            &["reason"],
        )?;
        let prepared_claims = IntGauge::new(
            "aws_dra_checkpoint_claims",
            "Claims prepared on this node, as the checkpoint records them.",
        )?;
        let prepared_devices = IntGauge::new(
            "aws_dra_checkpoint_devices",
            "Devices of the claims prepared on this node, as the checkpoint records them.",
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

    /// What breaks the naming rule in `families`, one line each.
    fn naming_rule_violations(families: &[prometheus::proto::MetricFamily]) -> Vec<String> {
        use prometheus::proto::MetricType;
        let mut bad = Vec::new();
        // Every sample name a family exposes, in text and OpenMetrics form.
        let mut taken: std::collections::BTreeMap<String, String> = Default::default();
        for f in families {
            let name = f.name();
            let kind = f.get_field_type();
            if !name.starts_with(PREFIX) {
                bad.push(format!("{name}: does not start with {PREFIX}"));
            }
            let is_counter = kind == MetricType::COUNTER;
            if is_counter != name.ends_with("_total") {
                bad.push(format!(
                    "{name}: {kind:?}, and _total belongs to counters only"
                ));
            }
            if kind != MetricType::HISTOGRAM
                && ["_sum", "_count", "_bucket"]
                    .iter()
                    .any(|s| name.ends_with(s))
            {
                bad.push(format!("{name}: a histogram's suffix on a {kind:?}"));
            }
            if (name.contains("duration") || name.contains("timestamp"))
                && !name.trim_end_matches("_total").ends_with("_seconds")
            {
                bad.push(format!("{name}: a time not in seconds"));
            }
            let stem = name.strip_suffix("_total").unwrap_or(name);
            let exposed: Vec<String> = match kind {
                MetricType::COUNTER => vec![stem.into(), format!("{stem}_total")],
                MetricType::HISTOGRAM => ["", "_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{stem}{s}"))
                    .collect(),
                _ => vec![stem.into()],
            };
            for e in exposed {
                if let Some(other) = taken.insert(e.clone(), name.to_string()) {
                    bad.push(format!("{name}: {e} is also {other}'s"));
                }
            }
        }
        bad
    }

    /// Every metric dra-core registers, the rescan metrics with the prefix
    /// each driver gets, has a name by the rule; and the checker sees the
    /// mistakes the rule is there to prevent.
    #[test]
    fn every_metric_follows_the_naming_rule() {
        use crate::daemon::rescan::RescanMetrics;
        use crate::daemon::runner::Program;
        use crate::publish::publisher::PublishMetrics;
        let registry = Registry::new();
        let plugin = PluginMetrics::register(&registry).unwrap();
        let publish = PublishMetrics::register(&registry).unwrap();
        // A vector without children is not gathered: give each one a child.
        plugin.claim_done("prepare", true, 0.01);
        drop(plugin.in_flight("prepare"));
        plugin.registration(false);
        plugin.release_wait_done(true);
        plugin.checkpoint_error("corrupt");
        plugin.commit_group(3);
        publish.publish_errors.with_label_values(&["create"]).inc();
        publish.slice_writes.with_label_values(&["create"]).inc();
        publish
            .validation_issues
            .with_label_values(&["dropped", "too_long"])
            .inc();
        let mut prefixes = Vec::new();
        for binary in ["efa-driver", "neuron-driver", "gpu-test-driver"] {
            let program = Program {
                binary,
                version: "0",
                driver_name: "d",
                device_plugin_resources: &[],
            };
            let prefix = program.metrics_prefix();
            let rescan = RescanMetrics::register(&registry, &prefix).unwrap();
            rescan.rescans_total.with_label_values(&["start"]).inc();
            rescan
                .devices_by_health
                .with_label_values(&["healthy"])
                .set(1);
            rescan.health_transitions.with_label_values(&["x"]).inc();
            prefixes.push(prefix);
        }
        assert_eq!(
            prefixes,
            ["aws_dra_efa", "aws_dra_neuron", "aws_dra_gpu_test"]
        );
        let families = registry.gather();
        assert_eq!(families.len(), 10 + 6 + 3 * 5, "every metric gathered");
        assert_eq!(naming_rule_violations(&families), Vec::<String>::new());

        // The mistakes of the names this rule replaced.
        let bad = Registry::new();
        let gauge = IntGaugeVec::new(Opts::new("aws_dra_efa_unusable_devices", "g"), &["r"]);
        let counter =
            IntCounterVec::new(Opts::new("aws_dra_efa_unusable_devices_total", "c"), &["r"]);
        let old = IntGauge::new("dra_prepared_claims", "kubelet's prefix").unwrap();
        let (gauge, counter) = (gauge.unwrap(), counter.unwrap());
        gauge.with_label_values(&["x"]).set(1);
        counter.with_label_values(&["x"]).inc();
        bad.register(Box::new(gauge)).unwrap();
        bad.register(Box::new(counter)).unwrap();
        bad.register(Box::new(old)).unwrap();
        let found = naming_rule_violations(&bad.gather());
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("dra_prepared_claims: does not start")),
            "{found:#?}"
        );
        assert!(
            found.iter().any(|f| f.starts_with(
                "aws_dra_efa_unusable_devices_total: aws_dra_efa_unusable_devices is also"
            )),
            "{found:#?}"
        );
    }
}
