//! The metric naming rule over every metric dra-core registers, from all
//! layers at once: the rescan metrics with each driver's prefix, the
//! publisher's and the plugin's. The check lives with the process that
//! registers them all (tests only).

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::prepare::metrics::PREFIX;

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
    use crate::daemon::runner::Program;
    let registry = Registry::new();
    let mut prefixes = Vec::new();
    for binary in ["efa-driver", "neuron-driver", "gpu-test-driver"] {
        let program = Program {
            binary,
            version: "0",
            driver_name: "d",
            device_plugin_resources: &[],
        };
        prefixes.push(program.metrics_prefix());
    }
    assert_eq!(
        prefixes,
        ["aws_dra_efa", "aws_dra_neuron", "aws_dra_gpu_test"]
    );
    // Everything the runtime registers, with each binary's rescan prefix.
    crate::daemon::metric_catalog::register_every_metric(&registry, &prefixes[0]).unwrap();
    for prefix in &prefixes[1..] {
        crate::daemon::metric_catalog::register_rescan_metrics(&registry, prefix).unwrap();
    }
    let families = registry.gather();
    // Plugin 10, publish 7, waiting 1, claim status 1, ops server 2, rescan
    // 5 per binary.
    assert_eq!(
        families.len(),
        10 + 7 + 1 + 1 + 2 + 3 * 5,
        "every metric gathered"
    );
    assert_eq!(naming_rule_violations(&families), Vec::<String>::new());

    // The mistakes of the names this rule replaced.
    let bad = Registry::new();
    let gauge = IntGaugeVec::new(Opts::new("aws_dra_efa_unusable_devices", "g"), &["r"]);
    let counter = IntCounterVec::new(Opts::new("aws_dra_efa_unusable_devices_total", "c"), &["r"]);
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
