//! sysfs attributes held open between scans, read again with one `pread`.
//!
//! A driver at rest rereads the same health attributes on every rescan
//! (hundreds on a p5 or a trn2, every 10 s): most of what it costs idle. A
//! read by path resolves the whole path (through class links) and makes
//! five system calls: open, the size, two reads, close. A [`HeldFile`]
//! opens its attribute once and then reads it with one `pread` at offset 0,
//! which makes sysfs run the attribute's `show` again: the value is as
//! fresh as a new open's, and an attribute the device stops answering fails
//! that `pread` at once.
//!
//! Its policy for what a read can answer:
//!
//! - **absent** (no such file): `Ok(None)`, "not reported" (an older
//!   kernel driver); nothing is held, and the next read tries to open it
//!   again, so an attribute that appears is seen at once;
//! - **stale** ([`is_stale`]: `NotFound`, `ENODEV`, `ESTALE` through a held
//!   handle): the attribute the handle refers to is gone (the kernel removed
//!   it on a driver reload or a hot removal), not the device failing. The
//!   handle is dropped and the path read once, by a fresh open; that read's
//!   answer is the answer, and its handle is held for the next read;
//! - **any other error** (`EIO` notably): the device's answer about this
//!   attribute (a closed EFA admin queue fails every counter read with
//!   `EIO`). It is returned to the caller with the handle kept, since a read
//!   by path would ask the same device the same question and hide the
//!   answer behind a second try; the caller decides what it means for
//!   health.
//!
//! Directories are held the same way for listing ([`HeldListing`]).
//!
//! Limits: a regular file (the generated fixtures) removed or replaced
//! under a held handle stays readable through it at its old content; only
//! sysfs (`ENODEV`) and network filesystems (`ESTALE`) make a stale handle
//! fail. A caller that replaces files drops its handles (the drivers drop
//! them at every full discovery).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

mod listing;
pub use listing::{HeldListing, ListingDigest};

/// Longest attribute read as text: sysfs shows at most a page.
pub const PAGE_BYTES: usize = 4096;

/// Longest attribute read as a counter: a `u64` in decimal is 20 digits, so
/// a file that fills this buffer is not a counter.
const COUNTER_BYTES: usize = 64;

/// Did a read through a held handle fail because the file it refers to is
/// gone (`NotFound`, `ENODEV` from sysfs, `ESTALE` from a network
/// filesystem), rather than because the device answered with an error?
pub fn is_stale(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(
            e.raw_os_error().map(Errno::from_raw),
            Some(Errno::ENODEV | Errno::ESTALE)
        )
}

/// A counter as sysfs writes it (decimal, a trailing newline): `None` when
/// the text is not one.
fn parse_counter(bytes: &[u8]) -> Option<u64> {
    if bytes.len() >= COUNTER_BYTES {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// One attribute, opened at its first read and held open after it.
#[derive(Debug)]
pub struct HeldFile {
    path: PathBuf,
    file: Option<File>,
}

impl HeldFile {
    /// The attribute at `path`; nothing is opened until the first read.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        HeldFile {
            path: path.into(),
            file: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a handle is held (for tests and diagnostics).
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// Reads the attribute into `buf` (the module's policy): the bytes read,
    /// `Ok(None)` when it does not exist. A read through a held handle
    /// allocates nothing.
    pub fn read<'b>(&mut self, buf: &'b mut [u8]) -> io::Result<Option<&'b [u8]>> {
        self.read_with(buf, |file, buf| file.read_at(buf, 0))
    }

    /// The attribute as a counter: `Ok(None)` when it does not exist or is
    /// not a decimal `u64`.
    pub fn read_u64(&mut self) -> io::Result<Option<u64>> {
        let mut buf = [0u8; COUNTER_BYTES];
        Ok(self.read(&mut buf)?.and_then(parse_counter))
    }

    /// The attribute as text (invalid UTF-8 replaced): `Ok(None)` when it
    /// does not exist.
    pub fn read_text(&mut self) -> io::Result<Option<String>> {
        let mut buf = [0u8; PAGE_BYTES];
        Ok(self
            .read(&mut buf)?
            .map(|b| String::from_utf8_lossy(b).into_owned()))
    }

    /// [`HeldFile::read`] with the `pread` given, so that tests can make a
    /// held handle fail as sysfs does.
    fn read_with<'b>(
        &mut self,
        buf: &'b mut [u8],
        mut pread: impl FnMut(&File, &mut [u8]) -> io::Result<usize>,
    ) -> io::Result<Option<&'b [u8]>> {
        if let Some(file) = &self.file {
            match pread(file, buf) {
                Ok(n) => return Ok(Some(&buf[..n])),
                Err(e) if is_stale(&e) => self.file = None,
                Err(e) => return Err(e),
            }
        }
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let read = pread(&file, buf);
        // A fresh handle that is already stale is not kept: the next read
        // opens the path again.
        if !matches!(&read, Err(e) if is_stale(e)) {
            self.file = Some(file);
        }
        Ok(Some(&buf[..read?]))
    }
}

#[cfg(test)]
mod tests;
