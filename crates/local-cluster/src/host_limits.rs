//! Kernel limits a machine's worth of kubelets needs raised.
//!
//! Every kubelet and containerd opens several inotify instances (CA and
//! config file watchers, the plugin registration directory, the CRI's
//! event monitor), and the limit is per user: root runs them all. Debian's
//! default of 128 instances is too few for `cargo xtask ci`, whose four legs
//! run side by side and one of them with kind's node list (7 nodes): a
//! kubelet then fails at start with "error creating fsnotify watcher: too
//! many open files" (seen in CI on 2026-12-06), and a containerd whose CRI
//! plugin could not start answers "unknown service runtime.v1.RuntimeService".
//! So the cluster raises them at start, only upwards, to what kind's own
//! documentation asks of a host running many nodes.

use std::fs;
use std::path::Path;

/// `(sysctl file, the least value the clusters need)`.
pub const INOTIFY_MINIMUMS: [(&str, u64); 2] = [
    ("/proc/sys/fs/inotify/max_user_instances", 1024),
    ("/proc/sys/fs/inotify/max_user_watches", 524_288),
];

/// Raises each limit of [`INOTIFY_MINIMUMS`] that is below its minimum.
/// Returns one line per limit changed or left too low (a kernel that does
/// not let us write it: the run goes on, and the line says why a kubelet
/// may fail).
pub fn raise_inotify_limits() -> Vec<String> {
    INOTIFY_MINIMUMS
        .iter()
        .filter_map(|(file, least)| raise(Path::new(file), *least))
        .collect()
}

fn raise(file: &Path, least: u64) -> Option<String> {
    let current: u64 = fs::read_to_string(file).ok()?.trim().parse().ok()?;
    if current >= least {
        return None;
    }
    Some(match fs::write(file, least.to_string()) {
        Ok(()) => format!("raised {} from {current} to {least}", file.display()),
        Err(e) => format!(
            "{} is {current}, below the {least} the kubelets need, and could not be raised: {e}",
            file.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_only_upwards() {
        let dir = tempfile::tempdir().unwrap();
        let low = dir.path().join("low");
        let high = dir.path().join("high");
        fs::write(&low, "128\n").unwrap();
        fs::write(&high, "8192\n").unwrap();
        let said = raise(&low, 1024).unwrap();
        assert!(said.contains("from 128 to 1024"), "{said}");
        assert_eq!(fs::read_to_string(&low).unwrap(), "1024");
        assert_eq!(raise(&high, 1024), None);
        assert_eq!(fs::read_to_string(&high).unwrap(), "8192\n");
        assert_eq!(raise(&dir.path().join("missing"), 1), None);
    }
}
