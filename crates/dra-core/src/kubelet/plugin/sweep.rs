//! What the plugin clears on the node behind a killed or stopped run: the
//! temp files a writer killed between staging and committing left, and the
//! device attributes files of claims unprepared while no driver ran.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::prepare::driver::Driver;
use crate::prepare::state::ClaimPipeline;

/// How often [`sweep_abandoned`] looks for abandoned temp files: as often as
/// they can become removable ([`crate::prepare::atomic::ABANDONED_AFTER`]).
/// Only a killed writer leaves them, so after the sweeps that follow a
/// start there is nothing to find; sweeping every 10 s cost an idle driver
/// six wake-ups, a blocking thread and two directory listings a minute.
const SWEEP_EVERY: std::time::Duration = crate::prepare::atomic::ABANDONED_AFTER;

/// First the attributes files of claims no longer prepared (once, under the
/// node lock); then until `shutdown`, every [`SWEEP_EVERY`], the temp files
/// of this driver's CDI specs, attributes files and checkpoint that a
/// killed writer left behind ([`crate::prepare::atomic::ABANDONED_AFTER`]
/// old). Small directory listings, off the reactor.
pub(super) async fn sweep_abandoned<D: Driver>(
    pipeline: Arc<ClaimPipeline<D>>,
    shutdown: CancellationToken,
) {
    pipeline.sweep_attribute_files().await;
    loop {
        let (cdi, checkpoint, files) = (
            pipeline.cdi.clone(),
            pipeline.checkpoint.clone(),
            pipeline.attribute_files.clone(),
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
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}
