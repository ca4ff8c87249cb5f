//! TCP ports for the processes a testbed starts (etcd, apiserver, kubelet,
//! driver metrics), picked so that they are still free when the process binds
//! them seconds later.
//!
//! Asking the kernel for port 0 and closing the listener is not enough: that
//! port comes from the ephemeral range, which every outgoing connection on the
//! machine draws from too. With three clusters side by side, an apiserver
//! dialing its kubelet on [`crate::cluster_config::NODE_IP`] can take the port
//! another cluster's kubelet is about to listen on, and that kubelet exits
//! with "address already in use". So ports come from below the ephemeral
//! range, where connects never land, and each one is reserved across
//! processes by a file under [`RESERVATIONS`] holding the reserver's pid;
//! a reservation whose pid is gone is taken over.

use std::collections::hash_map::RandomState;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::error::{Error, Result};

/// Where reservations live: one file per port, named by the port, holding a pid.
pub const RESERVATIONS: &str = "/run/ad/ports";
/// The lowest port handed out.
const LOWEST: u16 = 10_000;
/// Fewer free ports than this below the ephemeral range: use the kernel's pick.
const MIN_SPAN: u16 = 2_000;

/// The range ports are picked from: `[LOWEST, start of the ephemeral range)`,
/// or `None` when that is too narrow (then the kernel picks).
pub fn pick_range(ephemeral: Option<(u16, u16)>) -> Option<(u16, u16)> {
    let low = ephemeral.map_or(32_768, |(low, _)| low);
    (low >= LOWEST.saturating_add(MIN_SPAN)).then_some((LOWEST, low))
}

/// `/proc/sys/net/ipv4/ip_local_port_range` as `(low, high)`.
fn ephemeral_range() -> Option<(u16, u16)> {
    parse_port_range(&fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?)
}

fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// A port free on `ip` now, reserved for this process, and not in `skip`.
pub fn reserve(ip: IpAddr, skip: &dyn Fn(u16) -> bool) -> Result<u16> {
    reserve_in(Path::new(RESERVATIONS), ip, skip)
}

fn reserve_in(dir: &Path, ip: IpAddr, skip: &dyn Fn(u16) -> bool) -> Result<u16> {
    let no_port = |m: String| Error::NoFreePort {
        addr: ip,
        source: std::io::Error::other(m),
    };
    let can_reserve = fs::create_dir_all(dir).is_ok();
    if can_reserve {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(|| sweep(dir));
    }
    let range = pick_range(ephemeral_range());
    let random = RandomState::new();
    for attempt in 0u64..500 {
        let port = match range {
            Some((low, high)) => {
                let mut h = random.build_hasher();
                h.write_u64(attempt);
                let span = u64::from(high - low);
                low + u16::try_from(h.finish() % span).unwrap_or(0)
            }
            None => kernel_pick(ip)?,
        };
        if skip(port) || TcpListener::bind((ip, port)).is_err() {
            continue;
        }
        if !can_reserve || claim(dir, port) {
            return Ok(port);
        }
    }
    Err(no_port(format!(
        "no port free and unreserved under {} after 500 tries",
        dir.display()
    )))
}

fn kernel_pick(ip: IpAddr) -> Result<u16> {
    let l = TcpListener::bind((ip, 0)).map_err(|source| Error::NoFreePort { addr: ip, source })?;
    Ok(l.local_addr()
        .map_err(|source| Error::NoFreePort { addr: ip, source })?
        .port())
}

fn reservation(dir: &Path, port: u16) -> PathBuf {
    dir.join(port.to_string())
}

/// Takes `port` for this process: a new reservation, or one whose holder is gone.
fn claim(dir: &Path, port: u16) -> bool {
    let path = reservation(dir, port);
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                let _ = write!(f, "{}", std::process::id());
                return true;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if holder_alive(&path) {
                    return false;
                }
                let _ = fs::remove_file(&path);
            }
            // A reservation we cannot write still leaves the bind check.
            Err(_) => return true,
        }
    }
    false
}

/// Whether the pid in a reservation file is a live process. A file still
/// being written (empty) counts as alive.
fn holder_alive(path: &Path) -> bool {
    match fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => true,
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists()),
        Err(_) => false,
    }
}

/// Drops reservations of processes that are gone (once per process).
fn sweep(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !holder_alive(&path) {
            let _ = fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn ports_come_from_below_the_ephemeral_range() {
        assert_eq!(pick_range(Some((32768, 60999))), Some((10_000, 32768)));
        assert_eq!(pick_range(None), Some((10_000, 32768)));
        // Too little room below: leave it to the kernel.
        assert_eq!(pick_range(Some((1024, 65535))), None);
        assert_eq!(pick_range(Some((11_000, 65535))), None);
        assert_eq!(parse_port_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_port_range("junk"), None);
    }

    #[test]
    fn a_reserved_port_is_not_handed_out_again_while_its_holder_lives() {
        let dir = std::env::temp_dir().join(format!("ports-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let first = reserve_in(&dir, ip, &|_| false).unwrap();
        let text = fs::read_to_string(reservation(&dir, first)).unwrap();
        assert_eq!(text, std::process::id().to_string());
        // This process lives, so the port is taken for anyone else.
        assert!(!claim(&dir, first));
        // A reservation of a dead process (pid beyond pid_max) is taken over.
        fs::write(reservation(&dir, first), "4294967295").unwrap();
        assert!(claim(&dir, first));
        // The pick avoids what the caller skips.
        let second = reserve_in(&dir, ip, &|p| p == first).unwrap();
        assert_ne!(second, first);
        if let Some((low, high)) = pick_range(ephemeral_range()) {
            assert!(
                (low..high).contains(&second),
                "{second} not in {low}..{high}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
