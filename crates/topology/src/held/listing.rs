//! Directories held open between scans and listed again through the handle.
//!
//! A fingerprint ([`crate::reuse`]) lists a few directories on every rescan
//! to tell whether the device set may have changed. A listing by path
//! resolves the path, opens the directory, reads it and closes it, and the
//! usual way to keep what it found (a sorted list of names) allocates a
//! string per entry. A [`HeldListing`] opens its directory once and then
//! rewinds and reads it (`lseek`, `getdents64`), and keeps only a
//! [`ListingDigest`]: how many entries, and a digest of their names in the
//! order the filesystem lists them.
//!
//! A listing through a held handle follows the directory, not its path. A
//! removed directory lists as empty (sysfs) or fails with `ENOENT` (a
//! regular filesystem), so a held handle that reads no entry, or a stale
//! error ([`super::is_stale`]), is dropped and the path listed again: a
//! directory removed and created anew (a kernel module reloaded, a fixture
//! rebuilt) is seen at once. An empty directory is thus listed by path on
//! every call, as before.
//!
//! The digest is order-sensitive: an unchanged directory lists in the same
//! order (sysfs by name hash, ext4 by its htree), and a listing that only
//! changed order reads as changed, which costs a needless discovery, never
//! a missed change.

use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::is_stale;

/// What one listing found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListingDigest {
    /// Entries, `.` and `..` left out.
    pub entries: usize,
    /// A digest of the entry names in listing order.
    pub digest: u64,
}

/// One directory, opened at its first listing and held open after it.
#[derive(Debug)]
pub struct HeldListing {
    path: PathBuf,
    dir: Option<Dir>,
}

impl HeldListing {
    /// The directory at `path`; nothing is opened until the first listing.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        HeldListing {
            path: path.into(),
            dir: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a handle is held (for tests and diagnostics).
    pub fn is_open(&self) -> bool {
        self.dir.is_some()
    }

    /// Lists the directory (the module's policy): `Ok(None)` when it does
    /// not exist. A listing through a held handle allocates nothing.
    pub fn digest(&mut self) -> io::Result<Option<ListingDigest>> {
        if let Some(dir) = &mut self.dir {
            match digest_of(dir) {
                Ok(found) if found.entries > 0 => return Ok(Some(found)),
                // Empty: the directory may be a removed one; ask the path.
                Ok(_) => self.dir = None,
                Err(e) if is_stale(&e) => self.dir = None,
                Err(e) => return Err(e),
            }
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = match Dir::open(&self.path, flags, Mode::empty()) {
            Ok(dir) => dir,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let found = digest_of(&mut dir)?;
        self.dir = Some(dir);
        Ok(Some(found))
    }
}

/// Reads `dir` from its start; the handle is rewound when the read ends
/// (`nix`'s iterator rewinds when dropped), so the next call starts over.
fn digest_of(dir: &mut Dir) -> io::Result<ListingDigest> {
    let mut hasher = DefaultHasher::new();
    let mut entries = 0;
    for entry in dir.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        hasher.write(name);
        hasher.write_u8(0);
        entries += 1;
    }
    Ok(ListingDigest {
        entries,
        digest: hasher.finish(),
    })
}

#[cfg(test)]
mod tests;
