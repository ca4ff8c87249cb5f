//! Stand-ins for modules a Kubernetes release requires that the Go module
//! proxy lists but will not serve: directories of ours that the wrapper
//! modules name in a `replace`, and the key that makes a change to one
//! rebuild what uses it.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Result, io};
use crate::paths::repo_root;

/// Modules a Kubernetes release requires that the Go module proxy lists but
/// will not serve, and the stand-in of ours that replaces each (a directory
/// relative to the repository root). `sigs.k8s.io/iptables-wrappers`
/// v1.0.0 (1.38's kubelet and kube-proxy) answers 403 "not available".
pub const STAND_INS: &[(&str, &str)] =
    &[("sigs.k8s.io/iptables-wrappers", "e2e/go/iptables-wrappers")];

/// [`STAND_INS`] as a wrapper module in `dir` must name them: relative to
/// `dir` when it is inside the repository (a committed module), absolute
/// otherwise (a generated one in the cache).
pub fn stand_in_paths(dir: &Path) -> Vec<(&'static str, String)> {
    let root = lexical(&repo_root());
    let dir = lexical(dir);
    STAND_INS
        .iter()
        .map(|(module, rel)| {
            let path = match dir.strip_prefix(&root) {
                Ok(inside) => {
                    let up = "../".repeat(inside.components().count());
                    format!("{up}{rel}")
                }
                Err(_) => root.join(rel).display().to_string(),
            };
            (*module, path)
        })
        .collect()
}

/// What a build of the wrapper module at `dir` reads besides its go.mod and
/// go.sum: the sources of the stand-ins its go.mod replaces modules with,
/// hashed so that a change to a stand-in rebuilds (a directory replacement
/// leaves no trace in go.sum).
pub fn stand_ins_key(dir: &Path) -> Result<String> {
    let path = dir.join("go.mod");
    fs::metadata(&path).map_err(io("reading", &path))?;
    // No stand-in: no key, so the stamps of modules without one (etcd's,
    // 1.37's) are what they were before stand-ins existed.
    if !STAND_INS.iter().any(|(module, _)| replaces(dir, module)) {
        return Ok(String::new());
    }
    let mut key = Sha256::new();
    for (module, rel) in STAND_INS {
        if !replaces(dir, module) {
            continue;
        }
        let root = repo_root().join(rel);
        let mut files = Vec::new();
        collect_files(&root, &mut files)?;
        files.sort();
        for file in files {
            // Relative to the stand-in: the same sources in another
            // checkout (CI's own) give the same key.
            let name = file.strip_prefix(&root).unwrap_or(&file);
            key.update(name.to_string_lossy().as_bytes());
            key.update(fs::read(&file).map_err(io("reading", &file))?);
        }
    }
    Ok(hex::encode(key.finalize()))
}

/// `path` with `.` and `dir/..` pairs taken out, without asking the
/// filesystem (the directory may not exist yet).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io("reading", dir))? {
        let path = entry.map_err(io("reading", dir))?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// The module whose stand-in reports no iptables: a release built with it
/// must run kube-proxy in a mode that does not use iptables (`nftables`).
pub const IPTABLES_WRAPPERS: &str = "sigs.k8s.io/iptables-wrappers";

/// Whether the wrapper module at `dir` replaces `module` with our stand-in.
/// Its go.mod names the stand-in relative to itself (committed) or by an
/// absolute path (generated): either ends with the stand-in's directory.
pub fn replaces(dir: &Path, module: &str) -> bool {
    let Some((_, rel)) = STAND_INS.iter().find(|(m, _)| *m == module) else {
        return false;
    };
    fs::read_to_string(dir.join("go.mod")).is_ok_and(|text| {
        text.lines().any(|l| {
            let l = l.trim();
            l.starts_with(module) && l.contains("=>") && l.trim_end().ends_with(rel)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_depends_on_the_sources_not_on_where_the_checkout_is() {
        let committed = repo_root().join("e2e/go/kubernetes/v1.38");
        assert!(replaces(&committed, IPTABLES_WRAPPERS));
        assert!(!replaces(
            &repo_root().join("e2e/go/kubernetes/v1.37"),
            IPTABLES_WRAPPERS
        ));
        let key = stand_ins_key(&committed).unwrap();
        // The same go.mod in another directory (a generated module names
        // the stand-in by its absolute path) gives the same key.
        let elsewhere = tempfile::tempdir().unwrap();
        let text = fs::read_to_string(committed.join("go.mod")).unwrap();
        let absolute = repo_root().join("e2e/go/iptables-wrappers");
        fs::write(
            elsewhere.path().join("go.mod"),
            text.replace(
                "../../../../e2e/go/iptables-wrappers",
                &absolute.display().to_string(),
            ),
        )
        .unwrap();
        assert!(replaces(elsewhere.path(), IPTABLES_WRAPPERS));
        assert_eq!(stand_ins_key(elsewhere.path()).unwrap(), key);
        // A module without the replace does not depend on the stand-in,
        // and its stamps stay what they were before stand-ins existed.
        let v137 = stand_ins_key(&repo_root().join("e2e/go/kubernetes/v1.37")).unwrap();
        assert_eq!(v137, "");
        assert!(!key.is_empty());
    }
}
