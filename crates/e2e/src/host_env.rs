//! Where things are on this machine and what its processes use: the driver
//! binaries, the repository's examples, free loopback ports, a plain HTTP
//! GET for metrics endpoints, a process's resident memory, and the files of
//! a directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::testbed::DriverKind;
use local_cluster::error::{Error, Result, io};
use local_cluster::toolchain::repo_root;

/// Finds the directory holding the executables of `kinds`.
pub fn driver_bin_dir(kinds: &[DriverKind]) -> Result<PathBuf> {
    let missing = |dir: &Path| Error::MissingBinary {
        what: "driver binaries (cargo build -p efa-driver -p neuron-driver -p e2e --bins)".into(),
        path: dir.to_path_buf(),
    };
    let has_all = |dir: &Path| kinds.iter().all(|k| dir.join(k.binary()).is_file());
    let fresh = |dir: PathBuf| -> Result<PathBuf> {
        for kind in kinds {
            if let Some(source) = newer_source(&dir, kind.binary()) {
                return Err(Error::Testbed(format!(
                    "{} is older than {}, a source it is built from: the tests would run \
                     yesterday's driver; rebuild it (`cargo build -p efa-driver -p neuron-driver \
                     -p e2e --bins`, with `--release` for a release directory)",
                    dir.join(kind.binary()).display(),
                    source.display()
                )));
            }
        }
        Ok(dir)
    };
    if let Some(dir) = std::env::var_os("AWS_DRA_BIN_DIR") {
        let dir = PathBuf::from(dir);
        return if has_all(&dir) {
            fresh(dir)
        } else {
            Err(missing(&dir))
        };
    }
    let exe = std::env::current_exe().map_err(io("locating", "the running executable"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.to_path_buf());
        if let Some(up) = dir.parent() {
            candidates.push(up.to_path_buf());
        }
    }
    let dir = candidates
        .iter()
        .find(|d| has_all(d))
        .cloned()
        .ok_or_else(|| missing(candidates.first().map_or(Path::new("."), |p| p)))?;
    fresh(dir)
}

/// A source file newer than `dir/<binary>`, among those cargo's dep-info
/// beside it (`<binary>.d`, written with every build) says it was built
/// from: then `cargo test -p e2e`, which builds only the e2e crate's own
/// binaries, would test an old driver. `None` when the binary is current,
/// or when there is no dep-info to tell (binaries copied elsewhere).
fn newer_source(dir: &Path, binary: &str) -> Option<PathBuf> {
    let built = std::fs::metadata(dir.join(binary)).ok()?.modified().ok()?;
    let dep_info = std::fs::read_to_string(dir.join(format!("{binary}.d"))).ok()?;
    dep_info_sources(&dep_info).into_iter().find(|source| {
        std::fs::metadata(source)
            .and_then(|m| m.modified())
            .is_ok_and(|changed| changed > built)
    })
}

/// The prerequisites of the first rule of a Makefile-style dep-info file
/// (`target: a.rs b.rs`, a space in a name escaped as `\ `).
fn dep_info_sources(dep_info: &str) -> Vec<PathBuf> {
    let Some(first) = dep_info.lines().next() else {
        return Vec::new();
    };
    let Some((_, prerequisites)) = first.split_once(": ") else {
        return Vec::new();
    };
    let mut sources = Vec::new();
    let mut current = String::new();
    let mut chars = prerequisites.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                current.push(' ');
                chars.next();
            }
            ' ' => {
                if !current.is_empty() {
                    sources.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        sources.push(PathBuf::from(current));
    }
    sources
}

/// A loopback port for a driver's metrics endpoint (see [`local_cluster::ports`]).
pub fn free_port() -> Result<u16> {
    local_cluster::ports::reserve(std::net::IpAddr::from([127, 0, 0, 1]), &|_| false)
}

/// A plain HTTP/1.0 GET on loopback; the body on a 200.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    match http_get_status(addr, path)? {
        (200, body) => Ok(body),
        (status, _) => Err(Error::Testbed(format!(
            "GET http://{addr}{path}: status {status}"
        ))),
    }
}

/// A plain HTTP/1.0 GET on loopback: the status code and the body, whatever
/// the status (a `/readyz` that says why it is not ready answers 503).
pub fn http_get_status(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let fail = |m: String| Error::Testbed(format!("GET http://{addr}{path}: {m}"));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| fail(e.to_string()))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| fail(e.to_string()))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| fail(e.to_string()))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| fail("no header end".into()))?;
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| fail(format!("no status in {status_line:?}")))?;
    Ok((status, body.to_string()))
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    repo_root().join("examples")
}

/// File names in `dir` on this machine, sorted; none when it does not exist.
pub fn list_dir(dir: &Path) -> Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            Ok(names)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io("listing", dir)(e)),
    }
}

/// The file at `path` on this machine; `None` when it does not exist.
pub fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("reading", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_of_this_process_is_known() {
        assert!(rss_kib(std::process::id() as i32).unwrap() > 0);
    }

    #[test]
    fn dep_info_prerequisites_with_escaped_spaces() {
        let text =
            "/t/debug/efa-driver: /r/src/main.rs /r/my\\ dir/lib.rs  /r/proto\n\n/r/src/main.rs:\n";
        assert_eq!(
            dep_info_sources(text),
            [
                PathBuf::from("/r/src/main.rs"),
                PathBuf::from("/r/my dir/lib.rs"),
                PathBuf::from("/r/proto"),
            ]
        );
        assert!(dep_info_sources("").is_empty());
    }

    /// A source changed after the build makes the binary stale; one changed
    /// before it, or a binary without dep-info, does not.
    #[test]
    fn a_binary_older_than_a_listed_source_is_stale() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (old, new) = (dir.path().join("old.rs"), dir.path().join("new.rs"));
        let binary = dir.path().join("efa-driver");
        let at = |path: &Path, secs: u64| {
            let file = std::fs::File::create(path).expect("create");
            file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(secs))
                .expect("set mtime");
        };
        at(&old, 1_000);
        at(&binary, 2_000);
        at(&new, 3_000);
        assert_eq!(newer_source(dir.path(), "efa-driver"), None, "no dep-info");
        let rule = |sources: &[&Path]| {
            let list: Vec<String> = sources.iter().map(|p| p.display().to_string()).collect();
            std::fs::write(
                dir.path().join("efa-driver.d"),
                format!("{}: {}\n", binary.display(), list.join(" ")),
            )
            .expect("dep-info");
        };
        rule(&[&old]);
        assert_eq!(newer_source(dir.path(), "efa-driver"), None);
        rule(&[&old, &new]);
        assert_eq!(newer_source(dir.path(), "efa-driver"), Some(new.clone()));
    }
}
