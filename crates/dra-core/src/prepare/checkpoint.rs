//! The plugin's record of prepared claims, the source of truth for unprepare.
//!
//! A versioned JSON file in the plugin data directory, replaced atomically
//! and re-read on every call (a second plugin instance may have changed it).
//! It holds per claim everything unprepare needs without the API server.
//! A different boot id means the node rebooted: nothing is prepared any more
//! (CDI specs under /var/run are gone, kubelet prepares again), so the old
//! entries are dropped. A file we cannot parse is moved aside, logged and
//! counted, and we start empty: a crash loop would take all devices down.
//!
//! Nothing is forgotten on a read error: a boot id that cannot be read
//! judges no reboot (the checkpoint stays as it is), and a checkpoint
//! written without one adopts the next one read. A checkpoint of a newer
//! version (a rollback, or the old pod of a surge upgrade) is refused with
//! an error and kept: the newer build that wrote it still knows its claims.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::prepare::atomic::{Staged, commit, remove_if_exists, stage};
use crate::prepare::driver::PreparedDevice;
use crate::prepare::metrics::PluginMetrics;

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
         and no claim is prepared or unprepared here until a driver that reads it runs"
    )]
    Newer { path: PathBuf, version: u32 },
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
        }
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
            |target| std::ffi::OsStr::new(target) == name,
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

    /// The current checkpoint; empty when there is none, when it is from an
    /// earlier boot, or when it was corrupt (then moved aside). Sets the
    /// prepared gauges from it.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn load(&self) -> Result<Checkpoint, CheckpointError> {
        let checkpoint = self.read_current()?;
        self.count_prepared(&checkpoint);
        Ok(checkpoint)
    }

    fn read_current(&self) -> Result<Checkpoint, CheckpointError> {
        let boot_id = self.boot_id();
        let empty = Checkpoint {
            version: CHECKPOINT_VERSION,
            boot_id: boot_id.clone().unwrap_or_default(),
            claims: BTreeMap::new(),
        };
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(empty),
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let parsed = serde_json::from_slice::<Checkpoint>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|c| {
                if c.version >= CHECKPOINT_VERSION {
                    Ok(c)
                } else {
                    Err(format!(
                        "unsupported version {} (this build reads {CHECKPOINT_VERSION})",
                        c.version
                    ))
                }
            });
        if let Ok(c) = &parsed
            && c.version > CHECKPOINT_VERSION
        {
            self.metrics.checkpoint_error("newer");
            return Err(CheckpointError::Newer {
                path: self.path.clone(),
                version: c.version,
            });
        }
        let checkpoint = match parsed {
            Ok(c) => c,
            Err(reason) => {
                let aside = self.move_aside()?;
                self.metrics.checkpoint_error("corrupt");
                tracing::error!(
                    path = %self.path.display(),
                    moved_to = %aside.display(),
                    reason,
                    "checkpoint is corrupt; moved aside, starting with no prepared claims"
                );
                return Ok(empty);
            }
        };
        let Some(boot_id) = boot_id else {
            return Ok(checkpoint);
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
            return Ok(Checkpoint {
                boot_id,
                ..checkpoint
            });
        }
        if checkpoint.boot_id != boot_id {
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
            return Ok(empty);
        }
        Ok(checkpoint)
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
        let bytes = serde_json::to_vec_pretty(checkpoint)?;
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
mod tests {
    use super::*;

    fn store(dir: &Path, boot: &str) -> (CheckpointStore, prometheus::Registry) {
        let boot_path = dir.join("boot_id");
        std::fs::write(&boot_path, format!("{boot}\n")).unwrap();
        let registry = prometheus::Registry::new();
        let metrics = PluginMetrics::register(&registry).unwrap();
        (
            CheckpointStore::new(dir, boot_path, dir.join("cdi"), metrics),
            registry,
        )
    }

