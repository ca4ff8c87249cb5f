//! Atomic file replacement: a temp file in the same directory, then a
//! rename. Readers (container runtimes, a second plugin instance) see either
//! the old or the new content, never a torn file.
//!
//! A temp file is always a new file (`O_CREAT | O_EXCL | O_NOFOLLOW`): a
//! symlink or file planted under its name makes the write fail instead of
//! writing through it. Its name is `.<target>.tmp-<pid>-<random>`: the pid
//! alone says nothing in a container (every driver is pid 1, and two run
//! side by side in a seamless upgrade), so a random number makes it unique,
//! and a name that is taken after all is retried with another.
//!
//! Several files can be put in place together ([`stage`], then [`commit`]):
//! renamed in the order given, so a reader that sees a later file also sees
//! the earlier ones (a checkpoint never names a CDI spec that is not there).
//!
//! Nothing here waits for the disk (no `fsync`), by design: everything
//! written through this module is about this boot only. CDI specs and
//! attributes files live under `/var/run` (tmpfs on a node), and the
//! checkpoint's claims are dropped when it is read in a later boot (its boot
//! id). A rename is atomic for every process of this boot whether or not it
//! reached the disk, and a process killed at any step leaves the old file or
//! the new one (the crash tests kill at each step); `fsync` would only make
//! a file survive a crash of the kernel, after which the boot id changes and
//! the file's claims are forgotten anyway. Two waits for the journal per
//! group commit were most of a prepare's time in a burst
//! (docs/performance.md). After a power loss on a filesystem that does not
//! write a file's data before its rename, the checkpoint may read as
//! damaged: it is moved aside and counted, and recovery finds nothing of the
//! old boot to rebuild (docs/reliability.md).

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How many names [`stage`] tries before it gives up on `EEXIST`.
const NAME_TRIES: usize = 8;

