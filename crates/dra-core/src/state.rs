//! The prepare/unprepare pipeline behind both DRA service versions.
//!
//! Prepare: GET every claim (before taking the lock, so a slow API server
//! does not hold up unprepare), then under the data-dir lock re-read the
//! checkpoint and, per claim: answer from the checkpoint if already prepared
//! (idempotent; how shared claims work), else resolve the claim into our
//! devices ([`crate::resolve`]: UID, allocation, opaque config, the
//! double-allocation guard), call the driver, write the CDI spec, record the
//! claim.
//! Unprepare works from the checkpoint alone. Failures are per claim; only
//! lock or checkpoint I/O failures fail the whole call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cdi::CdiWriter;
use crate::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, PreparedClaim};
use crate::claims::{ClaimSource, ClaimSourceError};
use crate::driver::{AllocatedDevice, ClaimRef, DeviceEdits, Driver, PreparedDevice};
use crate::lock::{DataDirLock, LockError};
use crate::metrics::PluginMetrics;
use crate::resolve::resolve_claim;

/// Why a whole call failed (kubelet then ignores the response and retries).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PipelineError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// Per-claim answer of prepare: the devices, or an actionable message.
pub(crate) type PrepareOutcome = Result<Vec<PreparedDevice>, String>;

pub(crate) struct ClaimPipeline<D: Driver> {
    pub(crate) driver_name: String,
    /// This node's pool; `None`: any (see `PluginOptions::pool`).
    pub(crate) pool: Option<String>,
    pub(crate) driver: Arc<D>,
    pub(crate) claims: Arc<dyn ClaimSource>,
    pub(crate) cdi: CdiWriter,
    pub(crate) checkpoint: CheckpointStore,
    pub(crate) lock: DataDirLock,
    pub(crate) metrics: PluginMetrics,
}

impl<D: Driver> ClaimPipeline<D> {
    pub(crate) async fn prepare(
        &self,
        requested: Vec<ClaimRef>,
    ) -> Result<BTreeMap<String, PrepareOutcome>, PipelineError> {
        let fetched: Vec<Result<Option<ResourceClaim>, ClaimSourceError>> = join_all(
            requested
                .iter()
                .map(|c| self.claims.get(&c.namespace, &c.name)),
        )
        .await;

        let _guard = self.lock.lock().await?;
        let mut checkpoint = self.checkpoint.load()?;
        let mut changed = false;
        let mut answers = BTreeMap::new();
        for (claim, fetched) in requested.iter().zip(fetched) {
            let started = Instant::now();
            let outcome = match checkpoint.claims.get(&claim.uid) {
                Some(done) => Ok(done.devices.clone()),
                None => {
                    let result = self.prepare_one(claim, fetched, &checkpoint).await;
                    result.map(|prepared| {
                        let devices = prepared.devices.clone();
                        checkpoint.claims.insert(claim.uid.clone(), prepared);
                        changed = true;
                        devices
                    })
                }
            };
            let seconds = started.elapsed().as_secs_f64();
            self.metrics.claim_done("prepare", outcome.is_ok(), seconds);
            match &outcome {
                Ok(devices) => tracing::info!(
                    claim_uid = claim.uid,
                    claim = %format!("{}/{}", claim.namespace, claim.name),
                    devices = devices.len(),
                    seconds,
                    result = "success",
                    "prepare"
                ),
                Err(error) => tracing::warn!(
                    claim_uid = claim.uid,
                    claim = %format!("{}/{}", claim.namespace, claim.name),
                    error,
                    seconds,
                    result = "error",
                    "prepare"
                ),
            }
            answers.insert(claim.uid.clone(), outcome);
        }
        if changed {
            self.checkpoint.save(&checkpoint)?;
        }
        Ok(answers)
    }

    async fn prepare_one(
        &self,
        claim: &ClaimRef,
        fetched: Result<Option<ResourceClaim>, ClaimSourceError>,
        checkpoint: &Checkpoint,
    ) -> Result<PreparedClaim, String> {
        let who = format!("ResourceClaim {}/{}", claim.namespace, claim.name);
        let object = fetched
            .map_err(|e| format!("{e}; the API server must be reachable to prepare a claim"))?;
        let resolved = resolve_claim::<D::Config>(
            &self.driver_name,
            self.pool.as_deref(),
            claim,
            object.as_ref(),
            &checkpoint.claims,
        )
        .map_err(|e| e.to_string())?;
        let (allocated, request_names): (Vec<_>, Vec<_>) = resolved
            .into_iter()
            .map(|d| (d.allocated, d.request_names))
            .unzip();

        let edits = self
            .driver
            .prepare(claim, &allocated)
            .await
            .map_err(|e| format!("{who}: preparing devices failed: {e}"))?;
        check_edits(&allocated, &edits).map_err(|e| format!("{who}: driver bug: {e}"))?;

        // Spec devices in allocation order, whatever order the driver used.
        let ordered: Vec<DeviceEdits> = allocated
            .iter()
            .filter_map(|a| edits.iter().find(|e| e.device == a.device).cloned())
            .collect();
        let spec_path = if ordered.is_empty() {
            self.cdi.spec_path(&claim.uid)
        } else {
            self.cdi
                .write(&claim.uid, &ordered)
                .map_err(|e| format!("{who}: {e}"))?
        };

        let devices = allocated
            .iter()
            .zip(request_names)
            .map(|(a, request_names)| PreparedDevice {
                request_names,
                pool: a.pool.clone(),
                device: a.device.clone(),
                admin_access: a.admin_access,
                cdi_device_ids: vec![self.cdi.device_id(&claim.uid, &a.device)],
            })
            .collect();
        Ok(PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices,
            cdi_spec_path: spec_path,
        })
    }

    pub(crate) async fn unprepare(
        &self,
        requested: Vec<ClaimRef>,
    ) -> Result<BTreeMap<String, Result<(), String>>, PipelineError> {
        let _guard = self.lock.lock().await?;
        let mut checkpoint = self.checkpoint.load()?;
        let mut changed = false;
        let mut answers = BTreeMap::new();
        for claim in &requested {
            let started = Instant::now();
            let outcome = match checkpoint.claims.get(&claim.uid) {
                // Unknown: never prepared here, or already unprepared.
                None => Ok(()),
                Some(prepared) => {
                    let result = async {
                        self.driver
                            .unprepare(claim, &prepared.devices)
                            .await
                            .map_err(|e| format!("unpreparing claim {claim}: {e}"))?;
                        self.cdi
                            .remove(&prepared.cdi_spec_path)
                            .map_err(|e| format!("unpreparing claim {claim}: {e}"))
                    }
                    .await;
                    if result.is_ok() {
                        checkpoint.claims.remove(&claim.uid);
                        changed = true;
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
        if changed {
            self.checkpoint.save(&checkpoint)?;
        }
        Ok(answers)
    }
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