    fn sample(spec: PathBuf) -> PreparedClaim {
        PreparedClaim {
            namespace: "ns".into(),
            name: "c".into(),
            devices: vec![PreparedDevice {
                request_names: vec!["req".into()],
                pool: "node".into(),
                device: "dev-0".into(),
                admin_access: false,
                share_ids: vec![],
                cdi_device_ids: vec!["k8s.x/y=uid-dev-0".into()],
            }],
            cdi_spec_path: spec,
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = store(dir.path(), "boot-a");
        let mut c = s.load().unwrap();
        assert!(c.claims.is_empty());
        c.claims
            .insert("uid".into(), sample(dir.path().join("spec.json")));
        s.save(&c).unwrap();
        assert_eq!(s.load().unwrap(), c);
    }

    /// The prepared gauges follow every save, and a fresh store (a driver
    /// restart) reads them back from the file; a reboot zeroes them.
    #[test]
    fn prepared_gauges_follow_the_checkpoint() {
        let gauges = |registry: &prometheus::Registry| {
            let text = crate::prepare::metrics::tests::render(registry);
            let value = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name} ")))
                    .and_then(|v| v.parse::<i64>().ok())
            };
            (
                value("aws_dra_checkpoint_claims"),
                value("aws_dra_checkpoint_devices"),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let (s, registry) = store(dir.path(), "boot-a");
        let mut c = s.load().unwrap();
        assert_eq!(gauges(&registry), (Some(0), Some(0)));
        let mut two = sample(dir.path().join("cdi/a.json"));
        two.devices.push(two.devices[0].clone());
        two.devices[1].device = "dev-1".into();
        c.claims.insert("a".into(), two);
        c.claims
            .insert("b".into(), sample(dir.path().join("cdi/b.json")));
        s.save(&c).unwrap();
        assert_eq!(gauges(&registry), (Some(2), Some(3)));
        c.claims.remove("a");
        s.save(&c).unwrap();
        assert_eq!(gauges(&registry), (Some(1), Some(1)));

        let (restarted, registry) = store(dir.path(), "boot-a");
        assert_eq!(gauges(&registry), (Some(0), Some(0)));
        restarted.load().unwrap();
        assert_eq!(gauges(&registry), (Some(1), Some(1)));

        let (rebooted, registry) = store(dir.path(), "boot-b");
        rebooted.load().unwrap();
        assert_eq!(gauges(&registry), (Some(0), Some(0)));
    }

    #[test]
    fn boot_id_change_removes_only_the_claims_own_specs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
        let (s, _) = store(dir.path(), "boot-a");
        std::fs::create_dir_all(dir.path().join("cdi/sub")).unwrap();
        // Outside the root, escaping it, another claim's spec in the root,
        // another program's file in the root, and a spec of the right name
        // one level down: each recorded as the spec of claim uid-<i>.
        let victims = [
            dir.path().join("elsewhere_uid-0.json"),
            dir.path().join("cdi/../escaped_uid-1.json"),
            dir.path().join("cdi/k8s.x-y_someone-else.json"),
            dir.path().join("cdi/nvidia.yaml"),
            dir.path().join("cdi/sub/k8s.x-y_uid-4.json"),
        ];
        let on_disk = |v: &Path| -> PathBuf {
            let parent = v.parent().unwrap();
            if parent.ends_with("..") {
                dir.path().join(v.file_name().unwrap())
            } else {
                v.to_path_buf()
            }
        };
        let mut c = s.load().unwrap();
        for (i, v) in victims.iter().enumerate() {
            std::fs::write(on_disk(v), "keep").unwrap();
            c.claims.insert(format!("uid-{i}"), sample(v.clone()));
        }
        s.save(&c).unwrap();
        let (s2, _) = store(dir.path(), "boot-b");
        assert!(s2.load().unwrap().claims.is_empty());
        for v in &victims {
            assert_eq!(
                std::fs::read_to_string(on_disk(v)).unwrap(),
                "keep",
                "{}",
                v.display()
            );
        }
    }