/// New content for `path`, written to a temp file beside it, not yet synced
/// nor in place. Dropped without [`commit`], the temp file is removed.
pub(crate) struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    file: Option<File>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `contents` to a temp file in `path`'s directory.
pub(crate) fn stage(path: &Path, contents: &[u8]) -> std::io::Result<Staged> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tries = 0;
    let (file, tmp) = loop {
        // Dot-prefixed and not ending in .json: CDI scanners skip it.
        let tmp = dir.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        match create_new(&tmp) {
            Ok(file) => break (file, tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries + 1 < NAME_TRIES => {
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    };
    // From here on, dropping `staged` (an error below) removes the file.
    let mut staged = Staged {
        file: Some(file),
        tmp,
        path: path.to_path_buf(),
    };
    if let Some(file) = staged.file.as_mut() {
        file.write_all(contents)?;
    }
    Ok(staged)
}

/// Creates `path` as a new file, never through a symlink.
fn create_new(path: &Path) -> std::io::Result<File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Puts staged files in place: renamed in the order given (a reader that
/// sees a later file also sees the earlier ones). On error: the path that
/// failed; temp files not yet renamed are removed.
pub(crate) fn commit(mut staged: Vec<Staged>) -> Result<(), (PathBuf, std::io::Error)> {
    crate::prepare::crash::point("commit:staged");
    for (i, s) in staged.iter_mut().enumerate() {
        if i == 1 {
            crate::prepare::crash::point("commit:renamed-first");
        }
        fs::rename(&s.tmp, &s.path).map_err(|e| (s.path.clone(), e))?;
        s.file = None;
    }
    crate::prepare::crash::point("commit:renamed");
    Ok(())
}

/// How old a temp file of [`stage`] must be before a starting driver takes
/// it for abandoned. A live writer's temp file exists for milliseconds;
/// another instance of the same driver (a rolling update) may be writing
/// one beside this one right now.
pub(crate) const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// The file a temp file of [`stage`] was staged for: `.<target>.tmp-<pid>-<n>`
/// gives `target`; any other name gives `None`.
fn staged_target(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    let at = rest.rfind(".tmp-")?;
    let (pid, n) = rest[at + 5..].split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (at > 0 && digits(pid) && digits(n)).then(|| &rest[..at])
}

/// Removes the temp files of [`stage`] in `dir` whose target satisfies
/// `ours` and that are older than `min_age`: what a process killed between
/// staging and committing left (SIGKILL runs no destructor). Returns the
/// files removed; a file that vanished meanwhile is not an error.
pub(crate) fn remove_abandoned(
    dir: &Path,
    ours: impl Fn(&str) -> bool,
    min_age: Duration,
) -> std::io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let now = SystemTime::now();
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(target) = name.to_str().and_then(staged_target) else {
            continue;
        };
        if !ours(target) {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if now.duration_since(modified).unwrap_or_default() < min_age {
            continue;
        }
        let path = entry.path();
        remove_if_exists(&path)?;
        removed.push(path);
    }
    Ok(removed)
}

/// Removes a file; a file that is already gone is fine.
pub(crate) fn remove_if_exists(path: &Path) -> std::io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_puts_every_file_in_place_and_staged_files_vanish_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let (a, b) = (dir.path().join("a.json"), sub.join("b.json"));
        fs::write(&b, "old").unwrap();
        commit(vec![stage(&a, b"A").unwrap(), stage(&b, b"B").unwrap()]).unwrap();
        assert_eq!(fs::read_to_string(&a).unwrap(), "A");
        assert_eq!(fs::read_to_string(&b).unwrap(), "B");

        let dropped = stage(&a, b"never").unwrap();
        drop(dropped);
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
        assert_eq!(fs::read_to_string(&a).unwrap(), "A");

        // A rename that fails names the file and leaves the rest untouched.
        let missing_dir = dir.path().join("gone").join("c.json");
        let staged = stage(&a, b"A2").unwrap();
        assert!(
            stage(&missing_dir, b"C").is_err(),
            "no directory to stage in"
        );
        drop(staged);
        assert_eq!(fs::read_to_string(&a).unwrap(), "A");
    }

    #[test]
    fn temp_names_are_recognised_and_nothing_else() {
        assert_eq!(
            staged_target(".k8s.efa-efa_u1.json.tmp-7478-164"),
            Some("k8s.efa-efa_u1.json")
        );
        assert_eq!(
            staged_target(".checkpoint.json.tmp-1-0"),
            Some("checkpoint.json")
        );
        for name in [
            "k8s.efa-efa_u1.json",
            ".k8s.efa-efa_u1.json",
            ".tmp-1-2",
            ".x.tmp-1",
            ".x.tmp-a-2",
            ".x.tmp-1-",
            "x.tmp-1-2",
        ] {
            assert_eq!(staged_target(name), None, "{name}");
        }
    }

    #[test]
    fn abandoned_temp_files_of_ours_go_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let put = |name: &str| {
            let path = dir.path().join(name);
            fs::write(&path, "x").unwrap();
            path
        };
        // What a writer killed between stage and commit leaves: a temp
        // file whose destructor never ran.
        let killed = stage(&dir.path().join("k8s.efa-efa_u1.json"), b"{}").unwrap();
        let abandoned = killed.tmp.clone();
        std::mem::forget(killed);
        let spec = put("k8s.efa-efa_u2.json");
        let other_driver = put(".k8s.gpu-gpu_u3.json.tmp-9-9");
        let not_a_temp_file = put(".k8s.efa-efa_u4.json.swp");
        let ours = |t: &str| t.starts_with("k8s.efa-efa_");

        // Young: a live writer's, or one beside us in a rolling update.
        let removed = remove_abandoned(dir.path(), ours, Duration::from_secs(60)).unwrap();
        assert!(removed.is_empty(), "{removed:?}");
        assert!(abandoned.exists());

        let removed = remove_abandoned(dir.path(), ours, Duration::ZERO).unwrap();
        assert_eq!(removed, std::slice::from_ref(&abandoned));
        assert!(!abandoned.exists());
        for kept in [spec, other_driver, not_a_temp_file] {
            assert!(kept.exists(), "{} removed", kept.display());
        }
        // No directory: nothing to do.
        let gone = dir.path().join("gone");
        assert!(
            remove_abandoned(&gone, ours, Duration::ZERO)
                .unwrap()
                .is_empty()
        );
    }

    /// A temp file is never written through a link or over a file that is
    /// already there, and two writers' temp files (same pid: containers)
    /// get different names.
    #[test]
    fn temp_files_are_new_files_under_unique_names() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        let planted = dir.path().join(".a.json.tmp-1-1");
        symlink(&victim, &planted).unwrap();
        let err = create_new(&planted).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{err}");
        // A dangling link: O_CREAT alone would create its target.
        let dangling = dir.path().join(".a.json.tmp-1-2");
        let target = dir.path().join("created-through-the-link");
        symlink(&target, &dangling).unwrap();
        assert!(create_new(&dangling).is_err());
        assert!(!target.exists());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");

        let path = dir.path().join("a.json");
        let (one, two) = (stage(&path, b"1").unwrap(), stage(&path, b"2").unwrap());
        assert_ne!(one.tmp, two.tmp);
        let pid = std::process::id().to_string();
        for s in [&one, &two] {
            let name = s.tmp.file_name().unwrap().to_str().unwrap();
            assert_eq!(staged_target(name), Some("a.json"), "{name}");
            let (_, rest) = name.split_once(".tmp-").unwrap();
            assert!(rest.starts_with(&format!("{pid}-")), "{name}");
        }
        let tmps = [one.tmp.clone(), two.tmp.clone()];
        drop((one, two));
        assert!(tmps.iter().all(|t| !t.exists()), "removed when dropped");
    }
}
