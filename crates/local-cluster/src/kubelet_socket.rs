//! Kubelets started side by side on one host take turns at one socket.
//!
//! Every kubelet serves device-plugin registration on
//! `/var/lib/kubelet/device-plugins/kubelet.sock`, a path `--root-dir` does
//! not move. At start it removes the file and binds it anew; two kubelets
//! doing that at the same moment (nodes of two testbeds, CI legs run side by
//! side) can interleave remove, remove, bind, bind, and the second exits
//! with `bind: address already in use`. A kubelet that binds after another
//! has bound is fine (it removes the other's file first), so only the window
//! from start to bind needs a turn: each kubelet is started under a
//! host-wide lock that is held until it listens there, it exits, or
//! [`BIND_WAIT`] has passed.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// The device-plugin registration socket every kubelet on the host binds.
pub(crate) const DEVICE_PLUGIN_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// Longest a kubelet holds the turn before it listens (it binds within a
/// second or two of its start on this machine).
const BIND_WAIT: Duration = Duration::from_secs(20);
/// Longest a start waits for its turn before it goes ahead anyway (a turn
/// is held at most [`BIND_WAIT`], so this covers a few testbeds in a row).
const TURN_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(50);

/// A kubelet's turn at the socket; dropping it lets the next one start.
pub(crate) struct Turn {
    _lock: Option<Flock<fs::File>>,
}

/// Starts a kubelet in its turn: spawns `command` (output to `log`), puts
/// it in the cgroup `<cgroup_root>-kubelet`, and passes the turn on once it
/// listens on [`DEVICE_PLUGIN_SOCKET`], exited, or [`BIND_WAIT`] passed.
pub(crate) async fn spawn_kubelet(
    command: std::process::Command,
    log: &Path,
    cgroup_root: &str,
) -> crate::error::Result<crate::process::ManagedProcess> {
    let turn = take_turn().await;
    let mut kubelet = crate::process::ManagedProcess::spawn("kubelet", command, log)?;
    let pid = kubelet.pid();
    crate::cgroups::track(&format!("{cgroup_root}-kubelet"), pid)?;
    wait_listening(pid, Path::new(DEVICE_PLUGIN_SOCKET), || {
        !kubelet.is_running()
    })
    .await;
    drop(turn);
    Ok(kubelet)
}

/// Waits for the host-wide turn (a file lock in the temp directory). Never
/// fails: a lock that cannot be had is logged and the start goes ahead, as
/// it did before there were turns.
pub(crate) async fn take_turn() -> Turn {
    take_turn_at(&lock_path(), TURN_WAIT).await
}

fn lock_path() -> PathBuf {
    std::env::temp_dir().join("aws-dra-kubelet-device-plugins.lock")
}

async fn take_turn_at(path: &Path, patience: Duration) -> Turn {
    let started = Instant::now();
    loop {
        let file = match OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
        {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "no lock for the kubelet's device-plugin socket; starting without a turn");
                return Turn { _lock: None };
            }
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Turn { _lock: Some(lock) },
            Err((_, Errno::EWOULDBLOCK)) if started.elapsed() < patience => {
                tokio::time::sleep(POLL).await;
            }
            Err((_, errno)) => {
                tracing::warn!(path = %path.display(), %errno, "kubelet device-plugin socket turn not had; starting anyway");
                return Turn { _lock: None };
            }
        }
    }
}

/// Waits until process `pid` listens on `socket`, `exited()` says it is
/// gone, or [`BIND_WAIT`] passes. Whether it listens.
pub(crate) async fn wait_listening(
    pid: i32,
    socket: &Path,
    mut exited: impl FnMut() -> bool,
) -> bool {
    let started = Instant::now();
    while started.elapsed() < BIND_WAIT {
        if listens(pid, socket) {
            return true;
        }
        if exited() {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::debug!(pid, socket = %socket.display(), "kubelet not listening on its device-plugin socket yet; passing the turn on");
    false
}

/// Whether process `pid` holds a listening unix socket bound at `socket`.
fn listens(pid: i32, socket: &Path) -> bool {
    let Ok(table) = fs::read_to_string("/proc/net/unix") else {
        return false;
    };
    let inodes = listening_inodes(&table, socket);
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|fd| fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .any(|inode: u64| inodes.contains(&inode))
}

/// The inodes of listening sockets bound at `socket` in `/proc/net/unix`
/// (`Num RefCount Protocol Flags Type St Inode Path`; flag `0x10000` is a
/// listening socket).
fn listening_inodes(table: &str, socket: &Path) -> Vec<u64> {
    const ACCEPTS: u64 = 0x10000;
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (flags, inode, path) = (fields.get(3)?, fields.get(6)?, fields.get(7)?);
            let listening = u64::from_str_radix(flags, 16).ok()? & ACCEPTS != 0;
            (listening && Path::new(path) == socket).then(|| inode.parse().ok())?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_at_the_path_are_found_and_nothing_else() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 4242 /var/lib/kubelet/device-plugins/kubelet.sock\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 4343 /var/lib/kubelet/device-plugins/kubelet.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 4444 /run/containerd/containerd.sock\n\
            0000000000000000: 00000002 00000000 00000000 0002 01 4545\n";
        assert_eq!(
            listening_inodes(table, Path::new(DEVICE_PLUGIN_SOCKET)),
            [4242]
        );
        assert!(listening_inodes(table, Path::new("/nowhere.sock")).is_empty());
    }

    /// A socket this process listens on is seen as this process's; the
    /// same path is not another process's.
    #[tokio::test]
    async fn a_listener_is_seen_once_it_listens() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let me = i32::try_from(std::process::id()).unwrap();
        assert!(!listens(me, &socket));
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert!(wait_listening(me, &socket, || false).await);
        assert!(!listens(1, &socket), "pid 1 does not hold our socket");
        drop(listener);
        assert!(!listens(me, &socket));
        // A process that exits ends the wait at once.
        let started = Instant::now();
        assert!(!wait_listening(me, &socket, || true).await);
        assert!(started.elapsed() < BIND_WAIT);
    }

    /// Turns are one at a time: a second waits until the first is dropped.
    #[tokio::test]
    async fn one_turn_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("turn.lock");
        let first = take_turn_at(&path, TURN_WAIT).await;
        assert!(first._lock.is_some());
        let second = tokio::spawn({
            let path = path.clone();
            async move { take_turn_at(&path, TURN_WAIT).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "the second turn waits for the first");
        drop(first);
        let second = second.await.unwrap();
        assert!(second._lock.is_some());
        // Out of patience: goes ahead without a turn.
        let third = take_turn_at(&path, Duration::ZERO).await;
        assert!(third._lock.is_none());
    }
}
