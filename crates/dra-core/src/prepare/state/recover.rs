//! Recovery, not amnesia: when the checkpoint cannot be parsed (truncated,
//! overwritten), what was prepared is rebuilt from what is on disk before
//! anything else is answered, and then confirmed against the API server.
//!
//! Kubelet never prepares a running pod's claim again, so a claim forgotten
//! here stays broken until its pod dies: its files would be swept (the next
//! container start fails on the missing bind-mount source) and the
//! double-allocation guard would hand its devices to another claim.
//!
//! - **From disk** (under the node lock, where the damaged file was moved
//!   aside): every CDI spec of ours is a prepared claim, named for its UID,
//!   listing its devices (`<uid>-<device>`) and the requests whose
//!   attributes file it mounts. The attributes files add the claim's
//!   namespace and name, each device's pool and requests. A device whose
//!   pool no file records is taken to be in this node's pool; a recovered
//!   device counts as held exclusively (no admin access, no shares) until
//!   confirmed, so the guard errs towards refusing.
//! - **Confirmed** (outside the lock, in the background: at once, and while
//!   the API server does not answer, again 2 s later doubling to 60 s):
//!   each recovered claim with a known name is read from the API server. Still there with the same UID and allocated to this driver:
//!   its devices are completed from the allocation (pool, requests, admin
//!   access, shares). Gone (not found, another UID, no allocation): it is
//!   unprepared as kubelet would (driver, CDI spec, attributes files). No
//!   answer: it stays as recovered (it may be running), asked about again
//!   later, and kubelet's own unprepare removes it when its pod goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ClaimPipeline;
use super::group::{Done, Work};
use crate::prepare::attributes_file::RecordedRequest;
use crate::prepare::cdi::SpecOnDisk;
use crate::prepare::checkpoint::{CheckpointError, PreparedClaim, Read};
use crate::prepare::driver::{ClaimRef, Driver, PreparedDevice};
use crate::prepare::lock::DataDirGuard;
use crate::prepare::resolve::resolve_claim_with;

impl<D: Driver> ClaimPipeline<D> {
    /// The checkpoint under the lock, as [`CheckpointStore::read`] has it,
    /// except that a damaged one comes back rebuilt from disk (and saved).
    ///
    /// [`CheckpointStore::read`]: crate::prepare::checkpoint::CheckpointStore::read
    pub(super) fn read_checkpoint(&self, held: &DataDirGuard) -> Result<Read, CheckpointError> {
        let mut checkpoint = match self.checkpoint.read(held)? {
            Read::Damaged(checkpoint) => checkpoint,
            other => return Ok(other),
        };
        checkpoint.claims = self.recover_from_disk();
        let uids: Vec<String> = checkpoint.claims.keys().cloned().collect();
        tracing::warn!(
            claims = ?uids,
            "rebuilt the prepared claims from the CDI specs and attributes files on disk"
        );
        if !checkpoint.claims.is_empty() {
            self.checkpoint.save(&checkpoint)?;
        }
        self.unconfirmed.send_modify(|u| u.extend(uids));
        Ok(Read::Damaged(checkpoint))
    }

