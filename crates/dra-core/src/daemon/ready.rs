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
//! One fact can take readiness back after the start: a checkpoint written
//! by a newer driver (a rollback) makes the plugin refuse every new claim,
//! so the driver is not ready while the plugin reads one, and `/readyz`
//! says why ([`follow_checkpoint`]); the rollout then stops on this node
//! rather than spreading a driver that cannot prepare.
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
    pending: Arc<Mutex<Pending>>,
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
            pending: Arc::new(Mutex::new(Pending {
                start: Awaited::ALL.into_iter().collect(),
                checkpoint: None,
            })),
            gauge,
            readiness,
        };
        waits.describe(&waits.lock());
        Ok(waits)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn describe(&self, pending: &Pending) {
        let mut words: Vec<String> = pending.start.iter().map(|w| w.words().into()).collect();
        if let Some(refusal) = &pending.checkpoint {
            words.push(format!("a checkpoint this build can read ({refusal})"));
        }
        self.readiness.set_waiting_for(words.join("; "));
    }

    /// `what` came; ready when it was the last (and the checkpoint reads).
    pub(crate) fn done(&self, what: Awaited) {
        let mut pending = self.lock();
        if !pending.start.remove(&what) {
            return;
        }
        self.gauge.with_label_values(&[what.label()]).set(0);
        self.describe(&pending);
        if pending.start.is_empty() {
            self.readiness.set(pending.checkpoint.is_none());
            match &pending.checkpoint {
                None => tracing::info!(
                    "ready: the API server answered, kubelet registered the plugin and the slices are published"
                ),
                Some(why) => tracing::warn!(
                    error = why,
                    "started, but not ready: the checkpoint is a newer driver's"
                ),
            }
        } else {
            let left: Vec<&str> = pending.start.iter().map(|w| w.label()).collect();
            tracing::info!(came = what.label(), waiting_for = ?left, "not ready yet");
        }
    }

    /// The plugin read a checkpoint of a newer version (`Some`: why no new
    /// claim is prepared) or one it reads (`None`): not ready while the
    /// former, whatever the start did.
    pub(crate) fn checkpoint_newer(&self, refusal: Option<String>) {
        let mut pending = self.lock();
        if pending.checkpoint == refusal {
            return;
        }
        match &refusal {
            Some(why) => {
                tracing::error!(error = why, "not ready: the checkpoint is a newer driver's")
            }
            None => tracing::info!("the checkpoint is one this build reads again"),
        }
        pending.checkpoint = refusal;
        self.describe(&pending);
        self.readiness
            .set(pending.start.is_empty() && pending.checkpoint.is_none());
    }

    /// Whether `what` is still awaited.
    #[cfg(test)]
    pub(crate) fn is_waiting_for(&self, what: Awaited) -> bool {
        self.lock().start.contains(&what)
    }
}

/// What readiness waits for: the start's steps, and a checkpoint this
/// build can read.
#[derive(Debug)]
struct Pending {
    start: BTreeSet<Awaited>,
    /// Why no new claim is prepared, while the checkpoint is newer.
    checkpoint: Option<String>,
}

/// Follows the plugin's checkpoint (`RunningPlugin::checkpoint_newer`)
/// into `waits` until the plugin stops.
pub(crate) async fn follow_checkpoint(
    mut newer: watch::Receiver<Option<String>>,
    waits: StartupWaits,
) {
    loop {
        waits.checkpoint_newer(newer.borrow_and_update().clone());
        if newer.changed().await.is_err() {
            return;
        }
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
