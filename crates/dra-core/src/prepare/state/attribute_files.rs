//! The pipeline's side of the device attributes files
//! ([`crate::prepare::attributes_file`]): removing a claim's files at
//! unprepare, and sweeping the files of claims no longer prepared at start.
//! Here rather than beside the files' writer, so that the writer knows nothing
//! of the pipeline that calls it.

use super::ClaimPipeline;
use crate::prepare::driver::{ClaimRef, Driver};

impl<D: Driver> ClaimPipeline<D> {
    /// Unprepare's part: every file of `claim`, found by its UID.
    pub(crate) fn remove_attribute_files(&self, claim: &ClaimRef) -> Result<(), String> {
        self.attribute_files.remove_claim(&claim.uid).map_err(|e| {
            format!(
                "unpreparing claim {claim}: removing its device attributes files in {}: {e}",
                self.attribute_files.dir().display()
            )
        })
    }

    /// At start, under the node lock: removes the files of claims the
    /// checkpoint no longer holds (unprepared while no driver ran, or by a
    /// run killed half-way through an unprepare).
    pub(crate) async fn sweep_attribute_files(&self) {
        let swept = async {
            let _guard = self.lock.lock().await.map_err(|e| e.to_string())?;
            let checkpoint = self.checkpoint.load().map_err(|e| e.to_string())?;
            self.attribute_files
                .remove_stale(&checkpoint.claims)
                .map_err(|e| e.to_string())
        };
        match swept.await {
            Ok(files) if files.is_empty() => {}
            Ok(files) => tracing::info!(
                files = ?files,
                "removed the device attributes files of claims no longer prepared"
            ),
            Err(error) => tracing::warn!(
                error,
                dir = %self.attribute_files.dir().display(),
                "cannot sweep device attributes files"
            ),
        }
    }
}
