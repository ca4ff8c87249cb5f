//! Free disk against what the README's commands write, so that a contributor
//! learns before the first build, not 28 minutes into it, that the disk will
//! fill (issue 53: kind's image load failed with "no space left on device"
//! on a machine with about 92 GB for us).
//!
//! The figures are issue 53's measurement (below); what the machine already
//! holds counts as written: the target directory's and Docker's current
//! size, and every Kubernetes release whose binaries are cached (it is not
//! built again, so it needs no Go build cache). The result is a warning,
//! never an error: the figures are upper bounds from one machine, and a
//! warm machine needs less than a fresh one.
//!
//! Free space comes from `df -Pk` (xtask has no libc binding for statvfs);
//! what is there from `du -sk`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use local_cluster::versions::{CI_RELEASES, MAIN_MINOR, Release};

const GIB: u64 = 1 << 30;

// Issue 53's measurement (`du -sh`), on a fresh 2-core machine after the
// README's two commands (`cargo xtask demo`, `cargo xtask ci`) and `cargo
// xtask e2e --cluster kind`: the target directory 24 GB (22 GB of it debug
// builds), Go's build cache 19 GB (the three releases CI builds), Docker
// 30 GB (kind). The per-command split below is derived from those totals,
// not measured command by command.

/// The whole target directory: `ci` builds debug (clippy, tests, rustdoc of
/// the workspace), release (the image's binaries, kubectl-dra) and the fuzz
/// targets, everything `demo` builds among them.
const TARGET_CI: u64 = 24 * GIB;
/// The debug builds, an upper bound for `demo` and kind (which build debug
/// binaries on the host; kind's release compile happens inside Docker): it
/// includes `ci`'s builds of the whole workspace, which they do not make.
const TARGET_DEBUG: u64 = 22 * GIB;
/// Go's build cache while a Kubernetes release builds: a third of what three
/// releases left (etcd, containerd and helm share it, and for kind kubeadm,
/// kube-proxy, CoreDNS and kind itself; none of them measured apart). It is
/// emptied once a release's binaries are cached
/// (`local_cluster::go_build::prune_build_cache`), so releases built one
/// after another need it once.
const GO_BUILD_PEAK: u64 = 19 * GIB / 3;
/// Go's modules and the binaries built of one release. Measured on this
/// 2-core machine, not in issue 53: 2.8 GiB of modules (0.25 of it the Go
/// 1.27 toolchain) and 0.5 GiB of binaries once 1.37 and 1.34, etcd and
/// containerd were built.
const GO_MODULES_AND_BINARIES_PER_RELEASE: u64 = 3 * GIB / 2;
/// Docker after a kind run: eight nodes each holding 1.2 GB of loaded
/// images, 8.5 GB of build cache (`crate::docker::prune_build_cache` now
/// removes most of it: an upper bound), and the images built.
const DOCKER_KIND: u64 = 30 * GIB;

/// A command whose disk use is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workload {
    Demo,
    Ci,
    Kind,
}

impl Workload {
    pub(crate) const ALL: [Workload; 3] = [Workload::Demo, Workload::Ci, Workload::Kind];

    fn command(self) -> &'static str {
        match self {
            Workload::Demo => "cargo xtask demo",
            Workload::Ci => "cargo xtask ci",
            Workload::Kind => "cargo xtask e2e --cluster kind",
        }
    }

    /// The Kubernetes minors it builds.
    fn minors(self) -> Vec<u32> {
        match self {
            Workload::Ci => CI_RELEASES.to_vec(),
            Workload::Demo | Workload::Kind => vec![MAIN_MINOR],
        }
    }

    fn target(self) -> u64 {
        match self {
            Workload::Ci => TARGET_CI,
            Workload::Demo | Workload::Kind => TARGET_DEBUG,
        }
    }

    fn docker(self) -> u64 {
        match self {
            Workload::Kind => DOCKER_KIND,
            Workload::Demo | Workload::Ci => 0,
        }
    }
}

