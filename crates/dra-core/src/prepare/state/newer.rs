//! A group served against a checkpoint of a newer version (a rollback, or
//! the old pod of a surge upgrade beside the new one). The file is never
//! written (the newer build that wrote it still knows its claims), so this
//! build does nothing that would need a record in it:
//! - a claim it records whose devices this build reads is unprepared as
//!   usual (the driver, its CDI spec, its attributes files) and its UID
//!   recorded beside the file (`checkpoint.released.json`): the next build
//!   that reads the checkpoint as its own drops it, since kubelet, told it
//!   is unprepared, does not ask again. One it records in a form this build
//!   cannot read is refused, and kubelet retries until a driver that reads
//!   it runs;
//! - prepare answers a claim it records whose CDI spec is in place (the
//!   idempotent answer kubelet gets on a retry) and refuses every other,
//!   with the error that names both versions.

use std::collections::BTreeMap;
use std::time::Instant;

use super::group::{Commit, Done, Job, Pass, PrepareWork, Work};
use super::{ClaimPipeline, PrepareOutcome, spec_in_place};
use crate::prepare::checkpoint::{CHECKPOINT_VERSION, Checkpoint, NewerCheckpoint, PreparedClaim};
use crate::prepare::driver::{ClaimRef, Driver};
use crate::prepare::lock::DataDirGuard;

impl<D: Driver> ClaimPipeline<D> {
    /// Every job of the group against `newer`, which stays as it is.
    pub(super) async fn serve_newer(
        &self,
        jobs: &[Job],
        newer: NewerCheckpoint,
        held: &DataDirGuard,
    ) -> Vec<Done> {
        let mut done = Vec::with_capacity(jobs.len());
        for job in jobs {
            done.push(match &job.work {
                Work::Prepare(PrepareWork { call, pending, .. }) => {
                    let mut pass = Pass::default();
                    for &index in pending {
                        let outcome = self.prepare_recorded(&call.requested[index], &newer);
                        pass.answered.push((index, outcome));
                    }
                    Done::Prepare(pass)
                }
                Work::Unprepare { requested } => {
                    Done::Unprepare(self.unprepare_recorded(requested, &newer, held).await)
                }
            });
        }
        done
    }

    /// The claim as `newer` records it; a spec path that did not read is
    /// the one this writer gives the claim.
    fn recorded(
        &self,
        newer: &NewerCheckpoint,
        uid: &str,
    ) -> Option<Result<PreparedClaim, String>> {
        let claims = match &newer.claims {
            Ok(claims) => claims,
            Err(why) => return Some(Err(why.clone())),
        };
        let mut claim = claims.get(uid)?.clone();
        if let Ok(c) = &mut claim
            && c.cdi_spec_path.as_os_str().is_empty()
        {
            c.cdi_spec_path = self.cdi.spec_path(uid);
        }
        Some(claim)
    }

    fn prepare_recorded(&self, claim: &ClaimRef, newer: &NewerCheckpoint) -> PrepareOutcome {
        let outcome = match self.recorded(newer, &claim.uid) {
            Some(Ok(done)) if spec_in_place(&done) => Ok(done.devices),
            _ => Err(format!(
                "ResourceClaim {}/{}: not prepared: {}",
                claim.namespace, claim.name, newer.refusal
            )),
        };
        self.metrics.claim_done("prepare", outcome.is_ok(), 0.0);
        match &outcome {
            Ok(devices) => tracing::info!(
                claim_uid = claim.uid,
                devices = devices.len(),
                result = "success",
                "prepare: answered from a newer driver's checkpoint"
            ),
            Err(error) => tracing::warn!(claim_uid = claim.uid, error, result = "error", "prepare"),
        }
        outcome
    }

    /// Unprepares the claims of `requested` that `newer` records in a form
    /// this build reads (or does not record); refuses the others.
    async fn unprepare_recorded(
        &self,
        requested: &[ClaimRef],
        newer: &NewerCheckpoint,
        held: &DataDirGuard,
    ) -> BTreeMap<String, Result<(), String>> {
        // Only what this build reads of it; never saved.
        let mut readable = Commit::new(Checkpoint::default());
        let mut served = Vec::new();
        let mut refused = BTreeMap::new();
        for claim in requested {
            match self.recorded(newer, &claim.uid) {
                Some(Err(why)) => {
                    refused.insert(
                        claim.uid.clone(),
                        format!(
                            "unpreparing claim {claim}: the checkpoint of version {} (written by \
                             a newer driver) records it in a form this build (version \
                             {CHECKPOINT_VERSION}) cannot read ({why}); not unprepared until a \
                             driver that reads version {} runs",
                            newer.version, newer.version
                        ),
                    );
                    continue;
                }
                Some(Ok(prepared)) => {
                    readable
                        .checkpoint
                        .claims
                        .insert(claim.uid.clone(), prepared);
                }
                None => {}
            }
            served.push(claim.clone());
        }
        let started = Instant::now();
        let recorded: Vec<String> = readable.checkpoint.claims.keys().cloned().collect();
        let mut answers = self.unprepare_claims(&served, &mut readable).await;
        let unprepared: Vec<String> = recorded
            .into_iter()
            .filter(|uid| answers.get(uid).is_some_and(Result::is_ok))
            .collect();
        if !unprepared.is_empty()
            && let Err(e) = self.checkpoint.record_released(held, &unprepared)
        {
            // Unprepared, but not recorded as such: kubelet retries (the
            // driver's unprepare is idempotent) until it is.
            for uid in unprepared {
                answers.insert(
                    uid.clone(),
                    Err(format!(
                        "unpreparing claim {uid}: recording it as unprepared: {e}"
                    )),
                );
            }
        }
        for (uid, error) in refused {
            self.metrics
                .claim_done("unprepare", false, started.elapsed().as_secs_f64());
            tracing::warn!(claim_uid = uid, error, result = "error", "unprepare");
            answers.insert(uid, Err(error));
        }
        answers
    }
}
