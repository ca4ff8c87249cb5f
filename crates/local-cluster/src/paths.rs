//! Where the suite finds things: the repository checkout it runs from, the
//! build cache, and executables on `PATH`. No other module of the crate is
//! needed here, so everything can use it.

use std::path::{Path, PathBuf};

/// Root of the repository, where the wrapper Go modules live.
pub fn repo_root() -> PathBuf {
    // crates/local-cluster → repository root; this is a developer tool run from a checkout.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cache root: `$AWS_DRA_CACHE_DIR`, else `$HOME/.cache/aws-dra`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("AWS_DRA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/aws-dra")
}

/// The first executable called `name` on `PATH` (or in `/usr/sbin`, `/sbin`).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
