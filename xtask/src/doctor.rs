//! `cargo xtask doctor`: whether this machine has what the README's two
//! commands (`cargo xtask demo`, `cargo xtask ci`) need that the project does
//! not install itself, and for each thing missing, how to install it. `ci`
//! runs the same check as its first step, so a fresh machine learns every
//! missing tool at once, in seconds, instead of one at a time deep in a build.
//!
//! What the project installs itself (Kubernetes, etcd, containerd, runc and
//! the CNI plugins from Debian, helm, checkov) is not checked here, only what
//! those installs and the builds start from. The one network check, the
//! Python package index, runs only while checkov is not yet cached.
//!
//! It also compares free disk with what `demo`, `ci` and `e2e --cluster
//! kind` write, less what is there already ([`disk`]): a shortfall is a
//! warning, since the figures are upper bounds.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

mod disk;

/// What is checked, and how.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// `program args…` is on PATH and succeeds.
    Runs(&'static str, &'static [&'static str]),
    /// The C++ compiler `$CXX` names, or `c++`, answers `--version`.
    Cxx,
    /// Go at least this `(major, minor)`, found where the builds look for it
    /// (`$AWS_DRA_GO`, `/usr/local/go/bin/go`, PATH: the order of
    /// `local_cluster::go_build::GoToolchain::find`).
    GoAtLeast(u32, u32),
    /// python3 can import these modules.
    PythonModules(&'static str),
    /// The Python package index answers for checkov (unless it is cached).
    PackageIndex,
    /// Running as root.
    Root,
}

/// One prerequisite: its name, what needs it, the check, how to install it.
#[derive(Debug, Clone, Copy)]
struct Prerequisite {
    name: &'static str,
    needed_by: &'static str,
    check: Check,
    install: &'static str,
}

/// The highest `go` directive of the Go modules under `e2e/go` (1.26.0).
const GO_MIN: (u32, u32) = (1, 26);

/// Everything the README lists, in its order.
const PREREQUISITES: &[Prerequisite] = &[
    Prerequisite {
        name: "rustfmt",
        needed_by: "ci's fmt step",
        check: Check::Runs("rustfmt", &["--version"]),
        install: "rustup component add rustfmt",
    },
    Prerequisite {
        name: "clippy",
        needed_by: "ci's clippy steps",
        check: Check::Runs("cargo-clippy", &["--version"]),
        install: "rustup component add clippy",
    },
    Prerequisite {
        name: "Go",
        needed_by: "building Kubernetes, etcd, containerd and helm from their Go modules",
        check: Check::GoAtLeast(GO_MIN.0, GO_MIN.1),
        install: "install Go 1.26 or newer from https://go.dev/dl/ into /usr/local/go \
                  (or point AWS_DRA_GO at its bin/go)",
    },
    Prerequisite {
        name: "C compiler",
        needed_by: "the kubelet's cgo build",
        check: Check::Runs("cc", &["--version"]),
        install: "apt-get install -y gcc",
    },
    Prerequisite {
        name: "C++ compiler",
        needed_by: "ci's fuzz build (libFuzzer is C++)",
        check: Check::Cxx,
        install: "apt-get install -y g++ (or set CXX to another C++ compiler)",
    },
    Prerequisite {
        name: "python3 with venv",
        needed_by: "ci's chart scan (checkov is installed into a virtual environment)",
        check: Check::PythonModules("venv, ensurepip"),
        install: "apt-get install -y python3 python3-venv",
    },
    Prerequisite {
        name: "Python package index",
        needed_by: "installing checkov for the chart scan, the first time",
        check: Check::PackageIndex,
        install: "allow HTTPS to pypi.org, or set PIP_INDEX_URL to a mirror",
    },
    Prerequisite {
        name: "git",
        needed_by: "ci's checkout (.ci/run)",
        check: Check::Runs("git", &["--version"]),
        install: "apt-get install -y git",
    },
    Prerequisite {
        name: "apt-get",
        needed_by: "installing runc and the CNI plugins from Debian",
        check: Check::Runs("apt-get", &["--version"]),
        install: "run on Debian or Ubuntu, or install runc and containernetworking-plugins yourself",
    },
    Prerequisite {
        name: "ip",
        needed_by: "the local cluster's node addresses",
        check: Check::Runs("ip", &["-V"]),
        install: "apt-get install -y iproute2",
    },
    Prerequisite {
        name: "mount",
        needed_by: "the local cluster's kubelet directories",
        check: Check::Runs("mount", &["--version"]),
        install: "apt-get install -y mount",
    },
    Prerequisite {
        name: "root",
        needed_by: "kubelet and containerd (the demo and ci's e2e legs)",
        check: Check::Root,
        install: "run as root",
    },
];

/// What a check sees of the machine; the tests give their own.
pub(crate) struct Host {
    /// The PATH programs are looked up in.
    path: OsString,
    /// `$CXX`.
    cxx: Option<String>,
    /// `$AWS_DRA_GO`.
    go: Option<PathBuf>,
    /// Where Go is installed when `$AWS_DRA_GO` is not set.
    go_default: PathBuf,
    uid_is_root: bool,
    /// Whether checkov is already installed (then no index is needed).
    checkov_cached: bool,
}

impl Host {
    pub(crate) fn current() -> Host {
        let checkov_cached = crate::helm::cache_root().is_ok_and(|root| {
            root.join("checkov")
                .read_dir()
                .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("installed").is_file())))
        });
        Host {
            path: std::env::var_os("PATH").unwrap_or_default(),
            cxx: std::env::var("CXX").ok(),
            go: std::env::var_os("AWS_DRA_GO").map(PathBuf::from),
            go_default: PathBuf::from("/usr/local/go/bin/go"),
            uid_is_root: uid_is_root(),
            checkov_cached,
        }
    }

    /// `name` on this host's PATH (a path with a `/` as given).
    fn find(&self, name: &str) -> Option<PathBuf> {
        if name.contains('/') {
            return Some(PathBuf::from(name)).filter(|p| is_executable(p));
        }
        std::env::split_paths(&self.path)
            .map(|dir| dir.join(name))
            .find(|p| is_executable(p))
    }

    /// Runs `program args` from this host's PATH, with that PATH: its
    /// standard output when it succeeds.
    fn run(&self, program: &str, args: &[&str]) -> std::result::Result<String, String> {
        let found = self
            .find(program)
            .ok_or_else(|| format!("`{program}` is not on PATH"))?;
        let out = Command::new(&found)
            .args(args)
            .env("PATH", &self.path)
            .output()
            .map_err(|e| format!("`{}` did not start: {e}", found.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "`{program} {}` failed: {}",
                args.join(" "),
                err.lines().next().unwrap_or("").trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn uid_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `(major, minor)` of `go version`'s answer (`go version go1.26.8 linux/amd64`).
fn go_version(answer: &str) -> Option<(u32, u32)> {
    let v = answer.split_whitespace().nth(2)?.strip_prefix("go")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// What is wrong with `check` on `host`, if anything.
fn problem(check: Check, host: &Host) -> Option<String> {
    match check {
        Check::Runs(program, args) => host.run(program, args).err(),
        Check::Cxx => {
            let cxx = host.cxx.as_deref().unwrap_or("c++");
            host.run(cxx, &["--version"]).err()
        }
        Check::GoAtLeast(major, minor) => {
            let go = match &host.go {
                Some(go) => go.clone(),
                None if is_executable(&host.go_default) => host.go_default.clone(),
                None => match host.find("go") {
                    Some(go) => go,
                    None => {
                        return Some(format!(
                            "no Go: AWS_DRA_GO is not set, {} does not exist and `go` is not on PATH",
                            host.go_default.display()
                        ));
                    }
                },
            };
            let answer = match host.run(&go.to_string_lossy(), &["version"]) {
                Ok(answer) => answer,
                Err(e) => return Some(e),
            };
            match go_version(&answer) {
                Some(v) if v >= (major, minor) => None,
                Some((a, b)) => Some(format!(
                    "{} is Go {a}.{b}; the modules need {major}.{minor} or newer",
                    go.display()
                )),
                None => Some(format!("`{} version` said {answer:?}", go.display())),
            }
        }
        Check::PythonModules(modules) => host
            .run("python3", &["-c", &format!("import {modules}")])
            .err(),
        Check::PackageIndex => {
            if host.checkov_cached {
                return None;
            }
            // pip's own setting, else PyPI; 10 s is enough for one small page.
            let probe = "import os, urllib.request; urllib.request.urlopen(\
                         os.environ.get('PIP_INDEX_URL', 'https://pypi.org/simple').rstrip('/') \
                         + '/checkov/', timeout=10)";
            host.run("python3", &["-c", probe])
                .err()
                .map(|e| format!("the package index did not answer: {e}"))
        }
        Check::Root => (!host.uid_is_root).then(|| "not running as root".to_string()),
    }
}

/// One line per prerequisite: `ok` or what is missing and how to install it.
/// Returns the lines and the names of the missing ones.
fn report(host: &Host) -> (Vec<String>, Vec<&'static str>) {
    let mut lines = Vec::new();
    let mut missing = Vec::new();
    for p in PREREQUISITES {
        match problem(p.check, host) {
            None => lines.push(format!("ok       {}", p.name)),
            Some(why) => {
                missing.push(p.name);
                lines.push(format!(
                    "MISSING  {} (for {}): {why}\n         install: {}",
                    p.name, p.needed_by, p.install
                ));
            }
        }
    }
    (lines, missing)
}

/// Checks every prerequisite on this machine, and its free disk; fails
/// naming each missing prerequisite (a disk that looks short is a warning).
pub fn run() -> Result<()> {
    let prerequisites = check(&Host::current());
    for line in fetched_go_lines() {
        eprintln!("doctor: {line}");
    }
    for line in disk::report(&disk::Workload::ALL) {
        eprintln!("doctor: {line}");
    }
    prerequisites
}

/// One line per Go toolchain a Kubernetes release needs beyond the local
/// Go (1.38 asks for Go 1.27): which, and whether it is cached or will be
/// fetched through the Go module proxy on the first build.
fn fetched_go_lines() -> Vec<String> {
    use local_cluster::go_toolchain::{GO_TOOLCHAINS, cached, go_directive};
    let mut lines = Vec::new();
    for release in local_cluster::versions::RELEASES {
        let go_mod = crate::paths::repo_root()
            .join(release.module_dir())
            .join("go.mod");
        let Some((major, minor, _)) = std::fs::read_to_string(&go_mod)
            .ok()
            .as_deref()
            .and_then(go_directive)
        else {
            continue;
        };
        let wanted = format!("{major}.{minor}");
        if let Some((_, pinned)) = GO_TOOLCHAINS.iter().find(|(m, _)| *m == wanted) {
            let state = match cached(pinned) {
                Some(go) => format!("cached at {}", go.display()),
                None => "fetched through the Go module proxy on its first build".into(),
            };
            lines.push(format!(
                "Kubernetes 1.{} asks for Go {wanted}: it builds with {pinned}, {state} \
                 (a local Go that new is used instead)",
                release.minor
            ));
        }
    }
    lines
}

pub(crate) fn check(host: &Host) -> Result<()> {
    let (lines, missing) = report(host);
    for line in &lines {
        eprintln!("doctor: {line}");
    }
    if !missing.is_empty() {
        bail!(
            "missing: {} (README.md, \"Two commands\", lists what each is for)",
            missing.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
