//! Claim device status: after a claim is prepared, one entry per prepared
//! device in the claim's `status.devices` (`resource.k8s.io/v1`, KEP-4817),
//! with a `Ready` condition that follows the device's health, the driver's
//! `data` and, for a network device, `networkData`; cleared at unprepare.
//!
//! Written by server-side apply to the `status` subresource with the driver
//! name as field manager. `status.devices` is a list-map keyed by driver,
//! pool, device and shareID, so each manager owns only its own entries: the
//! EFA, Neuron and GPU drivers' entries of one claim coexist, and applying
//! an empty set removes exactly ours. The API server drops the entries of
//! deallocated devices itself, so a claim deallocated before our clear lands
//! is already clean.
//!
//! Writing never fails or delays a prepare: once a group commit is in
//! place, the pipeline hands each claim it prepared, with the devices it
//! resolved, to a bounded queue ([`ClaimStatus`]), and a task asks the
//! driver for their data and applies it, each claim
//! name through its own writer ([`writer`]) with a timeout per request and a
//! bounded number of retries; failures and a full queue are counted in
//! `aws_dra_plugin_claim_status_writes_total`.
//!
//! Identity: an apply addresses a claim by namespace and name, which a
//! claim deleted and recreated keeps. Every apply therefore carries the
//! claim's UID, which the API server checks ([`api`]): a write for the old
//! claim never lands on the new one (it is dropped and counted `stale`),
//! and writes are ordered per name, so the new claim's entries are written
//! after the old claim's clear, never overtaken by it ([`writer`]).
//!
//! Limits: the entries of claims prepared by an earlier run of the driver are
//! not rewritten on a health change until kubelet prepares them again (the
//! checkpoint keeps no claim object to build them from). The task takes the
//! claim prepared last under a name for the live one: were a deleted claim's
//! prepare answered after its successor's, the successor's entries would be
//! left to the API server, which drops them at deallocation.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::prepare::driver::{ClaimRef, Driver};
use crate::prepare::resolve::ResolvedDevice;

pub(crate) mod api;
pub(crate) mod entry;
pub(crate) mod writer;

pub(crate) use api::{KubeStatusApi, StatusApi, StatusMetrics};

/// How many claim events may wait for the status task; beyond that an
/// event is dropped and counted (prepare never waits for status).
pub(crate) const QUEUE: usize = 1024;

/// Whether a published device is fit for use, as the health scan last saw
/// it: what the `Ready` condition of its entries follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceReadiness {
    pub(crate) pool: String,
    pub(crate) device: String,
    pub(crate) healthy: bool,
    /// What failed, for the condition's message; empty when healthy.
    pub(crate) message: String,
}

/// A claim the pipeline prepared, with its devices of this driver as the
/// pipeline resolved them (the task does not resolve the claim again).
pub(crate) struct Prepared<C> {
    pub(crate) claim: ClaimRef,
    /// The claim's generation as read, for `observedGeneration`.
    pub(crate) generation: Option<i64>,
    pub(crate) devices: Vec<ResolvedDevice<C>>,
}

/// A claim the pipeline answered or released.
pub(crate) enum Event<C> {
    Prepared(Prepared<C>),
    Unprepared { claim: ClaimRef },
}

/// The pipeline's end of the status task: cheap to clone; the default
/// writes nothing (tests, or no API server).
pub(crate) struct ClaimStatus<C> {
    events: Option<mpsc::Sender<Event<C>>>,
    metrics: Option<StatusMetrics>,
}

impl<C> Default for ClaimStatus<C> {
    fn default() -> Self {
        Self {
            events: None,
            metrics: None,
        }
    }
}

impl<C> Clone for ClaimStatus<C> {
    fn clone(&self) -> Self {
        Self {
            events: self.events.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<C> ClaimStatus<C> {
    /// An end whose events come out of the receiver (tests of the pipeline).
    #[cfg(test)]
    pub(crate) fn channel() -> (Self, mpsc::Receiver<Event<C>>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let status = Self {
            events: Some(tx),
            metrics: None,
        };
        (status, rx)
    }

    /// After a group commit: every claim it answered with devices gets its
    /// entries (again, for one answered from the checkpoint: the task skips
    /// what it already wrote).
    pub(crate) fn prepared(&self, claims: Vec<Prepared<C>>) {
        for claim in claims {
            self.send(Event::Prepared(claim));
        }
    }

    /// After an unprepare call: every claim released gets its entries
    /// cleared.
    pub(crate) fn unprepared(
        &self,
        requested: &[ClaimRef],
        answers: &BTreeMap<String, Result<(), String>>,
    ) {
        for claim in requested {
            if let Some(Ok(())) = answers.get(&claim.uid) {
                self.send(Event::Unprepared {
                    claim: claim.clone(),
                });
            }
        }
    }

    fn send(&self, event: Event<C>) {
        let Some(events) = &self.events else {
            tracing::debug!("no status: this plugin writes no claim status (no API client)");
            return;
        };
        if events.try_send(event).is_err() {
            tracing::warn!("claim status queue full or closed; this status write is dropped");
            if let Some(m) = &self.metrics {
                m.write("dropped");
            }
        }
    }
}

/// What the plugin needs to start the status task: where to write, the
/// devices' readiness as the health scan reports it, the counter.
pub(crate) struct StatusSetup {
    pub(crate) api: Arc<dyn StatusApi>,
    pub(crate) readiness: BoxStream<'static, Vec<DeviceReadiness>>,
    pub(crate) metrics: StatusMetrics,
}

impl StatusSetup {
    /// Starts the task (until `shutdown`) and returns the pipeline's end.
    pub(crate) fn start<D: Driver>(
        self,
        driver: Arc<D>,
        driver_name: &str,
        shutdown: CancellationToken,
    ) -> ClaimStatus<D::Config> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = writer::Tracker::new(
            driver,
            driver_name.to_owned(),
            self.api,
            self.metrics.clone(),
        );
        tokio::spawn(task.run(rx, self.readiness, shutdown));
        ClaimStatus {
            events: Some(tx),
            metrics: Some(self.metrics),
        }
    }
}

#[cfg(test)]
mod tests;
