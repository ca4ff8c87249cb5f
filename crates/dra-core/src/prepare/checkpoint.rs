//! The plugin's record of prepared claims, the source of truth for unprepare.
//!
//! A versioned JSON file in the plugin data directory, replaced atomically
//! and re-read on every call (a second plugin instance may have changed it).
//! It holds per claim everything unprepare needs without the API server.
//! A different boot id means the node rebooted: nothing is prepared any more
//! (CDI specs under /var/run are gone, kubelet prepares again), so the old
//! entries are dropped. A file we cannot parse is moved aside, logged and
//! counted (a crash loop would take all devices down), and the pipeline
//! rebuilds what was prepared from the CDI specs and attributes files on
//! disk before it answers anything (`prepare::state`'s recovery).
//! Whatever changes the file (moving it aside, forgetting an earlier boot)
//! happens in [`CheckpointStore::read`], which takes the data-dir lock's
//! guard: a second instance (a surge pod) may be serving from the same file.
//!
//! Nothing is forgotten on a read error: a boot id that cannot be read
//! judges no reboot (the checkpoint stays as it is), and a checkpoint
//! written without one adopts the next one read.
//!
//! Versions ([`format`]): the version is read alone first. A checkpoint of a
//! newer version (a rollback, or the old pod of a surge upgrade) is refused
//! and kept byte for byte, never rewritten nor moved: the newer build that
//! wrote it still knows its claims. Until a build that reads it runs, the
//! claims it records that this build can read are unprepared (the file
//! still records them: their UIDs are listed beside it, [`released`]) and
//! no new claim is prepared. The version changes
//! only when an older build would misread the file (a field changes type
//! or meaning, or one it needs goes); a new field keeps it, and an older
//! build writes the fields it does not know back as it read them, so that
//! a rollback after an additive change keeps working and loses nothing.
//! `checkpoint/testdata/` holds a file of every version (and of the current
//! one with fields of a later build); the tests read them, and this build's
//! own file must stay byte for byte the committed one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::prepare::atomic::{Staged, commit, remove_if_exists, stage};
use crate::prepare::driver::PreparedDevice;
use crate::prepare::lock::DataDirGuard;
use crate::prepare::metrics::PluginMetrics;

mod format;
mod released;
use format::{AsRead, Parsed};

/// The on-disk format version this code writes and reads.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub const CHECKPOINT_VERSION: u32 = 1;

/// A claim as prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
    pub cdi_spec_path: PathBuf,
}

/// All prepared claims, keyed by claim UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct Checkpoint {
    pub version: u32,
    pub boot_id: String,
    pub claims: BTreeMap<String, PreparedClaim>,
}

#[derive(Debug, thiserror::Error)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub enum CheckpointError {
    #[error("reading checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing checkpoint {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("moving corrupt checkpoint {path} aside: {source}")]
    MoveAside {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding checkpoint: {0}")]
    Encode(#[from] serde_json::Error),
    #[error(
        "checkpoint {path} has version {version}, newer than this build's {CHECKPOINT_VERSION}: \
         written by a newer driver (rolled back, or the old pod of an upgrade); kept as it is, \
         and no new claim is prepared here until a driver that reads version {version} runs \
         (the claims it records are unprepared)"
    )]
    Newer { path: PathBuf, version: u32 },
    /// Only from `CheckpointStore::load`, which changes nothing; the
    /// pipeline's read under the data-dir lock moves such a file aside.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// What [`CheckpointStore::read`] found.
pub(crate) enum Read {
    /// This build's version (or none yet): the claims prepared here.
    Current(Checkpoint),
    /// A newer version's file, kept as it is.
    Newer(NewerCheckpoint),
    /// The file could not be parsed and was moved aside: an empty
    /// checkpoint of this boot, for the pipeline to rebuild what was
    /// prepared from what is on disk (`prepare::state`'s recovery).
    Damaged(Checkpoint),
}

/// A checkpoint of a newer version, as far as this build reads it.
#[derive(Debug)]
pub(crate) struct NewerCheckpoint {
    pub(crate) version: u32,
    /// Why no new claim is prepared: the [`CheckpointError::Newer`] message.
    pub(crate) refusal: String,
    /// The claims it records by UID, each with what unprepare needs (an
    /// empty `cdi_spec_path` when that did not read) or why it does not
    /// read; `Err` when its claims do not read at all.
    pub(crate) claims: Result<BTreeMap<String, Result<PreparedClaim, String>>, String>,
}

