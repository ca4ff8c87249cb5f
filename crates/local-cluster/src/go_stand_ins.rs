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
    let text = fs::read_to_string(&path).map_err(io("reading", &path))?;
    let mut key = Sha256::new();
    for (module, rel) in STAND_INS {
        let replaced = text.lines().any(|l| {
            let l = l.trim();
            l.starts_with(module) && l.contains("=>") && l.trim_end().ends_with(rel)
        });
        if !replaced {
            continue;
        }
        let mut files = Vec::new();
        collect_files(&repo_root().join(rel), &mut files)?;
        files.sort();
        for file in files {
            key.update(file.to_string_lossy().as_bytes());
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
