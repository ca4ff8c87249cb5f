//! Reusing the last discovery while nothing it depends on changed.
//!
//! A full discovery reads a few files per device or PCI function (about 120
//! functions on a p5), and on a node at rest it finds what it found 10 s
//! earlier. A [`Fingerprint`] is what changes when the device set can
//! change (a few directory listings, whether some files exist, a kernel
//! module's version), read in a fraction of a discovery's time. A
//! [`DiscoveryCache`] keeps the last discovery with its fingerprint and
//! hands it out again while the fingerprint reads the same; every
//! `full_every`th scan discovers anyway, the fallback for a change no
//! fingerprint shows.
//!
//! A driver declares what its fingerprint reads and what a discovery is.
//! Health is not part of it: a driver reads health on every scan, whatever
//! the cache hands out.

use std::ffi::OsString;
use std::io;
use std::path::Path;

use crate::held::{HeldFile, HeldListing, ListingDigest, PAGE_BYTES};

/// What a driver's discovery depends on, as read now.
///
/// Built by naming what to read, in a fixed order:
/// `Fingerprint::new().list(a).list(b).contents(c).finish()`. Two
/// fingerprints are equal when every listing, existence and content read
/// the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprint {
    parts: Vec<Part>,
    unreadable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// A directory's entry names, sorted (none when it does not exist).
    Listing(Vec<OsString>),
    /// Whether a path exists (a link counts, whatever it points to).
    Exists(bool),
    /// A file's bytes (`None` when it does not exist).
    Contents(Option<Vec<u8>>),
    /// A held directory's entry count and name digest (none when it does
    /// not exist).
    Digest(Option<ListingDigest>),
}

impl Fingerprint {
    pub fn new() -> Self {
        Fingerprint::default()
    }

    /// Adds the entry names of directory `dir`, sorted; none when it does
    /// not exist.
    pub fn list(mut self, dir: impl AsRef<Path>) -> Self {
        let names = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<Vec<_>>>(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        };
        match names {
            Ok(mut names) => {
                names.sort();
                self.parts.push(Part::Listing(names));
            }
            Err(_) => self.unreadable = true,
        }
        self
    }