    /// Every claim whose CDI spec of ours is on disk, as far as the spec and
    /// the claim's attributes files tell.
    fn recover_from_disk(&self) -> BTreeMap<String, PreparedClaim> {
        let specs = self.cdi.specs_on_disk().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot list the CDI specs to recover the prepared claims");
            Vec::new()
        });
        let mut claims = BTreeMap::new();
        for spec in specs {
            match spec {
                Ok(spec) => {
                    claims.insert(spec.claim_uid.clone(), self.rebuild(spec));
                }
                Err(error) => {
                    tracing::warn!(
                        error,
                        "a CDI spec of ours cannot be read back; left as it is"
                    )
                }
            }
        }
        claims
    }

    fn rebuild(&self, spec: SpecOnDisk) -> PreparedClaim {
        let uid = &spec.claim_uid;
        let recorded = self.attribute_files.recorded(uid);
        let holding = |device: &String| -> Vec<&RecordedRequest> {
            recorded
                .iter()
                .filter(|r| r.devices.iter().any(|(_, d)| d == device))
                .collect()
        };
        let mut devices: Vec<PreparedDevice> = spec
            .devices
            .iter()
            .map(|device| PreparedDevice {
                request_names: holding(device).iter().map(|r| r.request.clone()).collect(),
                pool: holding(device)
                    .iter()
                    .flat_map(|r| &r.devices)
                    .find(|(_, d)| d == device)
                    .map(|(pool, _)| pool.clone())
                    .or_else(|| self.pool.clone())
                    .unwrap_or_default(),
                device: device.clone(),
                admin_access: false,
                cdi_device_ids: Vec::new(),
                share_ids: Vec::new(),
            })
            .collect();
        let mounted = spec.requests.iter().map(String::as_str);
        self.cdi.set_device_ids(uid, &mut devices, mounted);
        let (namespace, name) = recorded
            .first()
            .map(|r| (r.namespace.clone(), r.name.clone()))
            .unwrap_or_default();
        PreparedClaim {
            namespace,
            name,
            devices,
            cdi_spec_path: spec.path,
        }
    }

    /// Confirms the recovered claims until none is left unknown, and again
    /// after each later recovery, until `shutdown`: at once, then while the
    /// API server does not answer every [`CONFIRM_FIRST_RETRY`] doubling to
    /// [`CONFIRM_MAX_RETRY`].
    pub(super) async fn confirm_in_background(self: Arc<Self>, shutdown: CancellationToken) {
        let mut recovered = self.unconfirmed.subscribe();
        let mut delay = CONFIRM_FIRST_RETRY;
        loop {
            recovered.mark_unchanged();
            if !self.unconfirmed.borrow().is_empty() {
                self.confirm_recovered().await;
            }
            let wait = if self.unconfirmed.borrow().is_empty() {
                delay = CONFIRM_FIRST_RETRY;
                None
            } else {
                let wait = delay;
                delay = (delay * 2).min(CONFIRM_MAX_RETRY);
                Some(wait)
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = async { tokio::time::sleep(wait.unwrap_or_default()).await }, if wait.is_some() => {}
                changed = recovered.changed(), if wait.is_none() => if changed.is_err() { return },
            }
        }
    }

    /// One round of confirmation (module docs); the claims the API server
    /// could not tell about stay to be confirmed.
    pub(super) async fn confirm_recovered(&self) {
        let uids: Vec<String> = self.unconfirmed.borrow().iter().cloned().collect();
        if uids.is_empty() {
            return;
        }
        let checkpoint = match self.checkpoint.load() {
            Ok(checkpoint) => checkpoint,
            Err(e) => {
                tracing::warn!(error = %e, "cannot confirm the recovered claims");
                return;
            }
        };
        let (mut gone, mut completed, mut settled) = (Vec::new(), BTreeMap::new(), Vec::new());
        for uid in uids {
            let Some(claim) = checkpoint.claims.get(&uid) else {
                settled.push(uid); // unprepared meanwhile
                continue;
            };
            let r = ClaimRef {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: uid.clone(),
            };
            if r.name.is_empty() {
                tracing::warn!(
                    claim_uid = uid,
                    "recovered claim has no attributes file naming it; kept until kubelet unprepares it"
                );
                continue;
            }
            match self.confirm(&r, claim).await {
                Confirmed::Gone(why) => {
                    tracing::info!(claim_uid = uid, claim = %r, why, "recovered claim is gone; unpreparing it");
                    gone.push(r);
                    settled.push(uid);
                }
                Confirmed::Completed(devices) => {
                    tracing::info!(claim_uid = uid, claim = %r, "recovered claim confirmed by the API server");
                    completed.insert(uid.clone(), devices);
                    settled.push(uid);
                }
                Confirmed::Unknown(why) => {
                    tracing::info!(claim_uid = uid, claim = %r, why, "cannot confirm a recovered claim yet; kept as recovered, asking again later");
                }
            }
        }
        self.unconfirmed.send_if_modified(|u| {
            let before = u.len();
            u.retain(|uid| !settled.contains(uid));
            u.len() != before
        });
        if !completed.is_empty()
            && let Err(e) = self.complete(completed).await
        {
            tracing::warn!(error = %e, "cannot record the confirmed claims");
        }
        if !gone.is_empty() {
            let work = Work::Unprepare {
                requested: std::sync::Arc::new(gone),
            };
            if let Ok(Done::Unprepare(answers)) = self.submit(work).await {
                for (uid, answer) in answers.into_iter().filter(|(_, a)| a.is_err()) {
                    tracing::warn!(claim_uid = uid, error = ?answer, "cannot unprepare a recovered claim that is gone");
                }
            }
        }
    }

    async fn confirm(&self, r: &ClaimRef, recovered: &PreparedClaim) -> Confirmed {
        let object = match self.claims.get(&r.namespace, &r.name).await {
            Ok(Some(object)) => object,
            Ok(None) => return Confirmed::Gone("not found"),
            Err(e) => return Confirmed::Unknown(e.to_string()),
        };
        if object.metadata.uid.as_deref() != Some(r.uid.as_str()) {
            return Confirmed::Gone("recreated under another UID");
        }
        let allocated = object.status.as_ref().and_then(|s| s.allocation.as_ref());
        if allocated.is_none() {
            return Confirmed::Gone("no longer allocated");
        }
        let occupies = |device: &str| self.driver.occupies(device);
        let resolved = resolve_claim_with::<D::Config>(
            &self.driver_name,
            self.pool.as_deref(),
            r,
            Some(&object),
            &BTreeMap::new(),
            &occupies,
        );
        let resolved = match resolved {
            Ok(resolved) => resolved,
            Err(e) => return Confirmed::Unknown(e.to_string()),
        };
        let mut devices = recovered.devices.clone();
        for d in &mut devices {
            if let Some(a) = resolved.iter().find(|a| a.allocated.device == d.device) {
                d.pool = a.allocated.pool.clone();
                d.admin_access = a.allocated.admin_access;
                d.request_names = a.request_names.clone();
                d.share_ids = a.share_ids.clone();
            }
        }
        Confirmed::Completed(devices)
    }

    /// Writes the confirmed claims' devices into the checkpoint (those
    /// still in it).
    async fn complete(
        &self,
        completed: BTreeMap<String, Vec<PreparedDevice>>,
    ) -> Result<(), String> {
        let held = self.lock.lock().await.map_err(|e| e.to_string())?;
        let mut checkpoint = match self.checkpoint.read(&held).map_err(|e| e.to_string())? {
            Read::Current(checkpoint) => checkpoint,
            _ => return Err("the checkpoint changed under the recovery".into()),
        };
        let mut changed = false;
        for (uid, devices) in completed {
            if let Some(claim) = checkpoint.claims.get_mut(&uid) {
                claim.devices = devices;
                changed = true;
            }
        }
        if changed {
            self.checkpoint
                .save(&checkpoint)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The first wait before asking the API server again about recovered
/// claims it did not answer for (it may not be reachable yet at start).
pub(super) const CONFIRM_FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest such wait.
pub(super) const CONFIRM_MAX_RETRY: Duration = Duration::from_secs(60);

enum Confirmed {
    /// The claim no longer exists as allocated to us: unprepare it.
    Gone(&'static str),
    /// Still allocated: the devices completed from the allocation.
    Completed(Vec<PreparedDevice>),
    /// No answer, or one that cannot be used: keep it as recovered.
    Unknown(String),
}
