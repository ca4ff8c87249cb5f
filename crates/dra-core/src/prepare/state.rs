//! The prepare/unprepare pipeline behind both DRA service versions.
//!
//! Prepare: GET every claim (before taking the lock, so a slow API server
//! does not hold up unprepare), then under the data-dir lock re-read the
//! checkpoint and, per claim: answer from the checkpoint if already prepared
//! (idempotent; how shared claims work), else resolve the claim into our
//! devices ([`crate::prepare::resolve`]: UID, allocation, opaque config, the
//! double-allocation guard), call the driver, write the CDI spec, record the
//! claim.
//! Unprepare works from the checkpoint alone. Failures are per claim; only
//! lock or checkpoint I/O failures fail the whole call. A checkpoint of a
//! newer version is never written: its claims are unprepared and new
//! claims refused ([`newer`]).
//!
//! Concurrent calls (a burst of pods on one node) are served by group
//! commit ([`group`]): the calls queued while one holds the lock are served
//! together in one pass, with one checkpoint read and one commit of every
//! CDI spec and the checkpoint, and none is answered before that commit.
//!
//! Device reuse: when a pod is force-deleted, its claim can be released and
//! its device allocated to the next claim on the node before kubelet has
//! unprepared the old claim. Refusing at once made kubelet back off for
//! about 84 s. Instead a claim whose device another claim (not one of this
//! call) still holds waits up to `release_wait` for that unprepare: the lock
//! is released while it waits, every unprepare of this process wakes it, and
//! it re-checks every [`RELEASE_POLL`] for an unprepare by another process
//! (seamless upgrade). Each check is made under the lock on a freshly read
//! checkpoint, so a device is never prepared for two claims at once; if the
//! holder is still there at the bound, the refusal is the one it always was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Notify, oneshot};

use crate::prepare::atomic::Staged;
use crate::prepare::attributes_file::AttributeFiles;
use crate::prepare::cdi::CdiWriter;
use crate::prepare::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, PreparedClaim, Read,
};
use crate::prepare::claims::{ClaimSource, ClaimSourceError};
use crate::prepare::driver::{AllocatedDevice, ClaimRef, DeviceEdits, Driver, PreparedDevice};
use crate::prepare::lock::{DataDirGuard, DataDirLock, LockError};
use crate::prepare::metrics::PluginMetrics;
use crate::prepare::resolve::{ResolveError, resolve_claim_with};
use crate::prepare::status::{ClaimStatus, Prepared};

mod attribute_files;
pub(crate) mod group;
mod newer;
mod recover;
mod start;
mod unprepare;
use group::{CallInput, Commit, Done, Pass, PassTimings, PrepareWork, Work};

/// How often a prepare that waits for a device's release re-reads the
/// checkpoint, for an unprepare made by another plugin instance (those of
/// this process wake it at once).
pub(crate) const RELEASE_POLL: Duration = Duration::from_millis(100);

/// Why a whole call failed (kubelet then ignores the response and retries).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PipelineError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The group commit that served this call failed (the leader's error).
    #[error("{0}")]
    Group(String),
}

/// A claim's devices of this driver, resolved from its allocation.
type Resolved<D> = Vec<crate::prepare::resolve::ResolvedDevice<<D as Driver>::Config>>;

/// Per-claim answer of prepare: the devices, or an actionable message.
pub(crate) type PrepareOutcome = Result<Vec<PreparedDevice>, String>;

/// Why one claim was not prepared in one pass.
enum Refusal {
    /// Another claim (`holder_uid`) holds one of its devices; worth waiting
    /// for unless that claim is part of the same call.
    Held { holder_uid: String, message: String },
    /// Anything else: final.
    Final(String),
}

pub(crate) struct ClaimPipeline<D: Driver> {
    driver_name: String,
    /// This node's pool; `None`: any (see `PluginOptions::pool`).
    pool: Option<String>,
    driver: Arc<D>,
    claims: Arc<dyn ClaimSource>,
    cdi: CdiWriter,
    /// Device attributes files, mounted through the claim's CDI spec.
    attribute_files: AttributeFiles,
    checkpoint: CheckpointStore,
    lock: DataDirLock,
    metrics: PluginMetrics,
    /// How long a prepare waits for a held device's release before refusing.
    release_wait: Duration,
    /// Woken after every unprepare that removed claims from the checkpoint.
    released: Notify,
    /// Work of concurrent calls waiting for the next group commit.
    group: group::Queue,
    status: ClaimStatus<D::Config>,
    /// UIDs of claims rebuilt from disk after a damaged checkpoint, not yet
    /// confirmed against the API server ([`recover`]).
    unconfirmed: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
}