/// Reads and writes the checkpoint file.
#[derive(Clone)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct CheckpointStore {
    path: PathBuf,
    boot_id_path: PathBuf,
    /// The only directory whose files a stale checkpoint may have removed.
    cdi_root: PathBuf,
    metrics: PluginMetrics,
    /// What the file last read held beyond this build's fields; the next
    /// save writes it back ([`format`]).
    as_read: Arc<Mutex<AsRead>>,
    /// The refusal while the file is of a newer version, else `None`
    /// (the readiness follows it).
    newer: Arc<watch::Sender<Option<String>>>,
}

impl CheckpointStore {
    /// `cdi_root`: where this driver writes its CDI specs; after a reboot,
    /// only spec paths under it are removed, whatever the checkpoint says.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn new(
        data_dir: &Path,
        boot_id_path: PathBuf,
        cdi_root: PathBuf,
        metrics: PluginMetrics,
    ) -> Self {
        Self {
            path: data_dir.join("checkpoint.json"),
            boot_id_path,
            cdi_root,
            metrics,
            as_read: Default::default(),
            newer: Arc::new(watch::channel(None).0),
        }
    }

    /// The refusal while the last file read was of a newer version (`None`
    /// when it was not), updated on every read.
    pub(crate) fn newer(&self) -> watch::Receiver<Option<String>> {
        self.newer.subscribe()
    }

    /// Whether `path` is the spec of claim `uid` as the CDI writer names it:
    /// a file directly in the CDI root (lexically, no `..`) whose name ends
    /// in `_<uid>.json` (`<vendor>-<class>_<uid>.json`). Another claim's
    /// spec, a file of another program in the root, or anything elsewhere
    /// is not.
    fn is_ours(&self, uid: &str, path: &Path) -> bool {
        !uid.is_empty()
            && path.parent() == Some(self.cdi_root.as_path())
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&format!("_{uid}.json")))
    }

    #[cfg(any(test, feature = "testing", feature = "fuzzing"))]
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the checkpoint's temp files that a writer killed between
    /// staging and committing left (older than
    /// 60 s); returns them.
    pub(crate) fn remove_abandoned(&self) -> std::io::Result<Vec<PathBuf>> {
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Ok(Vec::new());
        };
        crate::prepare::atomic::remove_abandoned(
            dir,
            |target| std::ffi::OsStr::new(target) == name || target == released::FILE,
            crate::prepare::atomic::ABANDONED_AFTER,
        )
    }

    /// This boot's id; `None` when it cannot be read (or is empty): then
    /// no reboot can be told, and none is assumed.
    fn boot_id(&self) -> Option<String> {
        match std::fs::read_to_string(&self.boot_id_path) {
            Ok(id) if !id.trim().is_empty() => Some(id.trim().to_string()),
            Ok(_) => {
                tracing::warn!(path = %self.boot_id_path.display(), "boot id is empty; reboots are not detected");
                None
            }
            Err(e) => {
                tracing::warn!(path = %self.boot_id_path.display(), error = %e, "cannot read boot id; reboots are not detected");
                None
            }
        }
    }

    /// Sets the prepared gauges from what `checkpoint` records.
    fn count_prepared(&self, checkpoint: &Checkpoint) {
        let devices = checkpoint.claims.values().map(|c| c.devices.len()).sum();
        self.metrics.prepared(checkpoint.claims.len(), devices);
    }

    /// The checkpoint as the file has it, changing nothing (no lock
    /// needed): empty when there is none or it is from an earlier boot;
    /// [`CheckpointError::Newer`] for a newer version's,
    /// [`CheckpointError::Corrupt`] for one the pipeline's read (under
    /// the data-dir lock) would move aside. Sets the prepared gauges from
    /// it.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn load(&self) -> Result<Checkpoint, CheckpointError> {
        match self.read_file(false)? {
            Read::Current(checkpoint) => {
                self.count_prepared(&checkpoint);
                Ok(checkpoint)
            }
            Read::Newer(newer) => Err(CheckpointError::Newer {
                path: self.path.clone(),
                version: newer.version,
            }),
            Read::Damaged(_) => unreachable!("only a read under the lock moves a file aside"),
        }
    }

    /// The current checkpoint, under the data-dir lock (`_held`): empty when
    /// there is none, or when it is from an earlier boot (its CDI specs are
    /// removed and the file rewritten); [`Read::Damaged`] when it was
    /// corrupt (then moved aside); a newer version's is read as far as this build can and left
    /// as it is. Sets the prepared gauges from what this build prepared.
    pub(crate) fn read(&self, _held: &DataDirGuard) -> Result<Read, CheckpointError> {
        let read = self.read_file(true)?;
        if let Read::Current(checkpoint) | Read::Damaged(checkpoint) = &read {
            self.count_prepared(checkpoint);
        }
        Ok(read)
    }

    /// Reads the file; `repair` (the lock is held): moves a corrupt file
    /// aside, forgets an earlier boot's claims and drops the released ones
    /// on disk too.
    fn read_file(&self, repair: bool) -> Result<Read, CheckpointError> {
        let boot_id = self.boot_id();
        let empty = Checkpoint {
            version: CHECKPOINT_VERSION,
            boot_id: boot_id.clone().unwrap_or_default(),
            claims: BTreeMap::new(),
        };
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.remember(AsRead::default(), None);
                if repair {
                    self.forget_released()?;
                }
                return Ok(Read::Current(empty));
            }
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let checkpoint = match format::parse(&bytes) {
            Parsed::Current(mut checkpoint, as_read) => {
                self.remember(as_read, None);
                self.drop_released(&mut checkpoint, repair)?;
                checkpoint
            }
            Parsed::Newer {
                version,
                mut claims,
            } => {
                let released = self.released()?;
                if let Ok(claims) = &mut claims {
                    claims.retain(|uid, _| !released.contains(uid));
                }
                self.metrics.checkpoint_error("newer");
                let refusal = CheckpointError::Newer {
                    path: self.path.clone(),
                    version,
                }
                .to_string();
                self.remember(AsRead::default(), Some(refusal.clone()));
                return Ok(Read::Newer(NewerCheckpoint {
                    version,
                    refusal,
                    claims,
                }));
            }
            Parsed::Corrupt(reason) if !repair => {
                return Err(CheckpointError::Corrupt {
                    path: self.path.clone(),
                    reason,
                });
            }
            Parsed::Corrupt(reason) => {
                let aside = self.move_aside()?;
                self.remember(AsRead::default(), None);
                self.forget_released()?;
                self.metrics.checkpoint_error("corrupt");
                tracing::error!(
                    path = %self.path.display(),
                    moved_to = %aside.display(),
                    reason,
                    "checkpoint is corrupt; moved aside, recovering the prepared claims from the CDI specs on disk"
                );
                return Ok(Read::Damaged(empty));
            }
        };
        let Some(boot_id) = boot_id else {
            return Ok(Read::Current(checkpoint));
        };
        if checkpoint.boot_id.is_empty() {
            // Written while the boot id could not be read: whether the node
            // rebooted since cannot be told, so nothing is forgotten; the
            // next save records this boot.
            tracing::info!(
                boot_id,
                claims = checkpoint.claims.len(),
                "checkpoint has no boot id; keeping its claims and adopting this boot's"
            );
            return Ok(Read::Current(Checkpoint {
                boot_id,
                ..checkpoint
            }));
        }
        if checkpoint.boot_id != boot_id {
            if !repair {
                return Ok(Read::Current(empty));
            }
            tracing::info!(
                old_boot_id = checkpoint.boot_id,
                boot_id,
                claims = checkpoint.claims.len(),
                "node rebooted since the checkpoint was written; forgetting prepared claims"
            );
            for (uid, claim) in &checkpoint.claims {
                // A checkpoint is a file on the node: never let one that was
                // tampered with (or written for another CDI root) make the
                // driver delete files that are not the claim's own spec.
                if !self.is_ours(uid, &claim.cdi_spec_path) {
                    tracing::warn!(
                        claim_uid = %uid,
                        path = %claim.cdi_spec_path.display(),
                        cdi_root = %self.cdi_root.display(),
                        "stale checkpoint names a file that is not this claim's CDI spec in the CDI root; not removing it"
                    );
                    continue;
                }
                if let Err(e) = remove_if_exists(&claim.cdi_spec_path) {
                    tracing::warn!(path = %claim.cdi_spec_path.display(), error = %e, "cannot remove stale CDI spec");
                }
            }
            self.save(&empty)?;
            return Ok(Read::Current(empty));
        }
        Ok(Read::Current(checkpoint))
    }

    fn released_path(&self) -> PathBuf {
        self.path.with_file_name(released::FILE)
    }

    fn released(&self) -> Result<std::collections::BTreeSet<String>, CheckpointError> {
        let path = self.released_path();
        released::read(&path).map_err(|source| CheckpointError::Read { path, source })
    }

    /// Records `uids` as unprepared by this build while the checkpoint is a
    /// newer version's, which it may not rewrite ([`released`]).
    pub(crate) fn record_released(
        &self,
        _held: &DataDirGuard,
        uids: &[String],
    ) -> Result<(), CheckpointError> {
        let mut all = self.released()?;
        all.extend(uids.iter().cloned());
        let path = self.released_path();
        released::write(&path, all).map_err(|source| {
            self.metrics.checkpoint_error("write");
            CheckpointError::Write { path, source }
        })
    }

    /// Drops the claims an older build unprepared while this checkpoint was
    /// newer than it ([`released`]); `repair` (the lock is held): on disk
    /// too, and the list goes.
    fn drop_released(
        &self,
        checkpoint: &mut Checkpoint,
        repair: bool,
    ) -> Result<(), CheckpointError> {
        let released = self.released()?;
        if released.is_empty() {
            return Ok(());
        }
        let before = checkpoint.claims.len();
        checkpoint.claims.retain(|uid, _| !released.contains(uid));
        if !repair {
            return Ok(());
        }
        tracing::info!(
            claims = ?released,
            dropped = before - checkpoint.claims.len(),
            "dropping the claims an older driver unprepared while the checkpoint was newer than it"
        );
        if checkpoint.claims.len() != before {
            self.save(checkpoint)?;
        }
        self.forget_released()
    }

    /// Removes the list of released claims: applied, or the checkpoint it
    /// was for is gone (a claim prepared later under one of its UIDs must
    /// not be dropped).
    fn forget_released(&self) -> Result<(), CheckpointError> {
        let path = self.released_path();
        remove_if_exists(&path).map_err(|source| CheckpointError::Write { path, source })
    }

    /// Keeps what the file just read held beyond this build's fields, and
    /// whether it was a newer version's (the refusal, for the readiness).
    fn remember(&self, as_read: AsRead, newer: Option<String>) {
        *self.as_read.lock().unwrap_or_else(|e| e.into_inner()) = as_read;
        self.newer.send_if_modified(|was| {
            let changed = *was != newer;
            *was = newer;
            changed
        });
    }

    fn move_aside(&self) -> Result<PathBuf, CheckpointError> {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let aside = self.path.with_extension(format!("json.corrupt-{stamp}"));
        std::fs::rename(&self.path, &aside).map_err(|source| CheckpointError::MoveAside {
            path: self.path.clone(),
            source,
        })?;
        Ok(aside)
    }

    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn save(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        self.save_with(checkpoint, Vec::new())
    }

    /// Saves the checkpoint together with `before` (CDI specs it names):
    /// those are renamed first, so the checkpoint never names a spec that
    /// is not there, and the disk is waited on twice for all of them.
    pub(crate) fn save_with(
        &self,
        checkpoint: &Checkpoint,
        mut before: Vec<Staged>,
    ) -> Result<(), CheckpointError> {
        let bytes = format::encode(
            checkpoint,
            &self.as_read.lock().unwrap_or_else(|e| e.into_inner()),
        )?;
        let failed = |path: PathBuf, source| {
            self.metrics.checkpoint_error("write");
            CheckpointError::Write { path, source }
        };
        before.push(stage(&self.path, &bytes).map_err(|e| failed(self.path.clone(), e))?);
        commit(before).map_err(|(path, e)| failed(path, e))?;
        self.count_prepared(checkpoint);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
