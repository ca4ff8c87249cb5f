//! The status task: what each claim's entries should say, and one writer per
//! claim name that applies it.
//!
//! The [`Tracker`] keeps the claims this process prepared (their devices,
//! the driver's data, each device's readiness) and turns every event into
//! the claim's desired entries: a prepare (the same devices and generation
//! as already written: nothing), an unprepare (no entries), a health change
//! of one of its devices (the `Ready` condition flips; its
//! `lastTransitionTime` moves only then). A claim's writer applies only the
//! latest desired state: one that arrives while a write waits for a retry
//! replaces it.
//!
//! Identity: writers and tracked claims are keyed by namespace and name, not
//! UID, because that is what an apply addresses. At most one UID is tracked
//! per name: a claim prepared under a name that held another UID replaces it
//! (two claims of one name never exist at once, so the other one is gone,
//! and its pending write is moot), and a later unprepare of the replaced UID
//! writes nothing (its entries went with its object; counted `stale`). A
//! name released (cleared) and prepared again, as the same claim or a new
//! one, gets a new writer that first waits for the old one, so a late clear
//! never overtakes the new entries. And every apply carries the claim's UID
//! ([`crate::prepare::status::api`]): one that reaches another claim of the
//! name is refused and dropped (`stale`), never retried.
//!
//! Bounds: each request [`REQUEST_TIMEOUT`](crate::prepare::status::api::REQUEST_TIMEOUT);
//! [`ATTEMPTS`] tries per desired state, [`FIRST_RETRY`] apart and doubling
//! (about 31 s of waiting in all); at most [`MAX_CLAIMS`] claims tracked.
//! A device missing from a health report keeps its last readiness.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::prepare::driver::{AllocatedDevice, ClaimRef, Driver};
use crate::prepare::status::api::{ApplyError, StatusApi, StatusMetrics};
use crate::prepare::status::entry::{Slot, apply_body};
use crate::prepare::status::{DeviceReadiness, Event, Prepared};

/// Tries per desired state of a claim.
pub(crate) const ATTEMPTS: u32 = 6;
/// The first wait between tries; each next one doubles.
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Claims tracked at most (a node runs far fewer).
pub(crate) const MAX_CLAIMS: usize = 4096;
/// A write waits until no claim was prepared or unprepared on the node for
/// this long ([`settled`])...
pub(crate) const QUIET: Duration = Duration::from_secs(2);
/// ...but never longer than this.
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(10);

/// What a claim's entries should say; no slots: none of ours.
#[derive(Clone, Debug)]
pub(crate) struct Desired {
    pub(crate) claim: ClaimRef,
    pub(crate) generation: Option<i64>,
    pub(crate) slots: Vec<Slot>,
}

/// A claim's namespace and name: what an apply addresses.
type Name = (String, String);

fn name_of(claim: &ClaimRef) -> Name {
    (claim.namespace.clone(), claim.name.clone())
}

struct Writer {
    desired: watch::Sender<Desired>,
    task: JoinHandle<()>,
}

/// The task's state; see the module docs.
pub(crate) struct Tracker<D: Driver> {
    driver: Arc<D>,
    driver_name: String,
    api: Arc<dyn StatusApi>,
    metrics: StatusMetrics,
    /// Readiness by (pool, device): healthy, what failed.
    health: HashMap<(String, String), (bool, String)>,
    /// What was last asked of each tracked claim's writer, by claim name
    /// (the UID is the desired state's).
    claims: HashMap<Name, Desired>,
    writers: HashMap<Name, Writer>,
    /// Writers of released claims still finishing their clear.
    retiring: HashMap<Name, JoinHandle<()>>,
    /// When a claim was last prepared or unprepared here ([`settled`]).
    activity: watch::Sender<tokio::time::Instant>,
}

impl<D: Driver> Tracker<D> {
    pub(crate) fn new(
        driver: Arc<D>,
        driver_name: String,
        api: Arc<dyn StatusApi>,
        metrics: StatusMetrics,
    ) -> Self {
        Self {
            driver,
            driver_name,
            api,
            metrics,
            health: HashMap::new(),
            claims: HashMap::new(),
            writers: HashMap::new(),
            retiring: HashMap::new(),
            activity: watch::channel(tokio::time::Instant::now()).0,
        }
    }