/// Where a [`ClaimPipeline`] keeps its files, and how it waits.
pub(crate) struct PipelineConfig<'a> {
    pub(crate) driver_name: &'a str,
    /// See `PluginOptions::pool`.
    pub(crate) pool: Option<String>,
    /// The plugin data directory: the checkpoint and the node lock.
    pub(crate) data_dir: &'a Path,
    pub(crate) cdi_root: &'a Path,
    pub(crate) cdi_class: &'a str,
    pub(crate) boot_id_path: PathBuf,
    /// The device attributes files' settings (any driver's).
    pub(crate) device_attributes: &'a AttributeFiles,
    pub(crate) release_wait: Duration,
}

impl<D: Driver> ClaimPipeline<D> {
    pub(crate) fn new(
        driver: Arc<D>,
        claims: Arc<dyn ClaimSource>,
        config: PipelineConfig<'_>,
        metrics: PluginMetrics,
        status: ClaimStatus<D::Config>,
    ) -> Self {
        let name = config.driver_name;
        Self {
            driver_name: name.to_owned(),
            pool: config.pool,
            driver,
            claims,
            cdi: CdiWriter::new(config.cdi_root, name, config.cdi_class),
            attribute_files: config.device_attributes.for_driver(name, config.cdi_root),
            checkpoint: CheckpointStore::new(
                config.data_dir,
                config.boot_id_path,
                config.cdi_root.to_path_buf(),
                metrics.clone(),
            ),
            lock: DataDirLock::new(config.data_dir),
            metrics,
            release_wait: config.release_wait,
            released: Notify::new(),
            group: group::Queue::default(),
            status,
            unconfirmed: tokio::sync::watch::channel(Default::default()).0,
        }
    }

    /// What the status task needs of a claim answered with devices: its
    /// devices of ours as this pass resolved them (`resolved`), or for a
    /// claim answered from the checkpoint as its allocation has them now.
    /// `None` without the claim object (nothing to write status to).
    fn for_status(
        &self,
        claim: &ClaimRef,
        object: Option<&ResourceClaim>,
        resolved: Option<Resolved<D>>,
    ) -> Option<Prepared<D::Config>> {
        let object = object?;
        let devices = match resolved {
            Some(resolved) => resolved,
            None => {
                let own = |device: &str| vec![device.to_owned()];
                let prepared = BTreeMap::new();
                let pool = self.pool.as_deref();
                let name = &self.driver_name;
                resolve_claim_with(name, pool, claim, Some(object), &prepared, &own).ok()?
            }
        };
        Some(Prepared {
            claim: claim.clone(),
            generation: object.metadata.generation,
            devices,
        })
    }

    /// The refusal while the checkpoint is a newer version's (the readiness).
    pub(crate) fn checkpoint_newer(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.checkpoint.newer()
    }

    #[cfg(test)]
    pub(crate) fn checkpoint(&self) -> &CheckpointStore {
        &self.checkpoint
    }

    #[cfg(test)]
    pub(crate) fn attribute_files(&self) -> &AttributeFiles {
        &self.attribute_files
    }
}

