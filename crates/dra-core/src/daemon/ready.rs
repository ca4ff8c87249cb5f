//! When the driver is ready: the API server has answered (the Node was
//! read), kubelet has registered the plugin and the node's slices have been
//! published (reconciled once). Until then `/readyz` answers 503 and says
//! which of these it still waits for, and the gauge
//! `aws_dra_waiting_for{what}` shows the same, so a DaemonSet rolling update
//! (`maxSurge: 1`, `maxUnavailable: 0`) keeps the old pod until the new one
//! can really serve, and an operator sees why a pod is not ready (an
//! unreachable API server is one line of `/readyz`, not a guess).
//!
//! The facts come as lifecycle signals from the components that know them:
//! the runtime after its Node read, the plugin's registration service
//! ([`RunningPlugin::registered`], set by kubelet's
//! `NotifyRegistrationStatus`) and the publisher
//! (`PublisherConfig::published`, set on its first successful reconcile).
//!
//! [`RunningPlugin::registered`]: crate::kubelet::plugin::RunningPlugin::registered

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use prometheus::{IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use crate::daemon::ops::Readiness;

/// What readiness waits for, in the order a start meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Awaited {
    /// The first answer of the API server (the driver's Node read): until
    /// then prepare is refused and nothing is published.
    ApiServer,
    /// kubelet's registration of the plugin.
    Registration,
    /// The first successful reconcile of the node's slices.
    FirstPublish,
}

impl Awaited {
    const ALL: [Awaited; 3] = [
        Awaited::ApiServer,
        Awaited::Registration,
        Awaited::FirstPublish,
    ];

    /// The `what` label of `aws_dra_waiting_for`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Awaited::ApiServer => "apiserver",
            Awaited::Registration => "kubelet_registration",
            Awaited::FirstPublish => "first_publish",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Awaited::ApiServer => {
                "the API server (the Node is not read yet: prepare is refused, nothing is published)"
            }
            Awaited::Registration => "kubelet's registration of the plugin",
            Awaited::FirstPublish => "the first publish of the node's ResourceSlices",
        }
    }
}

/// What the start still waits for: `/readyz` says it in words, the gauge
/// `aws_dra_waiting_for{what}` is 1 for each (0 once done), and readiness
/// is set when nothing is left.
#[derive(Debug, Clone)]
pub(crate) struct StartupWaits {
    pending: Arc<Mutex<BTreeSet<Awaited>>>,
    gauge: IntGaugeVec,
    readiness: Readiness,
}

impl StartupWaits {
    /// Everything pending; registers the gauge in `registry`.
    pub(crate) fn register(
        registry: &Registry,
        readiness: Readiness,
    ) -> Result<Self, prometheus::Error> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "aws_dra_waiting_for",
                "1 while the driver's start waits for `what` (apiserver, kubelet_registration, \
                 first_publish), 0 once it came",
            ),
            &["what"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        for what in Awaited::ALL {
            gauge.with_label_values(&[what.label()]).set(1);
        }
        let waits = Self {
            pending: Arc::new(Mutex::new(Awaited::ALL.into_iter().collect())),
            gauge,
            readiness,
        };
        waits.describe(&waits.lock());
        Ok(waits)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<Awaited>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn describe(&self, pending: &BTreeSet<Awaited>) {
        let words: Vec<&str> = pending.iter().map(|w| w.words()).collect();
        self.readiness.set_waiting_for(words.join("; "));
    }

    /// `what` came; ready when it was the last.
    pub(crate) fn done(&self, what: Awaited) {
        let mut pending = self.lock();
        if !pending.remove(&what) {
            return;
        }
        self.gauge.with_label_values(&[what.label()]).set(0);
        self.describe(&pending);
        if pending.is_empty() {
            self.readiness.set(true);
            tracing::info!(
                "ready: the API server answered, kubelet registered the plugin and the slices are published"
            );
        } else {
            let left: Vec<&str> = pending.iter().map(|w| w.label()).collect();
            tracing::info!(came = what.label(), waiting_for = ?left, "not ready yet");
        }
    }

    /// Whether `what` is still awaited.
    #[cfg(test)]
    pub(crate) fn is_waiting_for(&self, what: Awaited) -> bool {
        self.lock().contains(&what)
    }
}

/// Marks `what` done in `waits` once `signal` is `true` (the plugin's
/// registration, the publisher's first sync); returns then, or without
/// marking it if the sender goes away first (the component stopped).
pub(crate) async fn mark_when(
    mut signal: watch::Receiver<bool>,
    what: Awaited,
    waits: StartupWaits,
) {
    if signal.wait_for(|done| *done).await.is_ok() {
        waits.done(what);
    }
}

#[cfg(test)]
mod tests;
