//! State dirs and cgroups that a killed run left behind.
//!
//! A cluster removes its state dir (`/run/ad/<pid in hex>[suffix]`, see
//! [`crate::cluster_config::new_state_dir`]) at teardown. A run that is
//! killed first (CI's step timeout, `kill -9`, a machine out of memory) never
//! tears down: its containerd root, image snapshots and mounts stay, about
//! 0.8 GiB a node. On 2026-12-07 two legs that ran out of CI's time had left
//! 6.3 GiB and 80 mounts there. So a new cluster first removes the dirs of
//! runs that are gone, before it makes its own.
//!
//! A dir is removed only when all of these hold: its name is a pid in hex
//! with at most one suffix letter (so `ports` and anything else is left
//! alone); no process with that pid lives (a name such as `62d0a` is read
//! both as pid `0x62d0a` and as pid `0x62d0` with suffix `a`, and either
//! being alive keeps it); no living process names the dir on its command line
//! (a kubelet or containerd orphaned by its run's death still uses it); it has
//! no [`KEEP_MARK`] (a run asked to keep its state for debugging); and every
//! mount below it could be unmounted (otherwise `remove_dir_all` would walk
//! into what is mounted there).
//!
//! The run's cgroups (`aws-dra-e2e/<secs>-<pid>` in every hierarchy) go the
//! same way once no process is left in them ([`dead_cgroups`]).

use std::fs;
use std::path::{Path, PathBuf};

/// A file in a state dir that keeps it from [`sweep`]: written when a run is
/// configured to keep its state dir (`keep_state_dir`).
pub(crate) const KEEP_MARK: &str = ".keep";

/// A new state dir ([`crate::cluster_config::new_state_dir`]) once the dirs
/// of dead runs are gone ([`sweep_here`]); marked with [`KEEP_MARK`] when the
/// run keeps it.
pub(crate) fn fresh_state_dir(keep: bool) -> crate::error::Result<PathBuf> {
    sweep_here();
    let dir = crate::cluster_config::new_state_dir()?;
    if keep {
        let mark = dir.join(KEEP_MARK);
        fs::write(&mark, b"").map_err(crate::error::io("writing", &mark))?;
    }
    Ok(dir)
}

/// What [`sweep`] did with one dir.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Swept {
    /// Its run is gone, but a living process names it: left in place.
    InUse(PathBuf),
    /// Its run is gone, but mounts below it stayed: left in place.
    MountsLeft(PathBuf, Vec<PathBuf>),
    Removed(PathBuf),
}

/// The pids a state dir's name can stand for: the whole name in hex, and the
/// name without a last letter `a`-`g` (the suffixes of `new_state_dir`).
fn owner_pids(name: &str) -> Vec<i32> {
    let parse = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| i32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let mut pids = Vec::new();
    if let Some(p) = parse(name) {
        pids.push(p);
    }
    if let Some(stem) = name.strip_suffix(['a', 'b', 'c', 'd', 'e', 'f', 'g'])
        && let Some(p) = parse(stem)
    {
        pids.push(p);
    }
    pids
}

/// The command lines of all living processes, each as one string.
fn command_lines() -> Vec<String> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| crate::process::proc_strings(pid, "cmdline").ok())
        .map(|args| args.join(" "))
        .collect()
}

/// Removes the state dirs under `root` whose runs are gone (module docs).
/// `alive` says whether a pid lives, `command_lines` are those of the living
/// processes, and `unmount_below` unmounts what is mounted below a dir and
/// returns what it could not.
pub(crate) fn sweep(
    root: &Path,
    alive: impl Fn(i32) -> bool,
    command_lines: &[String],
    unmount_below: impl Fn(&Path) -> Vec<PathBuf>,
) -> Vec<Swept> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pids = owner_pids(&name);
        let path = entry.path();
        if pids.is_empty()
            || pids.iter().any(|p| alive(*p))
            || !entry.file_type().is_ok_and(|t| t.is_dir())
            || path.join(KEEP_MARK).exists()
        {
            continue;
        }
        let prefix = format!("{}/", path.display());
        if command_lines.iter().any(|c| c.contains(&prefix)) {
            out.push(Swept::InUse(path));
            continue;
        }
        let left = unmount_below(&path);
        if !left.is_empty() {
            out.push(Swept::MountsLeft(path, left));
            continue;
        }
        if fs::remove_dir_all(&path).is_ok() {
            out.push(Swept::Removed(path));
        }
    }
    out.sort();
    out
}

/// The names of the cgroups below `aws-dra-e2e/` (`<secs>-<pid>`, see
/// `run_id`) whose run is gone: `alive` says no for the pid and no process
/// is left in it (`pids_under`). A cgroup with processes is not touched.
pub(crate) fn dead_cgroups(
    names: impl IntoIterator<Item = String>,
    alive: impl Fn(i32) -> bool,
    pids_under: impl Fn(&str) -> Vec<i32>,
) -> Vec<String> {
    let mut dead: Vec<String> = names
        .into_iter()
        .filter(|name| {
            name.split_once('-')
                .filter(|(secs, _)| !secs.is_empty() && secs.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|(_, pid)| pid.parse::<i32>().ok())
                .is_some_and(|pid| !alive(pid))
        })
        .filter(|name| pids_under(&format!("aws-dra-e2e/{name}")).is_empty())
        .collect();
    dead.sort();
    dead
}