impl<D: Driver> ClaimPipeline<D> {
    pub(crate) async fn prepare(
        &self,
        requested: Vec<ClaimRef>,
    ) -> Result<BTreeMap<String, PrepareOutcome>, PipelineError> {
        let call_started = Instant::now();
        let fetched: Vec<Result<Option<ResourceClaim>, ClaimSourceError>> = join_all(
            requested
                .iter()
                .map(|c| self.claims.get(&c.namespace, &c.name)),
        )
        .await;

        let called = Instant::now();
        let get_seconds = called.duration_since(call_started).as_secs_f64();
        let call = Arc::new(CallInput { requested, fetched });
        let requested = &call.requested;
        let mut timings = PassTimings::default();
        let deadline = tokio::time::Instant::now() + self.release_wait;
        let mut answers = BTreeMap::new();
        // Indices into `requested` of the claims still waiting for a device.
        let mut pending: Vec<usize> = (0..requested.len()).collect();
        let mut waited = false;
        loop {
            // Registered before the pass takes the lock: an unprepare that
            // runs after the pass (it needs the lock) is never missed.
            let released = self.released.notified();
            let last_pass = tokio::time::Instant::now() >= deadline;
            let work = Work::Prepare(PrepareWork {
                call: call.clone(),
                pending: pending.clone(),
                last_pass,
                waited_since: waited.then_some(called),
            });
            let Done::Prepare(waiting) = self.submit(work).await? else {
                unreachable!("a prepare job is answered with a prepare pass")
            };
            timings.add(&waiting.timings);
            for (index, outcome) in waiting.answered {
                answers.insert(requested[index].uid.clone(), outcome);
            }
            if waiting.held.is_empty() {
                break;
            }
            if !waited {
                for (index, holder_uid) in &waiting.held {
                    let claim = &requested[*index];
                    tracing::info!(
                        claim_uid = claim.uid,
                        claim = %format!("{}/{}", claim.namespace, claim.name),
                        holder_uid,
                        wait_seconds = self.release_wait.as_secs_f64(),
                        "a device of this claim is still prepared for another claim; waiting for its unprepare"
                    );
                }
            }
            waited = true;
            pending = waiting.held.into_iter().map(|(index, _)| index).collect();
            let poll = tokio::time::Instant::now() + RELEASE_POLL;
            tokio::select! {
                () = released => {}
                () = tokio::time::sleep_until(poll.min(deadline)) => {}
            }
        }
        // Where the call's time went (kubelet times the whole call, the line above each claim).
        tracing::debug!(
            claims = requested.len(),
            get_seconds,
            lock_seconds = timings.lock,
            load_seconds = timings.load,
            claims_seconds = timings.claims,
            save_seconds = timings.save,
            total_seconds = call_started.elapsed().as_secs_f64(),
            "prepare call timings"
        );
        Ok(answers)
    }

