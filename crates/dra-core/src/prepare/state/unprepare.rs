//! Unprepare: works from the checkpoint alone (the API server need not
//! answer), in the same group commit as prepare ([`super::group`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::group::{Commit, Done, Work};
use super::{ClaimPipeline, PipelineError};
use crate::prepare::driver::{ClaimRef, Driver};

impl<D: Driver> ClaimPipeline<D> {
    pub(crate) async fn unprepare(
        &self,
        requested: Vec<ClaimRef>,
    ) -> Result<BTreeMap<String, Result<(), String>>, PipelineError> {
        let work = Work::Unprepare {
            requested: Arc::new(requested),
        };
        let Done::Unprepare(answers) = self.submit(work).await? else {
            unreachable!("an unprepare job is answered with unprepare's answers")
        };
        Ok(answers)
    }

    /// Unprepares `requested` against the group's commit (marked
    /// released when a claim left its checkpoint).
    pub(super) async fn unprepare_claims(
        &self,
        requested: &[ClaimRef],
        commit: &mut Commit<D::Config>,
    ) -> BTreeMap<String, Result<(), String>> {
        let mut answers = BTreeMap::new();
        for claim in requested {
            let started = Instant::now();
            let outcome = match commit.checkpoint.claims.get(&claim.uid) {
                // Unknown: never prepared here, already unprepared, or
                // prepared before a checkpoint was lost (found corrupt and
                // moved aside). In that last case a spec under this claim's
                // name may still be there: nothing else would ever remove it.
                None => self
                    .cdi
                    .remove(&self.cdi.spec_path(&claim.uid))
                    .map_err(|e| format!("unpreparing claim {claim}: {e}"))
                    .and_then(|()| self.remove_attribute_files(claim)),
                Some(prepared) => {
                    let result = async {
                        self.driver
                            .unprepare(claim, &prepared.devices)
                            .await
                            .map_err(|e| format!("unpreparing claim {claim}: {e}"))?;
                        self.cdi
                            .remove_claim_spec(&claim.uid, &prepared.cdi_spec_path)
                            .map_err(|e| format!("unpreparing claim {claim}: {e}"))?;
                        self.remove_attribute_files(claim)
                    }
                    .await;
                    if result.is_ok() {
                        commit.checkpoint.claims.remove(&claim.uid);
                        commit.released = true;
                    }
                    result
                }
            };
            let seconds = started.elapsed().as_secs_f64();
            self.metrics
                .claim_done("unprepare", outcome.is_ok(), seconds);
            match &outcome {
                Ok(()) => tracing::info!(
                    claim_uid = claim.uid,
                    seconds,
                    result = "success",
                    "unprepare"
                ),
                Err(error) => tracing::warn!(
                    claim_uid = claim.uid,
                    error,
                    seconds,
                    result = "error",
                    "unprepare"
                ),
            }
            answers.insert(claim.uid.clone(), outcome);
        }
        self.status.unprepared(requested, &answers);
        answers
    }
}
