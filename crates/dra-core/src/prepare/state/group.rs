//! Group commit: kubelet's concurrent calls share one pass under the
//! data-dir lock and one checkpoint commit.
//!
//! A burst of N pods on one node means N NodePrepareResources calls at
//! once. Served one by one, each would take the lock, read the checkpoint,
//! write its CDI spec and the checkpoint, and make the next call wait for
//! all of that. Instead every call queues its work ([`Work`]) and then
//! takes the lock; the first to get it (the leader) takes every job queued
//! so far, its own included, serves them in queue order against one
//! in-memory checkpoint, commits once, answers each job, and only then
//! releases the lock. A call whose job a leader took finds its answer when
//! it gets the lock and returns at once.
//!
//! The guarantees are those of a call served alone:
//! - nothing is answered before the commit that records it has returned;
//! - one commit writes the CDI specs and the checkpoint of the whole group
//!   ([`crate::prepare::atomic::commit`]: specs renamed before the checkpoint), so a
//!   crash leaves every claim of the group recorded or none, never a claim
//!   whose spec is missing; a claim recorded but not answered (a crash
//!   between the commit and the answer, as for a call served alone) is
//!   answered from the checkpoint when kubelet calls again;
//! - jobs are taken and answered only under the lock, so a call that holds
//!   the lock and has no answer yet still has its job in the queue; a
//!   leader dropped half-way (kubelet cancelled its call) drops the other
//!   jobs' answer channels, and their calls queue their work again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::oneshot;

use super::PrepareOutcome;
use crate::prepare::claims::ClaimSourceError;
use crate::prepare::driver::ClaimRef;

/// One prepare call's claims and what the API server said of each.
pub(super) struct CallInput {
    pub(super) requested: Vec<ClaimRef>,
    pub(super) fetched: Vec<Result<Option<ResourceClaim>, ClaimSourceError>>,
}

/// What a call asks of the next group.
#[derive(Clone)]
pub(super) enum Work {
    Prepare(PrepareWork),
    Unprepare { requested: Arc<Vec<ClaimRef>> },
}

/// A prepare pass over the claims at `pending` of `call`; none waits for
/// a held device when `last_pass`. `waited_since`: when the call began,
/// once it has waited (the claims' durations then include the wait).
#[derive(Clone)]
pub(super) struct PrepareWork {
    pub(super) call: Arc<CallInput>,
    pub(super) pending: Vec<usize>,
    pub(super) last_pass: bool,
    pub(super) waited_since: Option<Instant>,
}

/// What one group gathers under the lock, its passes in turn changing it:
/// the checkpoint, the files to put in place with it (CDI specs,
/// attributes files), whether claims were added or released, and the
/// claims answered with devices, for the status task once committed.
pub(super) struct Commit<C> {
    pub(super) checkpoint: crate::prepare::checkpoint::Checkpoint,
    pub(super) staged: Vec<crate::prepare::atomic::Staged>,
    pub(super) changed: bool,
    pub(super) released: bool,
    pub(super) status: Vec<crate::prepare::status::Prepared<C>>,
}

impl<C> Commit<C> {
    pub(super) fn new(checkpoint: crate::prepare::checkpoint::Checkpoint) -> Self {
        Self {
            checkpoint,
            staged: Vec::new(),
            changed: false,
            released: false,
            status: Vec::new(),
        }
    }
}

/// A job's answer: a prepare pass, or unprepare's answers per claim UID.
pub(super) enum Done {
    Prepare(Pass),
    Unprepare(BTreeMap<String, Result<(), String>>),
}

pub(super) struct Job {
    pub(super) id: u64,
    pub(super) work: Work,
    /// When the job was queued (its wait for the group counts as lock time).
    pub(super) queued: Instant,
    pub(super) reply: oneshot::Sender<Result<Done, String>>,
}

/// The jobs waiting for the next leader.
#[derive(Default)]
pub(crate) struct Queue {
    jobs: Mutex<Vec<Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Queue {
    /// Queues `work`; returns its id and the channel its answer comes on.
    pub(super) fn push(&self, work: Work) -> (u64, oneshot::Receiver<Result<Done, String>>) {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        self.lock().push(Job {
            id,
            work,
            queued: Instant::now(),
            reply,
        });
        (id, answer)
    }

    /// Every job queued so far, in queue order.
    pub(super) fn take_all(&self) -> Vec<Job> {
        std::mem::take(&mut *self.lock())
    }

    /// Removes job `id` if no leader took it; whether it was still queued.
    pub(super) fn withdraw(&self, id: u64) -> bool {
        let mut jobs = self.lock();
        let before = jobs.len();
        jobs.retain(|j| j.id != id);
        jobs.len() != before
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Job>> {
        // A panic while the queue is held leaves a plain Vec: still usable.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one prepare pass came to.
#[derive(Default)]
pub(super) struct Pass {
    pub(super) answered: Vec<(usize, PrepareOutcome)>,
    /// Claims whose device another claim holds, with that claim's UID.
    pub(super) held: Vec<(usize, String)>,
    pub(super) timings: PassTimings,
}

/// Seconds spent in each step of a pass (summed over passes for a call).
#[derive(Default)]
pub(super) struct PassTimings {
    /// Waiting for the group that served the pass (the lock, and the
    /// calls queued before it in that group).
    pub(super) lock: f64,
    /// Reading the checkpoint (and the boot id), once per group.
    pub(super) load: f64,
    /// Resolving, the driver, the CDI specs of this call's claims.
    pub(super) claims: f64,
    /// Writing the checkpoint, once per group.
    pub(super) save: f64,
}

impl PassTimings {
    pub(super) fn add(&mut self, other: &PassTimings) {
        self.lock += other.lock;
        self.load += other.load;
        self.claims += other.claims;
        self.save += other.save;
    }
}