    /// Until `shutdown` or the pipeline's end is gone.
    pub(crate) async fn run(
        mut self,
        mut events: mpsc::Receiver<Event<D::Config>>,
        mut readiness: BoxStream<'static, Vec<DeviceReadiness>>,
        shutdown: CancellationToken,
    ) {
        let mut readiness_open = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.on_event(event),
                    None => break,
                },
                list = readiness.next(), if readiness_open => match list {
                    Some(list) => self.on_readiness(list),
                    None => readiness_open = false,
                },
            }
        }
        for w in self.writers.into_values() {
            w.task.abort();
        }
    }

    pub(crate) fn on_event(&mut self, event: Event<D::Config>) {
        self.activity.send_replace(tokio::time::Instant::now());
        match event {
            Event::Prepared(prepared) => {
                let claim = prepared.claim.clone();
                let Some(desired) = self.desired_for(prepared) else {
                    return;
                };
                let name = name_of(&claim);
                match self.claims.get(&name) {
                    Some(d) if same_devices(d, &desired) => {
                        tracing::debug!(claim = %claim, "no status write: these entries are already written");
                        return;
                    }
                    Some(d) if d.claim.uid != claim.uid => {
                        tracing::debug!(claim = %claim, replaced = %d.claim.uid, "claim recreated under its name; the old one's status is no longer written");
                    }
                    Some(_) => {}
                    None if self.claims.len() >= MAX_CLAIMS => {
                        tracing::warn!(claim = %claim, limit = MAX_CLAIMS, "too many claims tracked; no status for this one");
                        self.metrics.write("dropped");
                        return;
                    }
                    None => {}
                }
                self.claims.insert(name, desired.clone());
                self.write(desired);
            }
            Event::Unprepared { claim } => {
                let name = name_of(&claim);
                if let Some(d) = self.claims.get(&name)
                    && d.claim.uid != claim.uid
                {
                    // Replaced by a claim of the same name: this one's object,
                    // and its entries with it, are gone.
                    tracing::debug!(claim = %claim, current = %d.claim.uid, "no status clear: the name holds another claim now");
                    self.metrics.write("stale");
                    return;
                }
                self.claims.remove(&name);
                self.write(Desired {
                    claim,
                    generation: None,
                    slots: Vec::new(),
                });
            }
        }
    }

    /// The entries of a claim as prepared; `None` when it has no devices of
    /// ours.
    fn desired_for(&self, prepared: Prepared<D::Config>) -> Option<Desired> {
        let Prepared {
            claim,
            generation,
            devices: resolved,
        } = prepared;
        let claim = &claim;
        if resolved.is_empty() {
            tracing::debug!(claim = %claim, driver = %self.driver_name, "no status: the claim has no devices of this driver");
            return None;
        }
        let allocated: Vec<AllocatedDevice<D::Config>> =
            resolved.iter().map(|r| r.allocated.clone()).collect();
        let reports = self.driver.device_status(claim, &allocated);
        if reports.len() < allocated.len() {
            // Their entries still carry the Ready condition.
            let without: Vec<&str> = allocated
                .iter()
                .filter(|a| !reports.iter().any(|r| r.device == a.device))
                .map(|a| a.device.as_str())
                .collect();
            tracing::debug!(claim = %claim, ?without, "the driver gave no data for some devices");
        }
        let now = Timestamp::now();
        let mut slots = Vec::new();
        for r in &resolved {
            let a = &r.allocated;
            let report = reports.iter().find(|s| s.device == a.device).cloned();
            let (healthy, health_message) = self
                .health
                .get(&(a.pool.clone(), a.device.clone()))
                .cloned()
                .unwrap_or((true, String::new()));
            let shares: Vec<Option<String>> = if r.share_ids.is_empty() {
                vec![None]
            } else {
                r.share_ids.iter().cloned().map(Some).collect()
            };
            for share_id in shares {
                slots.push(Slot {
                    pool: a.pool.clone(),
                    device: a.device.clone(),
                    share_id,
                    report: report.clone(),
                    healthy,
                    health_message: health_message.clone(),
                    since: now,
                });
            }
        }
        Some(Desired {
            claim: claim.clone(),
            generation,
            slots,
        })
    }

    pub(crate) fn on_readiness(&mut self, list: Vec<DeviceReadiness>) {
        let health: HashMap<(String, String), (bool, String)> = list
            .into_iter()
            .map(|r| ((r.pool, r.device), (r.healthy, r.message)))
            .collect();
        let now = Timestamp::now();
        let mut changed = Vec::new();
        for desired in self.claims.values_mut() {
            let mut any = false;
            for slot in &mut desired.slots {
                let key = (slot.pool.clone(), slot.device.clone());
                let Some((healthy, message)) = health.get(&key) else {
                    continue;
                };
                if slot.healthy != *healthy {
                    slot.since = now;
                }
                // A healthy entry's message does not say what the scan saw.
                if slot.healthy != *healthy || (!*healthy && slot.health_message != *message) {
                    slot.healthy = *healthy;
                    slot.health_message = message.clone();
                    any = true;
                }
            }
            if any {
                changed.push(desired.clone());
            }
        }
        self.health.extend(health);
        for desired in changed {
            self.write(desired);
        }
    }

    /// Hands `desired` to the writer of the claim's name (started when
    /// there is none); a clear retires the writer once it is done.
    fn write(&mut self, desired: Desired) {
        self.retiring.retain(|_, task| !task.is_finished());
        let name = name_of(&desired.claim);
        let clear = desired.slots.is_empty();
        match self.writers.get(&name) {
            Some(w) => {
                w.desired.send_replace(desired);
            }
            None => {
                let before = self.retiring.remove(&name);
                let (tx, rx) = watch::channel(desired);
                let task = tokio::spawn(write_claim(
                    rx,
                    self.activity.subscribe(),
                    before,
                    self.api.clone(),
                    self.driver_name.clone(),
                    self.metrics.clone(),
                ));
                self.writers
                    .insert(name.clone(), Writer { desired: tx, task });
            }
        }
        if clear && let Some(w) = self.writers.remove(&name) {
            self.retiring.insert(name, w.task);
        }
    }
}

