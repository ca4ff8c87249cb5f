//! Where the repository is, for every task. Its own module so that the
//! tasks need not import one another to find it.

use std::path::{Path, PathBuf};

/// The workspace root: xtask lives one directory below it.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}