    /// The names the last [`Fingerprint::list`] found (empty before one),
    /// for what a driver reads per entry.
    pub fn last_listing(&self) -> &[OsString] {
        self.parts
            .iter()
            .rev()
            .find_map(|p| match p {
                Part::Listing(names) => Some(names.as_slice()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// Adds what a held directory lists now ([`HeldListing::digest`]): the
    /// cheap form of [`Fingerprint::list`] for a driver that keeps the
    /// handles between scans and needs no names (no path lookup, no open,
    /// no allocation per entry).
    pub fn listed(mut self, dir: &mut HeldListing) -> Self {
        match dir.digest() {
            Ok(found) => self.parts.push(Part::Digest(found)),
            Err(_) => self.unreadable = true,
        }
        self
    }

    /// Adds the contents of a held file ([`HeldFile::read`], one `pread`
    /// through a held handle); none when it does not exist.
    pub fn held_contents(mut self, file: &mut HeldFile) -> Self {
        let mut buf = [0u8; PAGE_BYTES];
        match file.read(&mut buf) {
            Ok(bytes) => self.parts.push(Part::Contents(bytes.map(<[u8]>::to_vec))),
            Err(_) => self.unreadable = true,
        }
        self
    }

    /// Adds whether `path` exists (without following a link).
    pub fn exists(mut self, path: impl AsRef<Path>) -> Self {
        let exists = std::fs::symlink_metadata(path).is_ok();
        self.parts.push(Part::Exists(exists));
        self
    }

    /// Adds the contents of file `path`; none when it does not exist.
    pub fn contents(mut self, path: impl AsRef<Path>) -> Self {
        match std::fs::read(path) {
            Ok(bytes) => self.parts.push(Part::Contents(Some(bytes))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.parts.push(Part::Contents(None)),
            Err(_) => self.unreadable = true,
        }
        self
    }

    /// The fingerprint; `None` when something could not be read for
    /// another reason than its absence (then nothing may be reused: a
    /// fingerprint that did not read what it names proves nothing).
    pub fn finish(self) -> Option<Fingerprint> {
        (!self.unreadable).then_some(self)
    }
}

/// The last discovery, handed out again while its fingerprint holds.
///
/// `F` is what the driver's fingerprint is (a [`Fingerprint`], or a tuple
/// of one and what the driver reads itself); `T` what a discovery found,
/// with whatever the driver builds from it and wants to keep as long.
#[derive(Debug)]
pub struct DiscoveryCache<F, T> {
    full_every: u32,
    last: Option<Cached<F, T>>,
}

#[derive(Debug)]
struct Cached<F, T> {
    /// `None`: the fingerprint could not be read, so this is never reused.
    fingerprint: Option<F>,
    value: T,
    /// Scans that reused `value` since it was discovered.
    reused: u32,
}

/// What [`DiscoveryCache::get`] handed out.
#[derive(Debug)]
pub struct Lookup<'a, T> {
    /// The discovery, just made or reused.
    pub value: &'a mut T,
    /// Whether `value` was just discovered. What a driver keeps per
    /// discovery (held file handles, say) is to be dropped when it was.
    pub discovered: bool,
}

impl<F: PartialEq, T> DiscoveryCache<F, T> {
    /// The drivers' `full_every`: a full discovery every 60th scan, which
    /// at the default 10 s rescan interval is once every 10 minutes (60 ×
    /// 10 s). It counts scans, not time: a rescan that a uevent triggers
    /// counts too, and a longer `--rescan-interval` stretches it.
    pub const DEFAULT_FULL_EVERY: u32 = 60;

    /// A cache that discovers at least every `full_every`th scan: a scan
    /// that discovers, then at most `full_every - 1` that reuse. 1 (or 0)
    /// never reuses.
    pub fn new(full_every: u32) -> Self {
        DiscoveryCache {
            full_every: full_every.max(1),
            last: None,
        }
    }

    /// The last discovery when `fingerprint` is the one it was made with
    /// and it was reused fewer than `full_every - 1` times; else the
    /// result of `discover`, kept with `fingerprint`. A discovery that
    /// fails leaves nothing to reuse: the next scan discovers again.
    pub fn get<E>(
        &mut self,
        fingerprint: Option<F>,
        discover: impl FnOnce() -> Result<T, E>,
    ) -> Result<Lookup<'_, T>, E> {
        let cached = match self.last.take() {
            Some(mut last)
                if fingerprint.is_some()
                    && last.fingerprint == fingerprint
                    && last.reused + 1 < self.full_every =>
            {
                last.reused += 1;
                last
            }
            _ => Cached {
                value: discover()?,
                fingerprint,
                reused: 0,
            },
        };
        let cached = self.last.insert(cached);
        Ok(Lookup {
            discovered: cached.reused == 0,
            value: &mut cached.value,
        })
    }

    /// Forgets the last discovery: the next scan discovers (when what the
    /// driver builds from a discovery changed, say).
    pub fn clear(&mut self) {
        self.last = None;
    }

    /// The last discovery, if any.
    pub fn value(&self) -> Option<&T> {
        self.last.as_ref().map(|c| &c.value)
    }

    /// The last discovery, to add what is built from it.
    pub fn value_mut(&mut self) -> Option<&mut T> {
        self.last.as_mut().map(|c| &mut c.value)
    }

    /// How many scans reused the last discovery since it was made.
    pub fn reused(&self) -> Option<u32> {
        self.last.as_ref().map(|c| c.reused)
    }
}

impl<F: PartialEq, T> Default for DiscoveryCache<F, T> {
    /// A cache with [`DiscoveryCache::DEFAULT_FULL_EVERY`].
    fn default() -> Self {
        DiscoveryCache::new(Self::DEFAULT_FULL_EVERY)
    }
}

#[cfg(test)]
mod tests;
