//! The cargo target directory, as an absolute path, for what a CI step hands
//! to a test.
//!
//! `cargo test` runs each test binary in its package's directory
//! (`crates/kubectl-dra`), so a path relative to the workspace root, such as
//! `target/release/kubectl-dra`, names nothing there. Issue 53: `cargo xtask
//! ci` exactly as the README gives it (no `CARGO_TARGET_DIR`) failed all 9 of
//! kubectl-dra's command-line tests with "No such file or directory";
//! `.ci/run` sets an absolute `CARGO_TARGET_DIR`, so CI stayed green.
//!
//! Cargo says where it builds: `target_directory` of `cargo metadata`, which
//! follows `CARGO_TARGET_DIR`, `build.target-dir` of any config and the
//! default alike, and is always absolute. Only when cargo cannot answer does
//! this module apply cargo's rules itself ([`fallback`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The target directory of the cargo the steps run, from where xtask was
/// started (the steps inherit that directory and environment).
pub(crate) fn resolve() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| crate::paths::repo_root());
    resolve_with(
        crate::cargo_command::cargo(),
        std::env::var_os("CARGO_TARGET_DIR"),
        &cwd,
    )
}

/// [`resolve`] with the cargo to ask (its environment and directory set by
/// the caller), the `CARGO_TARGET_DIR` it sees, and its directory.
pub(crate) fn resolve_with(metadata: Command, env: Option<OsString>, cwd: &Path) -> PathBuf {
    match from_metadata(metadata) {
        Ok(dir) => cwd.join(dir),
        Err(e) => {
            let dir = fallback(env, cwd, &crate::paths::repo_root());
            eprintln!(
                "xtask: {e:#}; taking {} as the target directory",
                dir.display()
            );
            dir
        }
    }
}

fn from_metadata(mut cargo: Command) -> Result<PathBuf> {
    let out = cargo
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .stderr(std::process::Stdio::piped())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    target_directory(&out.stdout)
}

/// `target_directory` of `cargo metadata --format-version 1`'s answer.
pub(crate) fn target_directory(json: &[u8]) -> Result<PathBuf> {
    let v: serde_json::Value =
        serde_json::from_slice(json).context("cargo metadata's answer is not JSON")?;
    v["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata's answer has no target_directory")
}

/// Cargo's own rule without cargo: `CARGO_TARGET_DIR` relative to the
/// directory cargo runs in, else `target/` of the workspace (a
/// `build.target-dir` in a config file is only seen through cargo).
fn fallback(env: Option<OsString>, cwd: &Path, workspace: &Path) -> PathBuf {
    match env {
        Some(dir) if !dir.is_empty() => cwd.join(dir),
        _ => workspace.join("target"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_is_absolute_wherever_cargo_target_dir_points() {
        let (cwd, ws) = (Path::new("/w/crates/x"), Path::new("/w"));
        let table: [(Option<&str>, &str); 4] = [
            (None, "/w/target"),
            (Some(""), "/w/target"),
            (Some("out"), "/w/crates/x/out"),
            (Some("/abs/t"), "/abs/t"),
        ];
        for (env, want) in table {
            assert_eq!(
                fallback(env.map(OsString::from), cwd, ws),
                Path::new(want),
                "{env:?}"
            );
        }
    }

    #[test]
    fn target_directory_is_read_from_cargo_metadata() {
        let json = br#"{"packages":[],"target_directory":"/w/target","workspace_root":"/w"}"#;
        assert_eq!(target_directory(json).unwrap(), Path::new("/w/target"));
        assert!(target_directory(b"{}").is_err());
        assert!(target_directory(b"not json").is_err());
    }

    #[test]
    fn a_cargo_that_fails_falls_back_to_cargos_rule() {
        let dir = resolve_with(
            Command::new("false"),
            Some("rel".into()),
            Path::new("/somewhere"),
        );
        assert_eq!(dir, Path::new("/somewhere/rel"));
    }
}
