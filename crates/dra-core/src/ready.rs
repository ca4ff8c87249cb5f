//! When the driver is ready: kubelet has registered the plugin and the
//! node's slices have been published (reconciled once). Until then
//! `/readyz` answers 503, so a DaemonSet rolling update (`maxSurge: 1`,
//! `maxUnavailable: 0`) keeps the old pod until the new one can really
//! serve: kubelet has a plugin to call and the scheduler sees the devices.
//!
//! Both facts are read from the driver's own metrics
//! (`aws_dra_plugin_registered`, `aws_dra_publish_last_success_timestamp_seconds`),
//! the same numbers an operator sees, so the probe and the dashboards
//! cannot disagree.

use std::time::Duration;

use prometheus::Registry;
use prometheus::proto::MetricFamily;

use crate::ops::Readiness;

/// How often the metrics are looked at until ready.
const POLL: Duration = Duration::from_millis(200);

/// Whether the gathered metrics say registered and published.
pub(crate) fn serving(families: &[MetricFamily]) -> bool {
    let value = |name: &str| -> Option<f64> {
        // Both are plain gauges.
        let family = families.iter().find(|f| f.name() == name)?;
        Some(family.get_metric().first()?.get_gauge().value())
    };
    value("aws_dra_plugin_registered") == Some(1.0)
        && value("aws_dra_publish_last_success_timestamp_seconds").is_some_and(|t| t > 0.0)
}

/// Sets `readiness` once `registry` shows the plugin registered and the
/// slices published; returns then (readiness is a gate for rollouts, not a
/// health signal: `/readyz` also runs the liveness self-check).
pub(crate) async fn mark_when_serving(registry: Registry, readiness: Readiness) {
    let mut logged = false;
    loop {
        if serving(&registry.gather()) {
            readiness.set(true);
            tracing::info!("ready: kubelet registered the plugin and the slices are published");
            return;
        }
        if !logged {
            tracing::info!(
                "not ready yet: waiting for kubelet's registration and the first publish"
            );
            logged = true;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Gauge, IntGauge};

    #[test]
    fn ready_only_when_registered_and_published() {
        let registry = Registry::new();
        let registered = IntGauge::new("aws_dra_plugin_registered", "r").unwrap();
        let published = Gauge::new("aws_dra_publish_last_success_timestamp_seconds", "p").unwrap();
        registry.register(Box::new(registered.clone())).unwrap();
        assert!(!serving(&registry.gather()), "nothing yet");
        registry.register(Box::new(published.clone())).unwrap();
        published.set(1_700_000_000.0);
        assert!(!serving(&registry.gather()), "published, not registered");
        registered.set(1);
        assert!(serving(&registry.gather()));
        published.set(0.0);
        assert!(!serving(&registry.gather()), "registered, never published");
    }

    /// The names read above are the ones the runtime registers: a rename
    /// of either metric fails here, not in a rollout that never gets ready.
    #[test]
    fn reads_the_metrics_the_runtime_registers() {
        let registry = Registry::new();
        let plugin = crate::metrics::PluginMetrics::register(&registry).unwrap();
        let publish = crate::publish::PublishMetrics::register(&registry).unwrap();
        assert!(!serving(&registry.gather()));
        plugin.registration(true);
        publish.last_success.set(1_700_000_000.0);
        assert!(serving(&registry.gather()));
    }

    #[tokio::test]
    async fn marks_ready_once_serving() {
        let registry = Registry::new();
        let registered = IntGauge::new("aws_dra_plugin_registered", "r").unwrap();
        let published = Gauge::new("aws_dra_publish_last_success_timestamp_seconds", "p").unwrap();
        registry.register(Box::new(registered.clone())).unwrap();
        registry.register(Box::new(published.clone())).unwrap();
        let readiness = Readiness::default();
        let task = tokio::spawn(mark_when_serving(registry, readiness.clone()));
        tokio::time::sleep(POLL * 2).await;
        assert!(!readiness.is_ready());
        registered.set(1);
        published.set(1.0);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(readiness.is_ready());
    }
}