    #[test]
    fn boot_id_change_forgets_claims_and_their_specs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
        let (s, _) = store(dir.path(), "boot-a");
        let spec = dir.path().join("cdi/k8s.x-y_uid.json");
        std::fs::write(&spec, "{}").unwrap();
        let mut c = s.load().unwrap();
        c.claims.insert("uid".into(), sample(spec.clone()));
        s.save(&c).unwrap();
        let (s2, _) = store(dir.path(), "boot-b");
        let loaded = s2.load().unwrap();
        assert!(loaded.claims.is_empty());
        assert_eq!(loaded.boot_id, "boot-b");
        assert!(!spec.exists());
    }

    /// A boot id that cannot be read forgets nothing: the claims and their
    /// specs stay, and the next boot id read is adopted, not taken for a
    /// reboot (that used to delete every spec, twice).
    #[test]
    fn unreadable_boot_id_forgets_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
        let spec = dir.path().join("cdi/a.json");
        std::fs::write(&spec, "{}").unwrap();
        let (s, _) = store(dir.path(), "boot-a");
        let mut c = s.load().unwrap();
        c.claims.insert("a".into(), sample(spec.clone()));
        s.save(&c).unwrap();

        for unreadable in ["missing", "empty"] {
            let boot = dir.path().join("boot_id");
            match unreadable {
                "missing" => std::fs::remove_file(&boot).unwrap(),
                _ => std::fs::write(&boot, "\n").unwrap(),
            }
            let loaded = s.load().unwrap();
            assert_eq!(loaded.claims.len(), 1, "{unreadable}");
            assert_eq!(loaded.boot_id, "boot-a", "{unreadable}");
            assert!(spec.exists(), "{unreadable}");
            // A save while unreadable keeps the recorded boot id.
            s.save(&loaded).unwrap();
            std::fs::write(&boot, "boot-a\n").unwrap();
        }

        // A checkpoint written with no boot id at all (an older build wrote
        // "" when the read failed) adopts the next one read.
        let mut no_id = s.load().unwrap();
        no_id.boot_id.clear();
        s.save(&no_id).unwrap();
        let (later, _) = store(dir.path(), "boot-b");
        let loaded = later.load().unwrap();
        assert_eq!(loaded.claims.len(), 1);
        assert_eq!(loaded.boot_id, "boot-b");
        assert!(spec.exists());
    }

    /// A newer build's checkpoint is refused by name and left exactly as
    /// it was (a rollback must not forget what the newer driver prepared).
    #[test]
    fn newer_version_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (s, registry) = store(dir.path(), "boot-a");
        let newer = r#"{"version":2,"bootId":"boot-a","claims":{},"more":1}"#;
        std::fs::write(s.path(), newer).unwrap();
        let e = s.load().unwrap_err();
        assert!(
            matches!(e, CheckpointError::Newer { version: 2, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("newer than this build's 1"), "{e}");
        assert_eq!(std::fs::read_to_string(s.path()).unwrap(), newer);
        let text = crate::prepare::metrics::tests::render(&registry);
        assert!(
            text.contains("aws_dra_checkpoint_errors_total{reason=\"newer\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn corrupt_file_is_moved_aside_and_counted() {
        for garbage in [
            "{not json",
            r#"{"version":0,"bootId":"boot-a","claims":{}}"#,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let (s, registry) = store(dir.path(), "boot-a");
            std::fs::write(s.path(), garbage).unwrap();
            let loaded = s.load().unwrap();
            assert!(loaded.claims.is_empty());
            assert!(!s.path().exists());
            let aside: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
                .collect();
            assert_eq!(aside.len(), 1);
            assert_eq!(std::fs::read_to_string(aside[0].path()).unwrap(), garbage);
            let text = crate::prepare::metrics::tests::render(&registry);
            assert!(
                text.contains("aws_dra_checkpoint_errors_total{reason=\"corrupt\"} 1"),
                "{text}"
            );
        }
    }
}
