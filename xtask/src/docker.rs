//! The Docker engine of `cargo xtask e2e --cluster kind`, from the project.
//!
//! When no engine answers, [`ensure_engine`] installs Debian's `docker.io`
//! package (idempotent: skipped when `dockerd` is already there) and starts
//! `dockerd` in the background, its log under `<cache>/docker/dockerd.log`.
//! A machine whose engine already runs (systemd's, Docker Desktop's) is used
//! as it is. Builds go through BuildKit (the Dockerfile's cache mounts need
//! it): [`build_command`] picks a client that has it.
//!
//! Some sandboxes withhold capabilities from everything they run (this
//! machine lacks `CAP_SYS_RESOURCE`), while Docker's `--privileged`, which
//! kind's nodes use, asks runc for every capability the kernel has, and runc
//! fails ("unable to apply caps"). When xtask starts the engine on such a
//! host, it makes the default runtime a wrapper around runc
//! ([`runc_wrapper`]) that drops exactly the withheld capabilities from each
//! container's OCI config; an engine already running is used as it is.
//!
//! Limits: installing needs root and an apt-based host (Debian, Ubuntu);
//! elsewhere the message says to install Docker. The engine started here
//! outlives the run (as a system service would) and is reused by the next.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Why no Docker engine answers, or `None` when one does.
pub fn engine_unavailable() -> Option<String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .output()
    {
        Err(e) => Some(format!("`docker` could not be run ({e})")),
        Ok(out) if !out.status.success() => Some(format!(
            "no Docker engine answers ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Makes sure a Docker engine answers: installs `docker.io` with apt-get
/// when `dockerd` is missing, starts `dockerd` when it is not running.
pub fn ensure_engine() -> Result<()> {
    let Some(why) = engine_unavailable() else {
        // An engine xtask started earlier runs containers through the
        // wrapper: keep its script the one this xtask writes.
        let wrapper = wrapper_path();
        let withheld = withheld_capabilities();
        if wrapper.exists() && !withheld.is_empty() {
            write_wrapper(&wrapper, &withheld)?;
        }
        return Ok(());
    };
    eprintln!("==> docker: {why}; starting one");
    if !is_root() {
        bail!(
            "{why}, and installing or starting Docker needs root: start Docker yourself, \
             or run the same scenarios without it:\n\n    cargo xtask e2e --cluster local\n"
        );
    }
    if on_path("dockerd").is_none() {
        if on_path("apt-get").is_none() {
            bail!(
                "{why}, and this host has no apt-get to install Debian's docker.io: install Docker"
            );
        }
        let started = Instant::now();
        eprintln!("==> docker: apt-get install docker.io (Debian's package)");
        let status = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "docker.io"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get")?;
        if !status.success() {
            bail!("apt-get install docker.io failed ({status})");
        }
        eprintln!(
            "    docker.io installed in {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    let dockerd = on_path("dockerd").context("dockerd is still not on PATH after installing")?;
    let log_dir = local_cluster::toolchain::cache_root().join("docker");
    std::fs::create_dir_all(&log_dir)?;
    let log = log_dir.join("dockerd.log");
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    // Through a shell that first closes every inherited descriptor above
    // stderr: the engine outlives this run, and must not keep a lock file
    // open that a caller holds (`flock <lock> cargo xtask e2e` passes its
    // locked descriptor down, and a dockerd holding it blocks every later
    // run that waits on the lock).
    // bash: dash cannot name descriptors above 9 in a redirection.
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        "for fd in /proc/$$/fd/*; do n=${fd##*/}; [ \"$n\" -gt 2 ] && eval \"exec $n>&-\"; done; exec \"$0\" \"$@\"",
    ])
    .arg(&dockerd);
    let withheld = withheld_capabilities();
    if !withheld.is_empty() {
        let wrapper = wrapper_path();
        write_wrapper(&wrapper, &withheld)?;
        eprintln!(
            "==> docker: this host withholds {}: containers run through {}",
            withheld.join(", "),
            wrapper.display()
        );
        cmd.arg("--add-runtime")
            .arg(format!("aws-dra-runc={}", wrapper.display()))
            .args(["--default-runtime", "aws-dra-runc"]);
    }
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    // Its own session, so that Ctrl-C on xtask leaves the engine (and the
    // cluster in it) running like a system service would.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
        .with_context(|| format!("starting {}", dockerd.display()))?;
    wait_for_engine(&log)
}

fn wrapper_path() -> PathBuf {
    local_cluster::toolchain::cache_root()
        .join("docker")
        .join("runc-wrapper")
}

fn write_wrapper(wrapper: &Path, withheld: &[String]) -> Result<()> {
    let runc = on_path("runc").context("runc is not installed (Debian's docker.io brings it)")?;
    if on_path("jq").is_none() {
        run(
            "apt-get install jq",
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "jq"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if let Some(dir) = wrapper.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = wrapper.with_extension("tmp");
    std::fs::write(&tmp, runc_wrapper(&runc, withheld))?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::rename(&tmp, wrapper)?;
    Ok(())
}

/// Capability names by number (`linux/capability.h`).
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// `CAP_*` names the kernel has (up to `last`) but `bounding` lacks.
pub fn missing_from(bounding: u64, last: usize) -> Vec<String> {
    CAPABILITIES
        .iter()
        .enumerate()
        .take(last + 1)
        .filter(|(bit, _)| bounding & (1u64 << bit) == 0)
        .map(|(_, name)| format!("CAP_{name}"))
        .collect()
}

/// The capabilities this process's bounding set lacks.
pub fn withheld_capabilities() -> Vec<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(bounding) = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    else {
        return Vec::new();
    };
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(CAPABILITIES.len() - 1);
    missing_from(bounding, last)
}

/// A runc that removes `withheld` from every capability set runc is about
/// to apply: the bundle's `config.json` (`create`/`run --bundle`) and the
/// process file of `exec --process` (`docker exec`); then runs `runc`.
///
/// Without `CAP_SYS_RESOURCE` a process may not lower its `oom_score_adj`
/// below what it inherited, and runc's init fails before the container
/// starts ("can't get final child's PID from pipe: EOF"). The kubelet asks
/// for -998 for every critical pod's sandbox (kind's control plane is all
/// critical pods), so when that capability is withheld the wrapper also
/// raises a bundle's `process.oomScoreAdj` to its own value.
pub fn runc_wrapper(runc: &Path, withheld: &[String]) -> String {
    let list = withheld
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(",");
    let drop = format!("with_entries(.value |= map(select(. as $c | [{list}] | index($c) | not)))");
    let oom = if withheld.iter().any(|c| c == "CAP_SYS_RESOURCE") {
        " | if (.process.oomScoreAdj // $min) < $min then .process.oomScoreAdj = $min else . end"
    } else {
        ""
    };
    format!(
        "#!/bin/sh\n\
         # Written by cargo xtask (xtask/src/docker.rs): this host withholds {names}.\n\
         min=$(cat /proc/self/oom_score_adj)\n\
         filter() {{ jq -c --argjson min \"$min\" \"$1\" \"$2\" > \"$2.aws-dra\" && mv \"$2.aws-dra\" \"$2\"; }}\n\
         prev=\n\
         for a in \"$@\"; do\n\
         \x20 case \"$prev\" in\n\
         \x20   --bundle|-b) [ -f \"$a/config.json\" ] && filter '(if .process.capabilities then .process.capabilities |= {drop} else . end){oom}' \"$a/config.json\" ;;\n\
         \x20   --process|-p) [ -f \"$a\" ] && filter 'if .capabilities then .capabilities |= {drop} else . end' \"$a\" ;;\n\
         \x20 esac\n\
         \x20 prev=\"$a\"\n\
         done\n\
         exec {runc} \"$@\"\n",
        names = withheld.join(" "),
        runc = runc.display(),
    )
}

fn wait_for_engine(log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match engine_unavailable() {
            None => {
                eprintln!("==> docker: engine up (log: {})", log.display());
                return Ok(());
            }
            Some(why) if Instant::now() > deadline => {
                bail!(
                    "dockerd did not answer within 60 s ({why}); see {}",
                    log.display()
                )
            }
            Some(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A `docker build` with BuildKit: the `docker` on PATH when it has buildx
/// (Docker 23+ builds with BuildKit only through it), else Debian's 20.10
/// client (`/usr/bin/docker`), which has BuildKit built in.
pub fn build_command() -> Result<Command> {
    let has_buildx = Command::new("docker")
        .args(["buildx", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let client = if has_buildx {
        PathBuf::from("docker")
    } else if Path::new("/usr/bin/docker").is_file() {
        PathBuf::from("/usr/bin/docker")
    } else {
        bail!(
            "the docker client on PATH has no buildx plugin, which `docker build` needs for \
             BuildKit (the Dockerfile's cache mounts): install docker-buildx"
        );
    };
    let mut cmd = Command::new(client);
    cmd.env("DOCKER_BUILDKIT", "1").arg("build");
    Ok(cmd)
}

/// The kinds of BuildKit cache record [`prune_build_cache`] removes: the
/// layers of finished builds (`regular`) and the copies of their build
/// contexts (`source.local`: the node image's context holds the Kubernetes
/// binaries, the Rust base image's the whole host toolchain). Kept: the
/// Dockerfile's cache mounts (`exec.cachemount`: cargo's registry and
/// `target/`), which make the next driver image build incremental instead of
/// a cold release compile. The node and base images are found again by
/// their tags, so a later run reuses none of their records; the driver
/// image's layers are built again, its compile incremental through the kept
/// cache mounts. A kind run left 8.5 GB of
/// build cache (issue 53); how much of it the cache mounts were was not
/// measured.
pub const PRUNED_BUILD_CACHE: [&str; 2] = ["regular", "source.local"];

/// `docker builder prune` of one kind of record (the engine's API takes one
/// value per filter). Records an image still uses are kept by the engine.
fn prune_args(record_type: &str) -> Vec<String> {
    vec![
        "builder".into(),
        "prune".into(),
        "--force".into(),
        "--filter".into(),
        format!("type={record_type}"),
    ]
}

/// Removes the build cache of [`PRUNED_BUILD_CACHE`], printing what each
/// prune reclaimed. Reclaiming space is not worth failing a run for: a
/// prune that fails is reported and the run goes on.
pub fn prune_build_cache() {
    for record_type in PRUNED_BUILD_CACHE {
        let what = format!("docker builder prune (type={record_type})");
        match output(&what, Command::new("docker").args(prune_args(record_type))) {
            Ok(out) => {
                let reclaimed = out
                    .lines()
                    .find(|l| l.starts_with("Total"))
                    .unwrap_or("nothing to reclaim");
                eprintln!("==> {what}: {}", reclaimed.trim());
            }
            Err(e) => eprintln!("==> {what}: {e:#} (build cache kept)"),
        }
    }
}

/// Whether the engine holds `image`.
pub fn has_image(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd`, failing with `what` in the message.
pub fn run(what: &str, cmd: &mut Command) -> Result<()> {
    let started = Instant::now();
    eprintln!("==> {what}");
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    eprintln!("    {what}: {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs `cmd` and returns its stdout.
pub fn output(what: &str, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prune_keeps_the_cargo_cache_mounts() {
        assert!(!PRUNED_BUILD_CACHE.contains(&"exec.cachemount"));
        assert_eq!(
            prune_args("regular"),
            ["builder", "prune", "--force", "--filter", "type=regular"]
        );
        // Without `--all`: records an image still shares stay.
        assert!(!prune_args("source.local").iter().any(|a| a == "--all"));
    }

    #[test]
    fn withheld_capabilities_are_named_by_bit() {
        // This machine's bounding set: everything but bit 24.
        assert_eq!(
            missing_from(0x1ff_ffff_ffff & !(1 << 24), 40),
            ["CAP_SYS_RESOURCE"]
        );
        assert!(missing_from(0x1ff_ffff_ffff, 40).is_empty());
        // Bits above the kernel's last capability do not count.
        assert!(missing_from(0xff_ffff_ffff, 39).is_empty());
    }

    #[test]
    fn the_runc_wrapper_filters_the_bundle_config_and_execs_runc() {
        let w = runc_wrapper(Path::new("/usr/sbin/runc"), &["CAP_SYS_RESOURCE".into()]);
        assert!(w.starts_with("#!/bin/sh\n"), "{w}");
        assert!(w.contains("[\"CAP_SYS_RESOURCE\"]"), "{w}");
        assert!(w.contains("--bundle|-b)"), "{w}");
        assert!(w.contains("--process|-p)"), "{w}");
        assert!(w.trim_end().ends_with("exec /usr/sbin/runc \"$@\""), "{w}");
        // The kubelet's -998 for critical pods needs CAP_SYS_RESOURCE.
        assert!(w.contains(".process.oomScoreAdj = $min"), "{w}");
        let other = runc_wrapper(Path::new("/usr/sbin/runc"), &["CAP_BPF".into()]);
        assert!(!other.contains("oomScoreAdj"), "{other}");
    }
}
