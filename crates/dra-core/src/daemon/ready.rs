//! When the driver is ready: kubelet has registered the plugin and the
//! node's slices have been published (reconciled once). Until then
//! `/readyz` answers 503, so a DaemonSet rolling update (`maxSurge: 1`,
//! `maxUnavailable: 0`) keeps the old pod until the new one can really
//! serve: kubelet has a plugin to call and the scheduler sees the devices.
//!
//! Both facts come as lifecycle signals from the components that know them:
//! the plugin's registration service ([`RunningPlugin::registered`], set by
//! kubelet's `NotifyRegistrationStatus`) and the publisher
//! (`PublisherConfig::published`, set on its first successful reconcile).
//! The same moments set `aws_dra_plugin_registered` and
//! `aws_dra_publish_last_success_timestamp_seconds`, the numbers an operator
//! sees; the gate no longer reads metric names.
//!
//! [`RunningPlugin::registered`]: crate::kubelet::plugin::RunningPlugin::registered

use tokio::sync::watch;

use crate::daemon::ops::Readiness;

/// Sets `readiness` once `registered` and `published` are both `true`;
/// returns then (readiness is a gate for rollouts, not a health signal:
/// `/readyz` also runs the liveness self-check). Returns without setting it
/// if either sender goes away first (the plugin or the publisher stopped).
pub(crate) async fn mark_when_serving(
    mut registered: watch::Receiver<bool>,
    mut published: watch::Receiver<bool>,
    readiness: Readiness,
) {
    if !(*registered.borrow() && *published.borrow()) {
        tracing::info!("not ready yet: waiting for kubelet's registration and the first publish");
    }
    loop {
        let both = *registered.borrow_and_update() && *published.borrow_and_update();
        if both {
            readiness.set(true);
            tracing::info!("ready: kubelet registered the plugin and the slices are published");
            return;
        }
        tokio::select! {
            changed = registered.changed() => if changed.is_err() { return },
            changed = published.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn ready_only_once_registered_and_published() {
        let (registered, registered_rx) = watch::channel(false);
        let (published, published_rx) = watch::channel(false);
        let readiness = Readiness::default();
        let task = tokio::spawn(mark_when_serving(
            registered_rx,
            published_rx,
            readiness.clone(),
        ));
        settle().await;
        assert!(!readiness.is_ready(), "nothing yet");
        published.send_replace(true);
        settle().await;
        assert!(!readiness.is_ready(), "published, not registered");
        registered.send_replace(false);
        settle().await;
        assert!(
            !readiness.is_ready(),
            "a rejected registration is not ready"
        );
        registered.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(readiness.is_ready());
    }

    #[tokio::test]
    async fn a_stopped_component_ends_the_wait_unready() {
        let (registered, registered_rx) = watch::channel(true);
        let (published, published_rx) = watch::channel(false);
        let readiness = Readiness::default();
        let task = tokio::spawn(mark_when_serving(
            registered_rx,
            published_rx,
            readiness.clone(),
        ));
        drop(published);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(!readiness.is_ready());
        drop(registered);
    }

    /// The signals come from the components themselves: a publisher config
    /// hands out receivers of its one flag, unset at first.
    #[test]
    fn the_publisher_signal_starts_unset() {
        let metrics =
            crate::publish::publisher::PublishMetrics::register(&prometheus::Registry::new())
                .unwrap();
        let config = crate::publish::publisher::PublisherConfig::new(
            "efa.networking.k8s.aws",
            "n",
            None,
            metrics,
        )
        .unwrap();
        assert!(!*config.published().borrow());
    }
}