    /// Serves `work` in the next group commit (see [`group`]): queues it,
    /// takes the lock, and either finds it answered by the group that took
    /// it or leads a group itself.
    async fn submit(&self, work: Work) -> Result<Done, PipelineError> {
        loop {
            let (id, mut answer) = self.group.push(work.clone());
            let guard = match self.lock.lock().await {
                Ok(guard) => guard,
                Err(e) if self.group.withdraw(id) => return Err(e.into()),
                // A leader took the job while this call waited for the lock.
                Err(_) => match answer.await {
                    Ok(done) => return done.map_err(PipelineError::Group),
                    Err(_) => continue,
                },
            };
            match answer.try_recv() {
                Ok(done) => return done.map_err(PipelineError::Group),
                // Its leader was dropped half-way: queue the work again.
                Err(oneshot::error::TryRecvError::Closed) => continue,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let jobs = self.group.take_all();
            let result = self.run_group(&jobs, &guard).await;
            let mut mine = None;
            match result {
                Ok(done) => {
                    for (job, done) in jobs.into_iter().zip(done) {
                        if job.id == id {
                            mine = Some(Ok(done));
                        } else {
                            let _ = job.reply.send(Ok(done));
                        }
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for job in jobs.into_iter().filter(|j| j.id != id) {
                        let _ = job.reply.send(Err(message.clone()));
                    }
                    mine = Some(Err(e));
                }
            }
            drop(guard);
            return mine.expect("the leader's own job is in its group");
        }
    }

    /// One group under the lock: every job against one checkpoint read,
    /// then one commit of every CDI spec and the checkpoint (a newer
    /// version's checkpoint: [`newer`]).
    async fn run_group(
        &self,
        jobs: &[group::Job],
        held: &DataDirGuard,
    ) -> Result<Vec<Done>, PipelineError> {
        let started = Instant::now();
        crate::prepare::crash::group_size(jobs.len());
        let checkpoint = match self.read_checkpoint(held)? {
            Read::Current(checkpoint) | Read::Damaged(checkpoint) => checkpoint,
            Read::Newer(newer) => return Ok(self.serve_newer(jobs, newer, held).await),
        };
        let load = started.elapsed().as_secs_f64();
        let mut commit = Commit::new(checkpoint);
        let mut done = Vec::with_capacity(jobs.len());
        for job in jobs {
            done.push(match &job.work {
                Work::Prepare(work) => {
                    let claims_started = Instant::now();
                    let mut pass = self.prepare_claims(work, &mut commit).await;
                    pass.timings.lock = started.duration_since(job.queued).as_secs_f64();
                    pass.timings.load = load;
                    pass.timings.claims = claims_started.elapsed().as_secs_f64();
                    Done::Prepare(pass)
                }
                Work::Unprepare { requested } => {
                    Done::Unprepare(self.unprepare_claims(requested, &mut commit).await)
                }
            });
        }
        crate::prepare::crash::point("group:served");
        let saving = Instant::now();
        let released = commit.released;
        if commit.changed || commit.released {
            self.checkpoint
                .save_with(&commit.checkpoint, commit.staged)?;
        }
        crate::prepare::crash::point("group:committed");
        self.status.prepared(std::mem::take(&mut commit.status));
        let save = saving.elapsed().as_secs_f64();
        for d in &mut done {
            if let Done::Prepare(pass) = d {
                pass.timings.save = save;
            }
        }
        self.metrics.commit_group(jobs.len());
        if jobs.len() > 1 {
            tracing::debug!(
                calls = jobs.len(),
                seconds = started.elapsed().as_secs_f64(),
                "group commit"
            );
        }
        if released {
            self.released.notify_waiters();
        }
        Ok(done)
    }

    /// One prepare pass ([`PrepareWork`]) against the group's commit:
    /// answers, and the claims held by another claim that are worth
    /// another pass (none on the last pass).
    async fn prepare_claims(&self, work: &PrepareWork, commit: &mut Commit<D::Config>) -> Pass {
        let PrepareWork {
            call,
            pending,
            last_pass,
            waited_since,
        } = work;
        let (last_pass, waited_since) = (*last_pass, *waited_since);
        let (requested, fetched) = (&call.requested, &call.fetched);
        let mut pass = Pass::default();
        for &index in pending {
            let claim = &requested[index];
            let started = waited_since.unwrap_or_else(Instant::now);
            // Whether the claim is refused because the device stayed held.
            let mut still_held = false;
            let object = fetched[index].as_ref().ok().and_then(Option::as_ref);
            let outcome = match commit.checkpoint.claims.get(&claim.uid) {
                Some(done) if spec_in_place(done) => {
                    let devices = done.devices.clone();
                    commit.status.extend(self.for_status(claim, object, None));
                    Ok(devices)
                }
                _ => match self
                    .prepare_one(claim, &fetched[index], &commit.checkpoint)
                    .await
                {
                    Ok((prepared, staged, resolved)) => {
                        let devices = prepared.devices.clone();
                        commit.checkpoint.claims.insert(claim.uid.clone(), prepared);
                        commit.staged.extend(staged);
                        commit.changed = true;
                        commit
                            .status
                            .extend(self.for_status(claim, object, Some(resolved)));
                        Ok(devices)
                    }
                    // A claim of this same call will not be unprepared
                    // while we wait: refuse at once.
                    Err(Refusal::Held { holder_uid, .. })
                        if !last_pass && !requested.iter().any(|c| c.uid == holder_uid) =>
                    {
                        pass.held.push((index, holder_uid));
                        continue;
                    }
                    Err(Refusal::Held { message, .. }) => {
                        still_held = true;
                        Err(message)
                    }
                    Err(Refusal::Final(message)) => Err(message),
                },
            };
            if waited_since.is_some() {
                self.metrics.release_wait_done(!still_held);
            }
            let seconds = started.elapsed().as_secs_f64();
            self.metrics.claim_done("prepare", outcome.is_ok(), seconds);
            match &outcome {
                Ok(devices) => tracing::info!(
                    claim_uid = claim.uid,
                    claim = %format!("{}/{}", claim.namespace, claim.name),
                    devices = devices.len(),
                    seconds,
                    waited = waited_since.is_some(),
                    result = "success",
                    "prepare"
                ),
                Err(error) => tracing::warn!(
                    claim_uid = claim.uid,
                    claim = %format!("{}/{}", claim.namespace, claim.name),
                    error,
                    seconds,
                    waited = waited_since.is_some(),
                    result = "error",
                    "prepare"
                ),
            }
            pass.answered.push((index, outcome));
        }
        pass
    }

    async fn prepare_one(
        &self,
        claim: &ClaimRef,
        fetched: &Result<Option<ResourceClaim>, ClaimSourceError>,
        checkpoint: &Checkpoint,
    ) -> Result<(PreparedClaim, Vec<Staged>, Resolved<D>), Refusal> {
        let who = format!("ResourceClaim {}/{}", claim.namespace, claim.name);
        let object = fetched.as_ref().map_err(|e| {
            Refusal::Final(format!(
                "{e}; the API server must be reachable to prepare a claim"
            ))
        })?;
        let occupies = |device: &str| self.driver.occupies(device);
        let resolved = resolve_claim_with::<D::Config>(
            &self.driver_name,
            self.pool.as_deref(),
            claim,
            object.as_ref(),
            &checkpoint.claims,
            &occupies,
        )
        .map_err(|e| match e {
            ResolveError::DeviceHeld { ref holder_uid, .. } => Refusal::Held {
                holder_uid: holder_uid.clone(),
                message: e.to_string(),
            },
            other => Refusal::Final(other.to_string()),
        })?;
        let allocated: Vec<AllocatedDevice<D::Config>> =
            resolved.iter().map(|d| d.allocated.clone()).collect();

        let edits = self
            .driver
            .prepare(claim, &allocated)
            .await
            .map_err(|e| Refusal::Final(format!("{who}: preparing devices failed: {e}")))?;
        check_edits(&allocated, &edits)
            .map_err(|e| Refusal::Final(format!("{who}: driver bug: {e}")))?;

        // Spec devices in allocation order, whatever order the driver used.
        let ordered: Vec<DeviceEdits> = allocated
            .iter()
            .filter_map(|a| edits.iter().find(|e| e.device == a.device).cloned())
            .collect();
        let mut devices: Vec<PreparedDevice> = resolved
            .iter()
            .map(|d| PreparedDevice {
                request_names: d.request_names.clone(),
                pool: d.allocated.pool.clone(),
                device: d.allocated.device.clone(),
                admin_access: d.allocated.admin_access,
                cdi_device_ids: Vec::new(),
                share_ids: d.share_ids.clone(),
            })
            .collect();
        let (mounts, mut staged): (Vec<_>, Vec<_>) = self
            .attribute_files
            .stage(claim, object.as_ref(), &devices)
            .map_err(|e| Refusal::Final(format!("{who}: {e}")))?
            .into_iter()
            .unzip();
        let mounted = mounts.iter().map(|m| m.request.as_str());
        self.cdi.set_device_ids(&claim.uid, &mut devices, mounted);
        let spec_path = self.cdi.spec_path(&claim.uid);
        if !ordered.is_empty() {
            let (_, spec) = self
                .cdi
                .stage_with(&claim.uid, &ordered, &mounts)
                .map_err(|e| Refusal::Final(format!("{who}: {e}")))?;
            staged.push(spec);
        }
        let prepared = PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices,
            cdi_spec_path: spec_path,
        };
        Ok((prepared, staged, resolved))
    }
}

/// Whether a claim the checkpoint has is really prepared: its CDI spec is
/// there (a claim without devices of ours has none). The spec is renamed
/// into place before the checkpoint, so only a hand on the node (or a
/// checkpoint of an earlier boot whose boot id could not be read) leaves a
/// recorded claim without one; the claim is then prepared again rather than
/// answered with CDI ids the runtime cannot find.
fn spec_in_place(prepared: &PreparedClaim) -> bool {
    prepared.devices.is_empty() || prepared.cdi_spec_path.exists()
}

fn check_edits<C>(allocated: &[AllocatedDevice<C>], edits: &[DeviceEdits]) -> Result<(), String> {
    for e in edits {
        if !allocated.iter().any(|a| a.device == e.device) {
            return Err(format!(
                "edits for device {:?} which was not allocated",
                e.device
            ));
        }
        if e.edits.is_empty() {
            return Err(format!(
                "no container edits for device {:?} (CDI needs at least one)",
                e.device
            ));
        }
    }
    for a in allocated {
        if !edits.iter().any(|e| e.device == a.device) {
            return Err(format!("no container edits for device {:?}", a.device));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
