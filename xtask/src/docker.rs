//! The Docker engine of `cargo xtask e2e --cluster kind`, from the project.
//!
//! When no engine answers, [`ensure_engine`] installs Debian's `docker.io`
//! package (idempotent: skipped when `dockerd` is already there) and starts
//! `dockerd` in the background, its log under `<cache>/docker/dockerd.log`.
//! A machine whose engine already runs (systemd's, Docker Desktop's) is used
//! as it is. Builds go through BuildKit (the Dockerfile's cache mounts need
//! it): [`build_command`] picks a client that has it.
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
            bail!("{why}, and this host has no apt-get to install Debian's docker.io: install Docker");
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
    let log_dir = e2e::toolchain::cache_root().join("docker");
    std::fs::create_dir_all(&log_dir)?;
    let log = log_dir.join("dockerd.log");
    let file = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&dockerd);
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

fn wait_for_engine(log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match engine_unavailable() {
            None => {
                eprintln!("==> docker: engine up (log: {})", log.display());
                return Ok(());
            }
            Some(why) if Instant::now() > deadline => {
                bail!("dockerd did not answer within 60 s ({why}); see {}", log.display())
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
