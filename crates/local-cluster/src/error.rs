//! The one error type of the crate: every variant names the file, process or
//! object it is about, so a failed end-to-end run says where to look.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}){}", tail_suffix(.output_tail))]
    CommandFailed {
        command: String,
        status: String,
        output_tail: String,
    },
    #[error("{what} is missing at {path}; run `cargo xtask k8s build`")]
    MissingBinary { what: String, path: PathBuf },
    #[error("go.mod at {path} pins {module} {found}, expected {expected}")]
    PinMismatch {
        path: PathBuf,
        module: String,
        found: String,
        expected: String,
    },
    #[error(
        "invalid Kubernetes version {text:?}: expected a release we have ({known}) as a minor \
         (1.37) or an exact version (v1.37.2, v1.38.0-beta.0)"
    )]
    BadVersion { text: String, known: String },
    #[error(
        "Kubernetes 1.{minor} has no table in crates/local-cluster/src/versions.rs (known: {known})"
    )]
    UnknownRelease { minor: u32, known: String },
    #[error("upstream go.mod {path} has no staging replace directives")]
    NoStagingReplaces { path: PathBuf },
    #[error("certificate {name}: {source}")]
    Certificate {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("encoding {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("no free TCP port on {addr}: {source}")]
    NoFreePort {
        addr: std::net::IpAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "process {name} (pid {pid}) exited early with {status}; log: {log}; its last lines:\n{tail}"
    )]
    ProcessExited {
        name: String,
        pid: i32,
        status: String,
        log: PathBuf,
        /// The log's last lines, so the error says why where only it is seen (CI).
        tail: String,
    },
    #[error("timed out after {after:?} waiting for {what}; logs: {logs}")]
    Timeout {
        what: String,
        after: Duration,
        logs: PathBuf,
    },
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("Kubernetes API {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("node name {0:?} is not a DNS label of at most 20 characters")]
    BadNodeName(String),
    #[error("host setup: {0}")]
    Host(String),
    #[error("manifest {what}: {message}")]
    Manifest { what: String, message: String },
    #[error("fixture: {0}")]
    Fixture(#[from] sysfs_fixtures::FixtureError),
    #[error("helm {args}: {message}")]
    Helm { args: String, message: String },
    #[error("{0}")]
    Testbed(String),
}

fn tail_suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!(":\n{tail}")
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for the common "I/O on this path" error.
pub fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}
