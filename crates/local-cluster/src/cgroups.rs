//! cgroup plumbing for kubelets and containerds on a cgroup v1 host.
//!
//! The machines this runs on mount every v1 controller on its own hierarchy
//! (plus a cgroup2 `unified` mount beside them) and run no systemd. Each node
//! gets its own cgroup root, created in every mounted hierarchy before its
//! kubelet starts (the kubelet refuses a `cgroupRoot` that is missing in any
//! subsystem); for cpuset the parent's `cpuset.cpus`/`cpuset.mems` are copied
//! down, or attaching a task fails with ENOSPC. Everything a run starts ends
//! up under `/aws-dra-e2e/<run>` in the `pids` hierarchy at least, so
//! teardown can find and kill by pid what left its process group (shims,
//! containers) and prove that nothing is left.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Result, io};

/// Mount points of the cgroup hierarchies (v1 controllers and the v2 mount).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    mountinfo
        .lines()
        .filter_map(|line| {
            // "<id> <parent> <maj:min> <root> <mountpoint> <opts> ... - <fstype> <source> <superopts>"
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(PathBuf::from)
        })
        .collect()
}

/// The hierarchy used to track processes: `pids` on v1, else the v2 mount.
pub fn tracking_hierarchy() -> Option<PathBuf> {
    let all = hierarchies();
    all.iter()
        .find(|h| h.ends_with("pids"))
        .or_else(|| all.iter().find(|h| h.join("cgroup.controllers").exists()))
        .cloned()
}

/// Creates `relative` (e.g. `aws-dra-e2e/run/p5`) in every hierarchy, and
/// gives its top level ([`weigh_pods`]) the CPU weight of a node's pods.
pub fn create_everywhere(relative: &str) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for hierarchy in hierarchies() {
        create_in(&hierarchy, relative)?;
        if let Some(top) = relative.split('/').find(|p| !p.is_empty())
            && let Err(e) = weigh_pods(&hierarchy.join(top), cpus)
        {
            // Slower container starts on a busy machine, nothing worse.
            tracing::warn!(error = %e, "could not weigh the pods' cgroup");
        }
    }
    Ok(())
}

/// Gives `dir` the CPU weight of `cpus` whole CPUs: `cpu.shares` 1024 per
/// CPU (cgroup v1), or `cpu.weight` 100 per CPU (v2), where the file exists.
///
/// Every pod of every e2e cluster lives under the top level of the tree,
/// and the control plane, kubelets and containerds run beside it at the
/// root. Left at the default, the whole tree weighs as much as one of those
/// processes, so when the clusters are busy the pods' containers starve:
/// `runc` setting up a BestEffort pod's container runs in the pod's cgroup,
/// and on CI (three clusters on 2 cores) starting one container took 16 to
/// 20 s where it takes well under one. On a node, kubelet gives its pods'
/// cgroup a weight after the node's allocatable CPUs, too.
pub fn weigh_pods(dir: &Path, cpus: usize) -> Result<()> {
    for (file, per_cpu, max) in [("cpu.shares", 1024, u64::MAX), ("cpu.weight", 100, 10_000)] {
        let path = dir.join(file);
        if path.exists() {
            let value = (per_cpu * cpus as u64).min(max);
            fs::write(&path, value.to_string()).map_err(io("writing", &path))?;
        }
    }
    Ok(())
}

/// Creates `relative` under one hierarchy, level by level, copying cpuset
/// settings down where the hierarchy has them.
pub fn create_in(hierarchy: &Path, relative: &str) -> Result<PathBuf> {
    let mut current = hierarchy.to_path_buf();
    for part in relative.split('/').filter(|p| !p.is_empty()) {
        let parent = current.clone();
        current.push(part);
        if !current.exists() {
            fs::create_dir(&current).map_err(io("creating cgroup", &current))?;
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let ours = current.join(file);
            if ours.exists() && fs::read_to_string(&ours).is_ok_and(|v| v.trim().is_empty()) {
                let value = fs::read_to_string(parent.join(file))
                    .map_err(io("reading", parent.join(file)))?;
                fs::write(&ours, value.trim()).map_err(io("writing", &ours))?;
            }
        }
    }
    Ok(current)
}

/// Moves `pid` into `relative` of the tracking hierarchy (created if needed).
pub fn track(relative: &str, pid: i32) -> Result<()> {
    let Some(hierarchy) = tracking_hierarchy() else {
        return Ok(());
    };
    let dir = create_in(&hierarchy, relative)?;
    let procs = dir.join("cgroup.procs");
    fs::write(&procs, pid.to_string()).map_err(io("writing", &procs))
}

/// Every pid in `relative` and below, across all hierarchies.
pub fn pids_under(relative: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for hierarchy in hierarchies() {
        collect(&hierarchy.join(relative), &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn collect(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect(&entry.path(), pids);
            }
        }
    }
}

/// Removes `relative` and everything below it in every hierarchy (deepest
/// first; a cgroup with live tasks stays and is reported).
pub fn remove_everywhere(relative: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for hierarchy in hierarchies() {
        remove_tree(&hierarchy.join(relative), &mut left);
    }
    left
}

fn remove_tree(dir: &Path, left: &mut Vec<PathBuf>) {
    if !dir.exists() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path(), left);
            }
        }
    }
    if fs::remove_dir(dir).is_err() {
        left.push(dir.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `file` of a fresh directory holding `before`, after `weigh_pods`
    /// with `cpus`.
    fn weighed(file: &str, before: &str, cpus: usize) -> String {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(file), before).unwrap();
        weigh_pods(dir.path(), cpus).unwrap();
        fs::read_to_string(dir.path().join(file)).unwrap()
    }

    #[test]
    fn pods_weigh_as_many_cpus_as_the_machine_has() {
        assert_eq!(weighed("cpu.shares", "1024", 2), "2048");
        assert_eq!(weighed("cpu.weight", "100", 3), "300");
        // cgroup v2's ceiling.
        assert_eq!(weighed("cpu.weight", "300", 512), "10000");

        // A hierarchy without a cpu controller: nothing is written.
        let other = tempfile::tempdir().unwrap();
        weigh_pods(other.path(), 2).unwrap();
        assert_eq!(fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
