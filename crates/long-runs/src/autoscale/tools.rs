//! Building the two Go programs the Karpenter run starts beside the local
//! cluster, from the module proxy, pinned by wrapper modules:
//!
//! - `e2e/go/karpenter`: Karpenter's kwok cloud provider with our templates
//!   attached to its instance types (`main.go` there; Karpenter itself is
//!   `sigs.k8s.io/karpenter`, required at the version of its `go.mod`);
//! - `e2e/go/kwok`: the KWOK controller (`sigs.k8s.io/kwok/cmd/kwok`), which
//!   keeps the Nodes the kwok provider creates Ready and plays their pods.
//!
//! Each is built with `local_cluster::go_build::build_set` into
//! `<cache>/bin/<name>-<version>` (stamped: rebuilt only when its go.mod,
//! go.sum or the Go toolchain changes), then the Go build cache is emptied
//! as after every build of ours. The module sources stay in
//! `<cache>/go/mod`, where the run also reads Karpenter's CRDs and KWOK's
//! stages.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use local_cluster::go_build::{self, GoTarget, GoToolchain, Progress};
use local_cluster::paths::{cache_root, repo_root};

/// What the run needs of the two modules.
#[derive(Debug, Clone)]
pub struct Tools {
    /// Our main with Karpenter's kwok provider.
    pub karpenter: PathBuf,
    pub karpenter_version: String,
    /// `sigs.k8s.io/karpenter` in the module cache (its CRDs).
    pub karpenter_source: PathBuf,
    pub kwok: PathBuf,
    pub kwok_version: String,
    /// `sigs.k8s.io/kwok` in the module cache (its stages).
    pub kwok_source: PathBuf,
}

/// The version `go_mod` requires of `module` (`require <module> vX` or a
/// line of a `require (...)` block).
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim().trim_start_matches("require").trim();
        let mut words = line.split_whitespace();
        (words.next() == Some(module))
            .then(|| words.next().map(str::to_string))
            .flatten()
    })
}

/// Builds (or finds up to date) both programs.
pub fn build(progress: &mut Progress) -> Result<Tools> {
    let root = repo_root();
    let (karpenter, karpenter_version, karpenter_source) = build_one(
        &root.join("e2e/go/karpenter"),
        "sigs.k8s.io/karpenter",
        "karpenter-kwok",
        ".",
        progress,
    )?;
    let (kwok, kwok_version, kwok_source) = build_one(
        &root.join("e2e/go/kwok"),
        "sigs.k8s.io/kwok",
        "kwok",
        "sigs.k8s.io/kwok/cmd/kwok",
        progress,
    )?;
    Ok(Tools {
        karpenter,
        karpenter_version,
        karpenter_source,
        kwok,
        kwok_version,
        kwok_source,
    })
}

/// The wrapper module's own Go files, names and contents, for the build's
/// stamp: the stamp covers `go.mod` and `go.sum`, and an edit of our
/// `main.go` must rebuild the program too.
fn our_sources(module_dir: &Path) -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(module_dir)
        .with_context(|| format!("listing {}", module_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "go"))
        .collect();
    files.sort();
    let mut key = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        key.push_str(&format!("{name}\0{text}\0"));
    }
    Ok(key)
}

/// Builds `package` of the wrapper module at `module_dir` (which requires
/// `module`) into `<cache>/bin/<binary>-<version>`, empties the Go build
/// cache, and returns the binary, the version and the module's source in
/// the module cache. Also the LeaderWorkerSet run's build (`crate::lws`).
pub fn build_one(
    module_dir: &Path,
    module: &str,
    binary: &'static str,
    package: &str,
    progress: &mut Progress,
) -> Result<(PathBuf, String, PathBuf)> {
    let go_mod = module_dir.join("go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .with_context(|| format!("reading {}", go_mod.display()))?;
    let version = required_version(&text, module)
        .with_context(|| format!("{} does not require {module}", go_mod.display()))?;
    let go = GoToolchain::for_module(module_dir)?;
    let out_dir = cache_root().join("bin").join(format!("{binary}-{version}"));
    go_build::build_set(
        &go,
        &format!("{binary} {version}"),
        module_dir,
        &out_dir,
        &[GoTarget {
            name: binary,
            package: package.to_string(),
            cgo: false,
            ldflags: "-s -w".into(),
            tags: String::new(),
        }],
        &our_sources(module_dir)?,
        progress,
    )?;
    go_build::prune_build_cache(&go, progress);
    let source = cache_root()
        .join("go/mod")
        .join(format!("{module}@{version}"));
    if !source.is_dir() {
        anyhow::bail!(
            "{} was built but its source is not at {} (GOMODCACHE moved?)",
            binary,
            source.display()
        );
    }
    Ok((out_dir.join(binary), version, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_of_our_go_source_changes_the_build_key() {
        let dir = std::env::temp_dir().join(format!("aws-dra-our-sources-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("go.mod"), "module x\n").unwrap();
        std::fs::write(dir.join("main.go"), "package main\n").unwrap();
        let before = our_sources(&dir).unwrap();
        assert!(before.contains("main.go"));
        assert!(
            !before.contains("module x"),
            "go.mod is in the stamp already"
        );
        std::fs::write(dir.join("main.go"), "package main\n// edited\n").unwrap();
        let after = our_sources(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_ne!(after, before);
    }

    #[test]
    fn required_version_reads_single_lines_and_blocks() {
        let single = "module x\n\ngo 1.26\n\nrequire sigs.k8s.io/karpenter v1.14.1\n";
        assert_eq!(
            required_version(single, "sigs.k8s.io/karpenter").as_deref(),
            Some("v1.14.1")
        );
        let block = "require (\n\tsigs.k8s.io/kwok v0.8.0 // indirect\n\tsigs.k8s.io/kwokx v9\n)\n";
        assert_eq!(
            required_version(block, "sigs.k8s.io/kwok").as_deref(),
            Some("v0.8.0")
        );
        assert_eq!(required_version(block, "sigs.k8s.io/karpenter"), None);
    }

    #[test]
    fn the_committed_wrapper_modules_pin_both_programs() {
        for (dir, module) in [
            ("e2e/go/karpenter", "sigs.k8s.io/karpenter"),
            ("e2e/go/kwok", "sigs.k8s.io/kwok"),
        ] {
            let text = std::fs::read_to_string(repo_root().join(dir).join("go.mod")).unwrap();
            let v = required_version(&text, module).unwrap_or_default();
            assert!(v.starts_with('v'), "{dir}/go.mod: {module} at {v:?}");
        }
    }
}