/// Where the commands write on this machine, and what is there already.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    /// The cargo target directory.
    pub(crate) target: PathBuf,
    /// Bytes in it now.
    pub(crate) target_used: u64,
    /// `~/.cache/aws-dra` (Go's module and build caches, built binaries).
    pub(crate) cache: PathBuf,
    /// Docker's root directory.
    pub(crate) docker: PathBuf,
    /// Bytes in it now.
    pub(crate) docker_used: u64,
    /// The Kubernetes minors whose binaries are cached.
    pub(crate) built: Vec<u32>,
}

impl Machine {
    pub(crate) fn current() -> Machine {
        let target = crate::ci::target_dir::resolve();
        let docker = docker_root();
        let built = CI_RELEASES
            .iter()
            .copied()
            .filter(|&minor| {
                Release::for_minor(minor)
                    .is_ok_and(|r| local_cluster::toolchain::Binaries::locate(&r.version()).is_ok())
            })
            .collect();
        Machine {
            target_used: used(&target, false),
            docker_used: used(&docker, true),
            target,
            cache: local_cluster::toolchain::cache_root(),
            docker,
            built,
        }
    }
}

/// Seconds a probe (`docker info`, `du`) may take: an engine that does not
/// answer or a slow disk makes the check give up, not the doctor hang.
const PROBE_SECONDS: &str = "60";

/// Docker's root directory: the engine's answer when one runs, else the
/// default (Debian's docker.io, which `crate::docker` installs).
fn docker_root() -> PathBuf {
    Command::new("timeout")
        .args([
            PROBE_SECONDS,
            "docker",
            "info",
            "--format",
            "{{.DockerRootDir}}",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| d.starts_with('/'))
        .map_or_else(|| PathBuf::from("/var/lib/docker"), PathBuf::from)
}

/// Bytes under `path` (`du -sk`; `one_fs`: not into other filesystems, such
/// as the overlay mounts of running containers); 0 when it does not exist,
/// cannot be read or takes longer than [`PROBE_SECONDS`].
fn used(path: &Path, one_fs: bool) -> u64 {
    if !path.exists() {
        return 0;
    }
    let out = Command::new("timeout")
        .args([PROBE_SECONDS, "du", if one_fs { "-skx" } else { "-sk" }])
        .arg(path)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    // A file removed while du walks (a build beside it) makes it fail; its
    // total is still printed.
    out.ok()
        .and_then(|o| parse_du(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or(0)
}

/// Bytes of `du -sk`'s last line (`12345\t/path`).
fn parse_du(out: &str) -> Option<u64> {
    let kib: u64 = out
        .lines()
        .last()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A filesystem as `df -P` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Filesystem {
    mount: String,
    available: u64,
}

/// The filesystems of `df -Pk`'s answer, one per path asked for, in order.
/// The capacity field (`20%`) anchors each line: the available 1024-byte
/// blocks come before it, the mount point (which may hold spaces) after.
fn parse_df(out: &str) -> Option<Vec<Filesystem>> {
    out.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = (4..fields.len()).find(|&i| {
                fields[i].ends_with('%')
                    && fields[i - 3..i].iter().all(|f| f.parse::<u64>().is_ok())
            })?;
            Some(Filesystem {
                available: fields[at - 1].parse::<u64>().ok()? * 1024,
                mount: fields[at + 1..].join(" "),
            })
        })
        .collect()
}

/// The filesystem of each path (the nearest directory that exists: a
/// directory is created where its parent is).
fn filesystems(paths: &[&Path]) -> Result<Vec<Filesystem>, String> {
    let existing: Vec<&Path> = paths
        .iter()
        .map(|p| p.ancestors().find(|a| a.exists()).unwrap_or(Path::new("/")))
        .collect();
    let out = Command::new("df")
        .arg("-Pk")
        .args(&existing)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("df did not start: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "df failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_df(&String::from_utf8_lossy(&out.stdout))
        .filter(|f| f.len() == paths.len())
        .ok_or_else(|| "df's answer was not understood".to_string())
}

/// What a workload still has to write in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Share {
    path: PathBuf,
    bytes: u64,
    /// What it is, for the message.
    what: String,
}

/// The workload's shares on `machine`, less what is there already; places
/// with nothing left to write are left out.
fn shares(workload: Workload, machine: &Machine) -> Vec<Share> {
    let mut out = Vec::new();
    let target = workload.target().saturating_sub(machine.target_used);
    out.push(Share {
        path: machine.target.clone(),
        bytes: target,
        what: format!("target dir {}", gib(target)),
    });
    let unbuilt: Vec<String> = workload
        .minors()
        .into_iter()
        .filter(|m| !machine.built.contains(m))
        .map(|m| format!("1.{m}"))
        .collect();
    let go = go_caches(unbuilt.len());
    out.push(Share {
        path: machine.cache.clone(),
        bytes: go,
        what: format!("Go caches {} for {}", gib(go), unbuilt.join(", ")),
    });
    let docker = workload.docker().saturating_sub(machine.docker_used);
    out.push(Share {
        path: machine.docker.clone(),
        bytes: docker,
        what: format!("Docker {}", gib(docker)),
    });
    out.retain(|s| s.bytes > 0);
    out
}

/// What building `releases` Kubernetes releases adds to the cache.
fn go_caches(releases: usize) -> u64 {
    if releases == 0 {
        return 0;
    }
    GO_BUILD_PEAK + GO_MODULES_AND_BINARIES_PER_RELEASE * releases as u64
}

/// One filesystem's verdict for a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    mount: String,
    available: u64,
    needed: u64,
    parts: Vec<String>,
}

impl Verdict {
    fn short(&self) -> bool {
        self.needed > self.available
    }
}

/// The shares summed per filesystem (`filesystems[i]` holds `shares[i]`),
/// in the order the filesystems first appear.
fn verdicts(shares: &[Share], filesystems: &[Filesystem]) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = Vec::new();
    for (share, fs) in shares.iter().zip(filesystems) {
        match out.iter_mut().find(|v| v.mount == fs.mount) {
            Some(v) => {
                v.needed += share.bytes;
                v.parts.push(share.what.clone());
            }
            None => out.push(Verdict {
                mount: fs.mount.clone(),
                available: fs.available,
                needed: share.bytes,
                parts: vec![share.what.clone()],
            }),
        }
    }
    out
}