/// Whether two desired states are of one claim (UID) and name the same
/// devices at the same generation (a repeated prepare of a claim already
/// written).
fn same_devices(a: &Desired, b: &Desired) -> bool {
    let keys = |d: &Desired| -> Vec<(String, String, Option<String>)> {
        d.slots
            .iter()
            .map(|s| (s.pool.clone(), s.device.clone(), s.share_id.clone()))
            .collect()
    };
    a.claim.uid == b.claim.uid && a.generation == b.generation && keys(a) == keys(b)
}

/// One claim name's writer: applies the latest desired state until its
/// sender is gone; `before`: the writer of an earlier life of the name (the
/// same claim released, or a claim deleted and recreated).
async fn write_claim(
    mut rx: watch::Receiver<Desired>,
    mut activity: watch::Receiver<tokio::time::Instant>,
    before: Option<JoinHandle<()>>,
    api: Arc<dyn StatusApi>,
    driver_name: String,
    metrics: StatusMetrics,
) {
    if let Some(before) = before {
        let _ = before.await;
    }
    loop {
        settled(&mut activity).await;
        let desired = rx.borrow_and_update().clone();
        let superseded = apply_with_retries(&desired, &mut rx, &*api, &driver_name, &metrics).await;
        if !superseded && rx.changed().await.is_err() {
            return;
        }
    }
}

/// Returns once no claim was prepared or unprepared on the node for
/// [`QUIET`], or after [`MAX_HOLD`]. Status is what a user reads after
/// the fact; during a burst of pods every apply competes with kubelet and
/// the scheduler for the API server (a server-side apply per claim, and
/// the watch events it sends to every claim watcher), and delays the pods
/// it describes. So the writes of a burst go after it.
async fn settled(activity: &mut watch::Receiver<tokio::time::Instant>) {
    let latest = tokio::time::Instant::now() + MAX_HOLD;
    loop {
        let until = (*activity.borrow_and_update() + QUIET).min(latest);
        if tokio::time::Instant::now() >= until {
            return;
        }
        tokio::time::sleep_until(until).await;
    }
}

/// Applies `desired` with the retries of the module docs; `true` when a
/// newer desired state came while waiting to retry (it replaces this one).
async fn apply_with_retries(
    desired: &Desired,
    rx: &mut watch::Receiver<Desired>,
    api: &dyn StatusApi,
    driver_name: &str,
    metrics: &StatusMetrics,
) -> bool {
    let claim = &desired.claim;
    let body = apply_body(driver_name, claim, desired.generation, &desired.slots);
    let mut delay = FIRST_RETRY;
    for attempt in 1..=ATTEMPTS {
        let error = match api.apply(&claim.namespace, &claim.name, &body).await {
            Ok(()) => {
                metrics.write("applied");
                tracing::debug!(claim = %claim, entries = desired.slots.len(), "claim device status written");
                return false;
            }
            Err(ApplyError::Gone) => {
                metrics.write("gone");
                tracing::debug!(claim = %claim, "claim gone; no device status to write");
                return false;
            }
            Err(ApplyError::Stale) => {
                metrics.write("stale");
                tracing::debug!(claim = %claim, "the claim's name holds another claim (another UID); this status write is dropped");
                return false;
            }
            Err(ApplyError::Refused(error)) => {
                metrics.write("failed");
                tracing::warn!(claim = %claim, %error, "claim device status refused");
                return false;
            }
            Err(ApplyError::Transient(error)) => error,
        };
        if attempt == ATTEMPTS {
            metrics.write("failed");
            tracing::warn!(claim = %claim, %error, attempts = ATTEMPTS, "claim device status not written; giving up");
            return false;
        }
        tracing::debug!(claim = %claim, %error, attempt, "claim device status not written; retrying");
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        tokio::select! {
            () = &mut sleep => {}
            changed = rx.changed() => match changed {
                Ok(()) => return true,
                Err(_) => sleep.await,
            },
        }
        delay *= 2;
    }
    false
}
