//! The `kind` CLI, built from its Go module and cached (like `helm`).
//!
//! The version is pinned by the wrapper module `e2e/go/kind/go.mod` (with
//! its `go.sum`): every machine builds the same kind from the Go module
//! proxy, into `<cache>/kind/<version>/kind`, rebuilt only when missing or
//! when it reports another version. The module's source in the Go module
//! cache also provides the files of kind's base image that the offline node
//! image reuses ([`base_files`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Wrapper module, relative to the repository root.
const WRAPPER_DIR: &str = "e2e/go/kind";
/// The module whose main package is kind.
pub const KIND_MODULE: &str = "sigs.k8s.io/kind";

/// The kind version the wrapper pins (`require sigs.k8s.io/kind vX`).
pub fn pinned_version(go_mod: &str) -> Result<String> {
    local_cluster::go_build::required_version(go_mod, KIND_MODULE)
        .filter(|v| v.starts_with('v'))
        .with_context(|| format!("{WRAPPER_DIR}/go.mod does not require {KIND_MODULE}"))
}

fn go(wrapper: &Path) -> Command {
    let go_cache = local_cluster::toolchain::cache_root().join("go");
    let mut cmd = Command::new("go");
    cmd.current_dir(wrapper)
        .env("GOMODCACHE", go_cache.join("mod"))
        .env("GOCACHE", go_cache.join("build"))
        .env(
            "GOTOOLCHAIN",
            std::env::var("GOTOOLCHAIN").unwrap_or_else(|_| "local".into()),
        )
        .env("CGO_ENABLED", "0");
    cmd
}

/// `kind version` prints `kind v0.33.0 go1.26.8 linux/amd64`.
fn reported_version(binary: &Path) -> Option<String> {
    let out = Command::new(binary).arg("version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .map(str::to_owned)
}

/// Returns the path of a working kind of the pinned version, building it
/// first when the cache does not hold it.
pub fn ensure(repo_root: &Path) -> Result<PathBuf> {
    let wrapper = repo_root.join(WRAPPER_DIR);
    let go_mod = std::fs::read_to_string(wrapper.join("go.mod"))
        .with_context(|| format!("reading {}", wrapper.join("go.mod").display()))?;
    let version = pinned_version(&go_mod)?;
    let dir = local_cluster::toolchain::cache_root()
        .join("kind")
        .join(&version);
    let binary = dir.join("kind");
    if reported_version(&binary).as_deref() == Some(version.as_str()) {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!("kind.tmp.{}", std::process::id()));
    eprintln!(
        "==> kind: building {KIND_MODULE} {version} from the Go module proxy into {}",
        dir.display()
    );
    let started = Instant::now();
    // Held while the build uses the Go build cache (see `hold_build_cache`).
    let _hold = local_cluster::go_toolchain::hold_build_cache()?;
    let status = go(&wrapper)
        .args([
            "build",
            "-mod=readonly",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
        ])
        .arg(&tmp)
        .arg(KIND_MODULE)
        .status()
        .context("running `go build` (is a Go toolchain on PATH?)")?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!("building kind {version} failed ({status})");
    }
    std::fs::rename(&tmp, &binary)
        .with_context(|| format!("moving the new kind to {}", binary.display()))?;
    let reported = reported_version(&binary);
    if reported.as_deref() != Some(version.as_str()) {
        bail!("freshly built kind reports {reported:?}, want {version}");
    }
    eprintln!(
        "==> kind: built {version} in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(binary)
}

/// `images/base/files` of the pinned kind module (downloaded into the Go
/// module cache if needed): kind's node entrypoint, systemd units,
/// containerd config and kubelet drop-ins.
pub fn base_files(repo_root: &Path) -> Result<PathBuf> {
    let wrapper = repo_root.join(WRAPPER_DIR);
    let out = go(&wrapper)
        .args(["mod", "download", "-json", KIND_MODULE])
        .output()
        .context("running go mod download")?;
    if !out.status.success() {
        bail!(
            "go mod download {KIND_MODULE} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing go mod download -json")?;
    let dir = info["Dir"]
        .as_str()
        .map(PathBuf::from)
        .context("go mod download printed no Dir")?;
    let files = dir.join("images/base/files");
    if !files.join("usr/local/bin/entrypoint").is_file() {
        bail!("{} has no usr/local/bin/entrypoint", files.display());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_wrapper_pins_kind() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let go_mod = std::fs::read_to_string(root.join(WRAPPER_DIR).join("go.mod")).unwrap();
        assert_eq!(pinned_version(&go_mod).unwrap(), "v0.33.0");
        assert!(root.join(WRAPPER_DIR).join("go.sum").is_file());
        assert!(pinned_version("module m\n").is_err());
    }
}