/// `1.0 GiB`.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

/// The doctor's lines for `workload` with these verdicts: `ok` or
/// `WARNING`, one per filesystem it writes to.
fn lines(workload: Workload, verdicts: &[Verdict]) -> Vec<String> {
    if verdicts.is_empty() {
        return vec![format!(
            "ok       disk for `{}`: everything it writes is there already",
            workload.command()
        )];
    }
    verdicts
        .iter()
        .map(|v| {
            let head = format!(
                "disk for `{}`: {} has {} free, needs up to {} more ({})",
                workload.command(),
                v.mount,
                gib(v.available),
                gib(v.needed),
                v.parts.join(", ")
            );
            if v.short() {
                format!(
                    "WARNING  {head}: {} short; README.md \"Disk\" says what can be reclaimed",
                    gib(v.needed - v.available)
                )
            } else {
                format!("ok       {head}")
            }
        })
        .collect()
}

/// The disk lines of `workloads` on `machine`, each filesystem measured by
/// `df`.
fn report_on(
    machine: &Machine,
    workloads: &[Workload],
    df: impl Fn(&[&Path]) -> Result<Vec<Filesystem>, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for &w in workloads {
        let shares = shares(w, machine);
        let paths: Vec<&Path> = shares.iter().map(|s| s.path.as_path()).collect();
        let filesystems = if paths.is_empty() {
            Vec::new()
        } else {
            match df(&paths) {
                Ok(f) => f,
                Err(e) => {
                    out.push(format!(
                        "WARNING  disk for `{}` not checked: {e}",
                        w.command()
                    ));
                    continue;
                }
            }
        };
        out.extend(lines(w, &verdicts(&shares, &filesystems)));
    }
    out
}

/// The disk lines of `workloads` on this machine.
pub(crate) fn report(workloads: &[Workload]) -> Vec<String> {
    report_on(&Machine::current(), workloads, filesystems)
}

#[cfg(test)]
mod tests;