/// [`sweep`] of `/run/ad` and [`dead_cgroups`] on this machine, saying what
/// it did.
fn sweep_here() {
    if let Some(h) = crate::cgroups::tracking_hierarchy()
        && let Ok(entries) = fs::read_dir(h.join("aws-dra-e2e"))
    {
        let names = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned());
        for name in dead_cgroups(names, crate::process::pid_alive, crate::cgroups::pids_under) {
            let left = crate::cgroups::remove_everywhere(&format!("aws-dra-e2e/{name}"));
            if left.is_empty() {
                eprintln!("aws-dra-e2e: removed cgroup aws-dra-e2e/{name} (its run is gone)");
            }
        }
    }
    let swept = sweep(
        Path::new(crate::cluster_config::STATE_ROOT),
        crate::process::pid_alive,
        &command_lines(),
        crate::node::unmount_below,
    );
    for s in swept {
        match s {
            Swept::Removed(dir) => {
                eprintln!("aws-dra-e2e: removed {} (its run is gone)", dir.display());
            }
            Swept::MountsLeft(dir, left) => eprintln!(
                "aws-dra-e2e: left {} (its run is gone, but {} mounts below it stay, e.g. {})",
                dir.display(),
                left.len(),
                left[0].display()
            ),
            Swept::InUse(dir) => eprintln!(
                "aws-dra-e2e: left {} (its run is gone, but a living process names it)",
                dir.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stand_for_their_pids_with_and_without_a_suffix() {
        assert_eq!(owner_pids("62d0"), vec![0x62d0]);
        assert_eq!(owner_pids("62d0a"), vec![0x62d0a, 0x62d0]);
        assert_eq!(owner_pids("62d0g"), vec![0x62d0]);
        assert_eq!(owner_pids("ports"), Vec::<i32>::new());
        assert_eq!(owner_pids(""), Vec::<i32>::new());
        assert_eq!(owner_pids("g"), Vec::<i32>::new());
        assert_eq!(owner_pids("12x"), Vec::<i32>::new());
    }

    #[test]
    fn only_empty_cgroups_of_dead_runs_are_named() {
        let names = [
            "1796558250-25133", // dead, empty
            "1796558251-25144", // dead, a process left in it
            "1796603954-3644",  // alive
            "pods",
            "-12",
            "17965x-12",
        ]
        .map(String::from);
        let alive = |pid: i32| pid == 3644;
        let pids_under = |rel: &str| {
            if rel == "aws-dra-e2e/1796558251-25144" {
                vec![4242]
            } else {
                Vec::new()
            }
        };
        assert_eq!(
            dead_cgroups(names, alive, pids_under),
            vec!["1796558250-25133".to_string()]
        );
    }

    #[test]
    fn only_the_dirs_of_dead_runs_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let dir = root.path().join(name);
            fs::create_dir_all(dir.join("0/containerd/root")).unwrap();
            fs::write(dir.join("0/containerd/root/blob"), b"layer").unwrap();
            dir
        };
        let dead = make("1a2b");
        let dead_suffixed = make("1a2cg");
        let living = make("3c4d");
        // Read as 0x3c4da (dead) or 0x3c4d with suffix `a` (alive): kept.
        let ambiguous = make("3c4da");
        let kept = make("5e6f");
        fs::write(kept.join(KEEP_MARK), b"").unwrap();
        let orphaned = make("7a8b");
        let mounted = make("9a0b");
        let ports = make("ports");
        let lines = vec![
            "/usr/bin/sleep 100".to_string(),
            format!("kubelet --root-dir={}/0/k", orphaned.display()),
        ];
        let alive = |pid: i32| pid == 0x3c4d;
        let unmount = |dir: &Path| {
            if dir == mounted {
                vec![dir.join("0/k")]
            } else {
                Vec::new()
            }
        };
        let swept = sweep(root.path(), alive, &lines, unmount);
        assert_eq!(
            swept,
            vec![
                Swept::InUse(orphaned.clone()),
                Swept::MountsLeft(mounted.clone(), vec![mounted.join("0/k")]),
                Swept::Removed(dead.clone()),
                Swept::Removed(dead_suffixed.clone()),
            ]
        );
        assert!(!dead.exists() && !dead_suffixed.exists());
        for still in [&living, &ambiguous, &kept, &orphaned, &mounted, &ports] {
            assert!(still.join("0/containerd/root/blob").exists(), "{still:?}");
        }
        // A root that does not exist yet is no error.
        assert!(sweep(&root.path().join("none"), alive, &[], unmount).is_empty());
    }
}
