//! The local base images of the offline kind run (see `crate::kind_images`):
//!
//! - [`DEBIAN_IMAGE`]: Debian 12 (`debootstrap --variant=minbase` from the
//!   machine's Debian mirror, trusting the host's local certificate
//!   authorities, then `docker import`): the base of the other local images
//!   and the Dockerfile's runtime base in place of distroless/cc (glibc and
//!   libgcc_s, as the drivers need);
//! - [`rust_image`]: that plus gcc and the host's Rust toolchain: the
//!   Dockerfile's build base in place of `rust:<version>-bookworm`.
//!
//! Each is built once and found again by its tag (`docker image rm` forces
//! a rebuild).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::docker;

/// Debian 12 from debootstrap.
pub const DEBIAN_IMAGE: &str = "aws-dra-local/debian:bookworm";

fn work_root() -> PathBuf {
    local_cluster::toolchain::cache_root().join("kind-images")
}

/// The Debian mirror `debootstrap` and the images' apt use.
fn debian_mirror() -> String {
    std::env::var("AWS_DRA_DEBIAN_MIRROR").unwrap_or_else(|_| "http://deb.debian.org/debian".into())
}

fn sh(what: &str, script: &str) -> Result<()> {
    docker::run(what, Command::new("sh").args(["-ec", script]))
}

/// Builds [`DEBIAN_IMAGE`] unless the engine has it.
pub fn ensure_debian() -> Result<()> {
    if docker::has_image(DEBIAN_IMAGE) {
        return Ok(());
    }
    let started = Instant::now();
    if Command::new("debootstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        sh(
            "apt-get install debootstrap",
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap",
        )?;
    }
    let work = work_root();
    std::fs::create_dir_all(&work)?;
    let rootfs = work.join("debian-rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    let rootfs_s = rootfs.to_str().context("cache path is not UTF-8")?;
    let mirror = debian_mirror();
    sh(
        "debootstrap bookworm (minbase)",
        &format!(
            "debootstrap --variant=minbase --include=ca-certificates bookworm '{rootfs_s}' '{mirror}'"
        ),
    )?;
    // The host's mirror may serve a frozen snapshot whose Release files have
    // expired: apt in the images accepts them as the host's apt does.
    std::fs::write(
        rootfs.join("etc/apt/apt.conf.d/99aws-dra-snapshot"),
        "Acquire::Check-Valid-Until \"false\";\nAcquire::Check-Date \"false\";\n",
    )?;
    // Certificate authorities this host added (a TLS-inspecting proxy's,
    // say) are trusted inside too, or cargo and apt in the images could not
    // reach what the host reaches.
    let local_cas = Path::new("/usr/local/share/ca-certificates");
    if local_cas.is_dir() {
        sh(
            "trusting the host's local certificate authorities",
            &format!(
                "cp -rT {} '{rootfs_s}/usr/local/share/ca-certificates' \
                 && chroot '{rootfs_s}' update-ca-certificates",
                local_cas.display()
            ),
        )?;
    }
    sh(
        "docker import (Debian rootfs)",
        &format!(
            "rm -rf '{rootfs_s}'/var/cache/apt/archives/*.deb '{rootfs_s}'/var/lib/apt/lists/*; \
             tar -C '{rootfs_s}' -c . | docker import --change 'CMD [\"/bin/bash\"]' - {DEBIAN_IMAGE}"
        ),
    )?;
    std::fs::remove_dir_all(&rootfs)?;
    eprintln!(
        "    {DEBIAN_IMAGE}: built in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The host toolchain `rustc` runs from, and its version (`1.95.0`).
fn host_toolchain() -> Result<(PathBuf, String)> {
    let sysroot = docker::output(
        "rustc --print sysroot",
        Command::new("rustc").args(["--print", "sysroot"]),
    )?;
    let version = docker::output("rustc --version", Command::new("rustc").arg("--version"))?;
    let version = version
        .split_whitespace()
        .nth(1)
        .context("rustc --version printed no version")?
        .to_string();
    let sysroot = PathBuf::from(sysroot.trim());
    let sysroot = sysroot.canonicalize().unwrap_or(sysroot);
    Ok((sysroot, version))
}

/// The build base of the Dockerfile: tag of the host's Rust version.
pub fn rust_image() -> Result<String> {
    Ok(format!(
        "aws-dra-local/rust:{}-bookworm",
        host_toolchain()?.1
    ))
}

/// Builds [`rust_image`] unless the engine has it: Debian, gcc (the linker
/// and the C parts of `ring`), and the host's toolchain (its `bin` and
/// `lib`, documentation left out) at `/usr/local/rust`.
pub fn ensure_rust() -> Result<String> {
    let image = rust_image()?;
    if docker::has_image(&image) {
        return Ok(image);
    }
    ensure_debian()?;
    let (sysroot, _) = host_toolchain()?;
    let ctx = work_root().join("rust-context");
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx)?;
    }
    std::fs::create_dir_all(ctx.join("toolchain"))?;
    for part in ["bin", "lib"] {
        // Hard links when the cache shares the toolchain's file system.
        let status = Command::new("cp")
            .arg("-al")
            .arg(sysroot.join(part))
            .arg(ctx.join("toolchain"))
            .status()?;
        if !status.success() {
            docker::run(
                "copying the Rust toolchain",
                Command::new("cp")
                    .arg("-a")
                    .arg(sysroot.join(part))
                    .arg(ctx.join("toolchain")),
            )?;
        }
    }
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM {DEBIAN_IMAGE}\n\
             RUN apt-get update \\\n \
             && apt-get install -y --no-install-recommends gcc libc6-dev \\\n \
             && rm -rf /var/lib/apt/lists/*\n\
             COPY toolchain/ /usr/local/rust/\n\
             ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             RUN cargo --version && rustc --version\n"
        ),
    )?;
    docker::run(
        &format!("docker build {image}"),
        docker::build_command()?.arg("-t").arg(&image).arg(&ctx),
    )?;
    std::fs::remove_dir_all(&ctx)?;
    Ok(image)
}
