//! Serializes prepare/unprepare within this process and across processes.
//!
//! During a seamless upgrade two plugin instances share the plugin data
//! directory; an exclusive `flock` on a file there makes their calls take
//! turns. The in-process mutex comes first so that only one task of ours
//! blocks a thread waiting on `flock`.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::{Mutex, OwnedMutexGuard};

#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    #[error("opening lock file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("locking {path}: {source}")]
    Flock { path: PathBuf, source: nix::Error },
    #[error("lock task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The data-directory lock.
#[derive(Clone)]
pub(crate) struct DataDirLock {
    path: PathBuf,
    local: Arc<Mutex<()>>,
}

/// Held while a call mutates shared state; dropping it unlocks.
pub(crate) struct DataDirGuard {
    _file: Flock<File>,
    _local: OwnedMutexGuard<()>,
}

impl DataDirLock {
    pub(crate) fn new(data_dir: &Path) -> Self {
        Self {
            path: data_dir.join("prepare.lock"),
            local: Arc::new(Mutex::new(())),
        }
    }

    pub(crate) async fn lock(&self) -> Result<DataDirGuard, LockError> {
        let local = self.local.clone().lock_owned().await;
        let path = self.path.clone();
        // Opening and an uncontended flock do not block: try on this
        // thread, and only a lock another process holds waits on the
        // blocking pool (a thread hop costs a prepare tens of microseconds,
        // a new blocking thread more).
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((file, Errno::EWOULDBLOCK)) => {
                tokio::task::spawn_blocking(move || {
                    Flock::lock(file, FlockArg::LockExclusive)
                        .map_err(|(_, source)| LockError::Flock { path, source })
                })
                .await??
            }
            Err((_, source)) => return Err(LockError::Flock { path, source }),
        };
        Ok(DataDirGuard {
            _file: file,
            _local: local,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn two_lock_instances_exclude_each_other() {
        // Two `DataDirLock`s over one directory model two processes: their
        // in-process mutexes are distinct, so only flock can serialize them.
        let dir = tempfile::tempdir().unwrap();
        let a = DataDirLock::new(dir.path());
        let b = DataDirLock::new(dir.path());
        let guard = a.lock().await.unwrap();
        let waiting = tokio::spawn(async move { b.lock().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "second instance got the lock too");
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
