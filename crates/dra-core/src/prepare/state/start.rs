//! What the pipeline does once at start and then in the background, before
//! and beside the calls kubelet makes: reads what an earlier run left
//! (under the node lock; a damaged checkpoint is recovered from disk and
//! the recovered claims confirmed, [`super::recover`]), removes the
//! attributes files of claims no longer prepared, and clears the temp files
//! a killed writer left.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::ClaimPipeline;
use crate::prepare::driver::Driver;

/// How often the background sweep looks for abandoned temp files: as often
/// as they can become removable ([`crate::prepare::atomic::ABANDONED_AFTER`]).
/// Only a killed writer leaves them, so after the sweeps that follow a
/// start there is nothing to find; sweeping every 10 s cost an idle driver
/// six wake-ups, a blocking thread and two directory listings a minute.
const SWEEP_EVERY: std::time::Duration = crate::prepare::atomic::ABANDONED_AFTER;

impl<D: Driver> ClaimPipeline<D> {
    /// Runs the start-up work, then sweeps until `shutdown`; spawned by the
    /// plugin once its pipeline exists.
    pub(crate) async fn run_in_background(self: Arc<Self>, shutdown: CancellationToken) {
        self.read_at_start().await;
        tokio::spawn(self.clone().confirm_in_background(shutdown.clone()));
        self.sweep_attribute_files().await;
        loop {
            self.sweep_abandoned().await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
            }
        }
    }

    /// The checkpoint an earlier run left, read under the node lock (a
    /// second instance may be serving from it): the prepared gauges and the
    /// readiness follow it, and a damaged file is recovered from disk now
    /// rather than at the first call. A failure shows again, and is
    /// handled, at the first call.
    async fn read_at_start(&self) {
        let read = async {
            let held = self.lock.lock().await.map_err(|e| e.to_string())?;
            let read = self.read_checkpoint(&held);
            read.map(drop).map_err(|e| e.to_string())
        };
        if let Err(error) = read.await {
            tracing::warn!(error, "cannot read the checkpoint at start");
        }
    }

    /// The temp files of this driver's CDI specs, attributes files and
    /// checkpoint that a killed writer left behind
    /// ([`crate::prepare::atomic::ABANDONED_AFTER`] old), removed: small
    /// directory listings, off the reactor.
    async fn sweep_abandoned(&self) {
        let (cdi, checkpoint, files) = (
            self.cdi.clone(),
            self.checkpoint.clone(),
            self.attribute_files.clone(),
        );
        let found = tokio::task::spawn_blocking(move || {
            [
                ("CDI spec", cdi.remove_abandoned()),
                ("checkpoint", checkpoint.remove_abandoned()),
                ("device attributes file", files.remove_abandoned()),
            ]
        })
        .await;
        for (what, found) in found.into_iter().flatten() {
            match found {
                Ok(files) if files.is_empty() => {}
                Ok(files) => tracing::info!(
                    files = ?files,
                    "removed {what} temp files that a killed writer left unfinished"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot clear abandoned {what} temp files"),
            }
        }
    }
}
