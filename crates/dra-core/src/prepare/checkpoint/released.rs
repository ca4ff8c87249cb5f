//! Claims this build unprepared from a newer version's checkpoint, which it
//! may not rewrite: their UIDs go in `checkpoint.released.json` beside it,
//! and the next build that reads the checkpoint as its own (the newer
//! driver rolled forward, or this one once the file is this version's)
//! drops them from it, under the lock, and removes the list. Without it the
//! newer driver would still record claims kubelet will never unprepare
//! again, and their devices would stay held against other claims until a
//! reboot.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::prepare::atomic::{commit, stage};

/// The list's file name, beside `checkpoint.json`.
pub(super) const FILE: &str = "checkpoint.released.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Released {
    /// UIDs of claims unprepared while the checkpoint recorded them.
    claims: BTreeSet<String>,
}

/// The UIDs listed; none when there is no list. A list that does not read
/// is reported and taken as empty (what it held is lost; those claims'
/// devices stay held until a reboot, as without the list).
pub(super) fn read(path: &Path) -> std::io::Result<BTreeSet<String>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(serde_json::from_slice::<Released>(&bytes)
            .map(|r| r.claims)
            .unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "list of released claims does not read; ignoring it");
                BTreeSet::new()
            })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(e),
    }
}

/// Replaces the list with `claims`, atomically.
pub(super) fn write(path: &Path, claims: BTreeSet<String>) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(&Released { claims }).map_err(std::io::Error::other)?;
    commit(vec![stage(path, &bytes)?]).map_err(|(_, e)| e)
}
