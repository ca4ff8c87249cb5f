//! Write settling: the publisher's own writes, until its watch shows them.
//!
//! The watch can lag behind the API server's answers by seconds, and by
//! minutes on a server that is far behind (a fleet publishing at once). A
//! reconcile on such a view finds the slices it has just written missing or
//! old, and writes them again: creates refused as already existing, updates
//! refused as conflicts, pool generations bumped for nothing, all of it more
//! load on the server that is behind. So the publisher trusts what the
//! server answered: every successful write (the stored object, with its
//! `resourceVersion`) and delete is kept here and laid over the watch's
//! view ([`OwnWrites::view`]) until the watch shows that version or a newer
//! one, or the delete.
//!
//! A write the watch never shows (the watch was lost and its relist, served
//! from the API server's cache, is older; someone deleted the slice while
//! the watch was away) must not hide drift forever: an entry not settled
//! within [`WRITE_SETTLE_TIMEOUT`] is read back with a GET
//! ([`OwnWrites::due`], [`OwnWrites::read_back`]), and what that read finds
//! is what the overlay holds from then on; the next check of an entry that
//! still has not settled waits twice as long, up to [`MAX_CHECK_INTERVAL`].
//! Checks are reads, never writes.
//!
//! `resourceVersion`s are compared as numbers, as the API server's are
//! (etcd revisions); a version that is not a number settles its entry at
//! the first event for the name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::Instant;

/// How long an own write may stay unseen by the watch before it is read
/// back from the API server.
pub(crate) const WRITE_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait between two read-backs of one unsettled write.
pub(crate) const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(160);

/// What the publisher knows of one slice name beyond its watch.
#[derive(Debug, Clone, PartialEq)]
enum Known {
    /// Written (or read back): this object, at its `resourceVersion`.
    Present(Box<ResourceSlice>),
    /// Deleted: the object with this UID (any, when `None`) is gone.
    Absent { uid: Option<String> },
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    known: Known,
    check_at: Instant,
    checks: u32,
}

/// The publisher's own writes the watch has not shown yet, by slice name.
#[derive(Debug, Default)]
pub(super) struct OwnWrites {
    entries: BTreeMap<String, Entry>,
}

fn version(s: &ResourceSlice) -> Option<u64> {
    s.metadata.resource_version.as_deref()?.parse().ok()
}

/// Is `seen` at least as new as `known`? Unknown versions count as caught up.
fn at_least(seen: &ResourceSlice, known: &ResourceSlice) -> bool {
    match (version(seen), version(known)) {
        (Some(seen), Some(known)) => seen >= known,
        _ => true,
    }
}

fn uid(s: &ResourceSlice) -> Option<&str> {
    s.metadata.uid.as_deref()
}

fn name(s: &ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or_default()
}

impl Known {
    /// Does the watch's `seen` (the current object of the name there, if
    /// any) already show what this entry knows?
    fn settled_by(&self, seen: Option<&ResourceSlice>) -> bool {
        match (self, seen) {
            (Self::Present(_), None) => false,
            (Self::Present(known), Some(seen)) => at_least(seen, known),
            (Self::Absent { .. }, None) => true,
            // Another object under the name: recreated since.
            (Self::Absent { uid: want }, Some(seen)) => {
                want.as_deref().is_some_and(|w| uid(seen) != Some(w))
            }
        }
    }
}

impl OwnWrites {
    fn put(&mut self, name: &str, known: Known, now: Instant) {
        self.entries.insert(
            name.to_owned(),
            Entry {
                known,
                check_at: now + WRITE_SETTLE_TIMEOUT,
                checks: 0,
            },
        );
    }

    /// A create or update succeeded: `stored` is what the server answered.
    pub(super) fn wrote(&mut self, stored: &ResourceSlice, now: Instant) {
        self.put(name(stored), Known::Present(Box::new(stored.clone())), now);
    }

    /// A delete of the object with `uid` succeeded (or found it gone).
    pub(super) fn deleted(&mut self, name: &str, uid: Option<String>, now: Instant) {
        self.put(name, Known::Absent { uid }, now);
    }

    /// Crosses off what a watch event shows: a version at least as new as
    /// ours, the delete of the object we know, or another object under the
    /// name after our delete.
    pub(super) fn observe(&mut self, seen: &ResourceSlice, is_delete: bool) {
        let Some(entry) = self.entries.get(name(seen)) else {
            return;
        };
        let settled = match &entry.known {
            // Deleted by someone after our write: the watch has it all.
            Known::Present(known) if is_delete => {
                uid(known).is_none() || uid(known) == uid(seen) || at_least(seen, known)
            }
            Known::Present(known) => at_least(seen, known),
            Known::Absent { uid: want } if is_delete => {
                want.is_none() || want.as_deref() == uid(seen)
            }
            Known::Absent { uid: want } => want.as_deref().is_some_and(|w| uid(seen) != Some(w)),
        };
        if settled {
            self.entries.remove(name(seen));
        }
    }

    /// Drops the entries the watch's `seen` slices already show.
    pub(super) fn settle(&mut self, seen: &[Arc<ResourceSlice>]) {
        let by_name: BTreeMap<&str, &ResourceSlice> =
            seen.iter().map(|s| (name(s), &**s)).collect();
        self.entries
            .retain(|n, e| !e.known.settled_by(by_name.get(n.as_str()).copied()));
    }

    /// The node's slices as the watch shows them, with our own writes laid
    /// over: what a reconcile works on.
    pub(super) fn view(&self, seen: &[Arc<ResourceSlice>]) -> Vec<ResourceSlice> {
        let mut out: Vec<ResourceSlice> = Vec::with_capacity(seen.len() + self.entries.len());
        for s in seen {
            match self.entries.get(name(s)) {
                Some(e) if !e.known.settled_by(Some(s)) => {}
                _ => out.push((**s).clone()),
            }
        }
        for e in self.entries.values() {
            if let Known::Present(known) = &e.known {
                let shown = seen
                    .iter()
                    .any(|s| name(s) == name(known) && e.known.settled_by(Some(s)));
                if !shown {
                    out.push((**known).clone());
                }
            }
        }
        out
    }

    /// The names whose writes are due to be read back at `now`.
    pub(super) fn due(&self, now: Instant) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.check_at <= now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The earliest read-back.
    pub(super) fn next_check(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.check_at).min()
    }

    /// What a GET of `name` found at `now` (`None`: no such object), with
    /// the watch's current object of the name in `seen`. The read is the
    /// truth from now on; an entry it does not settle is checked again
    /// after twice the previous wait.
    pub(super) fn read_back(
        &mut self,
        name: &str,
        found: Option<ResourceSlice>,
        seen: Option<&ResourceSlice>,
        now: Instant,
    ) {
        let checks = self.entries.get(name).map_or(0, |e| e.checks) + 1;
        let known = match found {
            Some(object) => Known::Present(Box::new(object)),
            None => Known::Absent {
                uid: seen.and_then(|s| s.metadata.uid.clone()),
            },
        };
        if known.settled_by(seen) {
            self.entries.remove(name);
            return;
        }
        let wait = WRITE_SETTLE_TIMEOUT
            .saturating_mul(1 << checks.min(8))
            .min(MAX_CHECK_INTERVAL);
        self.entries.insert(
            name.to_owned(),
            Entry {
                known,
                check_at: now + wait,
                checks,
            },
        );
    }

    /// No own write is waiting for the watch.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests;
