//! The ops server's connection slots: at most [`MAX_CONNECTIONS`] open
//! connections, and what happens to the next one.
//!
//! Any pod may reach the ops port (the chart's NetworkPolicy admits the
//! monitoring namespace by default, but it can be opened, and with
//! `hostNetwork` or a CNI that ignores policies it is open), and a
//! connection that sends one byte and nothing more holds a task and its
//! buffers until the header timeout. Without a bound, a client opening a
//! thousand such connections a second keeps thousands open on a process
//! with a 128 Mi limit and two runtime threads that also serve kubelet.
//!
//! At the cap, a new connection takes the slot of the oldest open
//! connection that has no request in progress (one still sending its
//! request head, or idle between keep-alive requests, or one whose client
//! does not read its answer), which is closed at once. So a client that
//! holds every slot with slow connections does not keep kubelet's probes
//! or a scrape out: a new connection always gets in, and it keeps its slot
//! as long as it sends its request head before [`MAX_CONNECTIONS`] newer
//! connections arrive (at 1,000 connections a second, a quarter of a
//! second; kubelet and Prometheus send theirs with the connect). Refusing
//! the newcomer instead would hand the port to whoever opens connections
//! fastest, and waiting in the listen backlog (as the kubelet sockets do)
//! the same. Only when every slot is serving a request, which with the
//! shared probe and the shared metrics rendering lasts a moment, is the new
//! connection closed unanswered.
//!
//! Both are counted in `aws_dra_ops_connections_rejected_total{reason}`
//! (`evicted`, `refused`); `aws_dra_ops_connections_open` is the number
//! of slots taken.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::Notify;

/// Open connections at most. An open connection waiting for its request
/// head costs a task and hyper's 8 KiB read buffer, about 12 KiB: the cap
/// bounds them to about 3 MiB.
pub(crate) const MAX_CONNECTIONS: usize = 256;

/// The ops server's connection metrics.
#[derive(Clone)]
pub(crate) struct OpsMetrics {
    evicted: IntCounter,
    refused: IntCounter,
    open: IntGauge,
}

impl OpsMetrics {
    /// Registers the metrics in `registry`.
    pub(crate) fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let rejected = IntCounterVec::new(
            Opts::new(
                "aws_dra_ops_connections_rejected_total",
                "Connections to the ops server (/metrics, /healthz, /readyz) closed because \
                 every slot was taken: evicted (an open connection without a request in \
                 progress, the oldest, closed to make room for a new one) or refused (the new \
                 one closed unanswered, every slot serving a request).",
            ),
            &["reason"],
        )?;
        let open = IntGauge::new(
            "aws_dra_ops_connections_open",
            "Connections the ops server holds open.",
        )?;
        registry.register(Box::new(rejected.clone()))?;
        registry.register(Box::new(open.clone()))?;
        Ok(Self {
            evicted: rejected.with_label_values(&["evicted"]),
            refused: rejected.with_label_values(&["refused"]),
            open,
        })
    }
}

/// A slot's connection: idle (no request in progress), serving a
/// request, or evicted (closing).
const IDLE: u8 = 0;
const BUSY: u8 = 1;
const EVICTED: u8 = 2;

/// One open connection's slot.
#[derive(Default)]
pub(crate) struct Slot {
    state: AtomicU8,
    evict: Notify,
}

impl Slot {
    /// Marks a request in progress, until the guard drops; `None` when the
    /// connection was evicted meanwhile (it is closing).
    pub(crate) fn serving(self: &Arc<Self>) -> Option<Serving> {
        self.state
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Serving(self.clone()))
    }

    /// Completes once the connection must close to make room.
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

/// A request in progress on a slot's connection.
pub(crate) struct Serving(Arc<Slot>);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self
            .0
            .state
            .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Every slot of one server.
pub(crate) struct Slots {
    cap: usize,
    metrics: OpsMetrics,
    open: std::sync::Mutex<Open>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, Arc<Slot>>,
    /// When the cap was last reported in the log.
    warned: Option<std::time::Instant>,
}

/// The least time between two warnings that the cap was reached: a client
/// that opens connections must not decide how much the driver logs.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Slots {
    pub(crate) fn new(cap: usize, metrics: OpsMetrics) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            metrics,
            open: Default::default(),
        })
    }

    /// Open connections at most.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The metrics the slots count in.
    #[cfg(test)]
    pub(crate) fn metrics(&self) -> &OpsMetrics {
        &self.metrics
    }

    /// A slot for a newly accepted connection, made by evicting the oldest
    /// idle one at the cap; `None` when every slot is serving a request.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Taken> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.by_age.len() >= self.cap {
            if open.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                open.warned = Some(std::time::Instant::now());
                tracing::warn!(
                    cap = self.cap,
                    evicted = self.metrics.evicted.get(),
                    refused = self.metrics.refused.get(),
                    "ops server at its connection limit: the oldest idle connections make room \
                     for new ones (aws_dra_ops_connections_rejected_total; logged at most once a minute)"
                );
            }
            let oldest_idle = open.by_age.iter().find_map(|(id, slot)| {
                slot.state
                    .compare_exchange(IDLE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                    .then_some(*id)
            });
            match oldest_idle.and_then(|id| open.by_age.remove(&id)) {
                Some(slot) => {
                    slot.evict.notify_one();
                    self.metrics.evicted.inc();
                }
                None => {
                    self.metrics.refused.inc();
                    return None;
                }
            }
        }
        let id = open.next;
        open.next += 1;
        let slot = Arc::new(Slot::default());
        open.by_age.insert(id, slot.clone());
        self.metrics.open.set(open.by_age.len() as i64);
        Some(Taken {
            slots: self.clone(),
            id,
            slot,
        })
    }
}

/// A taken slot: given back when its connection ends.
pub(crate) struct Taken {
    slots: Arc<Slots>,
    id: u64,
    pub(crate) slot: Arc<Slot>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.by_age.remove(&self.id);
        self.slots.metrics.open.set(open.by_age.len() as i64);
    }
}
