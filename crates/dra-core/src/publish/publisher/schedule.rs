//! When the publisher reconciles: after every change of its inputs (the
//! devices, a watch event, a conflict resolved, an own write due for a
//! check), once the watch has listed the node's slices, and never while a
//! failed round waits out its backoff.
//!
//! Failed rounds are retried with capped exponential backoff and jitter
//! ([`Backoff`]). After an API server outage the watch's first event cuts a
//! grown backoff short, so the pool is repaired within seconds of the
//! server's return, not at the end of the backoff.

use std::time::Duration;

use kube::runtime::watcher::Event;
use tokio::time::Instant;

use crate::publish::backoff::{Backoff, BackoffConfig};

/// The reconcile schedule: pure state, the loop asks it what to do.
#[derive(Debug)]
pub(super) struct Schedule {
    /// Something changed since the last reconcile.
    dirty: bool,
    /// The watch has listed the node's slices once.
    synced: bool,
    backoff: Backoff,
    /// A failed round waits until then.
    retry_at: Option<Instant>,
    /// The watch failed and has not delivered anything since: the API
    /// server may be gone. Its next event says the server is back.
    watch_failed: bool,
}

impl Schedule {
    pub(super) fn new(backoff: BackoffConfig) -> Self {
        Self {
            dirty: true,
            synced: false,
            backoff: Backoff::new(backoff),
            retry_at: None,
            watch_failed: false,
        }
    }

    /// Starts a reconcile when one is due: clears the change it answers.
    pub(super) fn start(&mut self) -> bool {
        let due = self.dirty && self.synced && self.retry_at.is_none();
        if due {
            self.dirty = false;
        }
        due
    }

    /// An input changed: reconcile again.
    pub(super) fn changed(&mut self) {
        self.dirty = true;
    }

    /// Takes in a watch event.
    pub(super) fn watch_event<K>(&mut self, event: &Event<K>) {
        if std::mem::take(&mut self.watch_failed) && self.retry_at.is_some() {
            // A write failed while the server was away and waits out a
            // backoff that grew during the outage: the watch answering
            // again means the server is back, so write now.
            tracing::info!("resourceslice watch is back; retrying the failed write now");
            self.backoff.reset();
            self.retry_at = None;
            self.dirty = true;
        }
        match event {
            Event::InitDone => {
                self.synced = true;
                self.dirty = true;
            }
            Event::Apply(_) | Event::Delete(_) => self.dirty = true,
            Event::Init | Event::InitApply(_) => {}
        }
    }

    /// The watch failed.
    pub(super) fn watch_failed(&mut self) {
        self.watch_failed = true;
    }

    /// A round ended with the pool as desired.
    pub(super) fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// A round failed: the next waits until `now` plus the returned delay.
    pub(super) fn failed(&mut self, now: Instant) -> Duration {
        let delay = self.backoff.next_delay();
        self.retry_at = Some(now + delay);
        self.dirty = true;
        delay
    }

    /// When a failed round is retried.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The retry is due.
    pub(super) fn retry_due(&mut self) {
        self.retry_at = None;
        self.dirty = true;
    }
}

#[cfg(test)]
mod tests;
