//! One publisher per pool: which of two instances of the driver on one node
//! writes the pool during a surge upgrade.
//!
//! The charts roll the DaemonSet with `maxSurge`: the new pod starts beside
//! the old one and the old one leaves once the new one is Ready. Both run a
//! publisher with the same field manager, so each takes every slice of the
//! pool for its own. When the new values change the layout (Neuron
//! `partitions`, EFA `sharing`) each reconciles toward its own layout, and
//! the pool's generation would bounce at watch speed until the old pod
//! exits, the scheduler seeing devices come and go meanwhile.
//!
//! **Rule: the newest instance publishes, and the pool itself says which
//! that is.** Every slice the publisher writes carries the annotation
//! `<driver>/publisher: <epoch>/<instance>` ([`Instance`]): the instance is
//! the pod UID (`pid-<pid>` without `POD_UID`), the epoch the process's
//! start in nanoseconds since 1970. Before each reconcile the publisher
//! looks at the stamps of the pool's slices; one of a newer instance that
//! is still alive makes it **yield**: it writes nothing (and deletes
//! nothing, at shutdown neither) until no slice of a live newer instance is
//! left. A later stamp of the same instance (a container restart of the
//! same pod) is its own. Slices without a stamp (a version before this
//! rule) are the oldest.
//!
//! *Alive* is asked of the node, not of the API server: the instances of
//! one node share kubelet's plugin directory, and the newer instance serves
//! its `dra-<podUID>.sock` there for as long as it runs (the daemon wires
//! the probe, see [`Liveness`]). That covers the cases where the stamps
//! alone would leave the pool unwritten: a surge undone (the new pod
//! deleted, the old one kept), the old pod's container restarted during
//! the surge (it stamps a newer epoch; when it goes, the new pod resumes),
//! a wall clock stepped back. While it yields the publisher looks again
//! every [`RECHECK`].
//!
//! Why not a coordination Lease per node: it is one more object, Role and
//! admission rule per driver, a renewal write every few seconds on every
//! node, and a lease cannot be renewed while the API server is away, so a
//! lone instance would have to decide whether to publish by a clock it
//! cannot confirm. The stamps cost nothing when there is one instance (its
//! slices carry its own stamp; an unchanged slice is not rewritten to
//! restamp it, so an upgrade without a layout change writes nothing), and
//! what decides is exactly what the scheduler reads: the pool.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::Instant;

/// How often a yielded publisher asks again whether the newer instance
/// still runs.
pub(super) const RECHECK: Duration = Duration::from_secs(2);

/// The annotation that stamps a slice with the instance that wrote it.
pub(crate) fn stamp_key(driver: &str) -> String {
    format!("{driver}/publisher")
}

/// One running publisher: who, and since when.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Instance {
    /// Nanoseconds since 1970 at the start of the process.
    pub(crate) epoch: u64,
    /// The pod UID, or `pid-<pid>` without one.
    pub(crate) id: String,
}

impl Instance {
    /// This process, known by `pod_uid` when it has one.
    pub(crate) fn this_process(pod_uid: Option<&str>) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let id = match pod_uid.filter(|u| !u.is_empty()) {
            Some(uid) => uid.to_owned(),
            None => format!("pid-{}", std::process::id()),
        };
        Self { epoch, id }
    }

    /// The annotation's value.
    pub(crate) fn stamp(&self) -> String {
        format!("{}/{}", self.epoch, self.id)
    }

    /// Reads a stamp; `None` for a value this code did not write. The id
    /// becomes part of a socket path ([`Liveness`]): a pod UID or `pid-N`,
    /// nothing else.
    pub(crate) fn parse(value: &str) -> Option<Self> {
        let (epoch, id) = value.split_once('/')?;
        let epoch = epoch.parse().ok()?;
        let uid_like = id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        (!id.is_empty() && uid_like).then(|| Self {
            epoch,
            id: id.to_owned(),
        })
    }

    /// Is `other` a newer instance than this one (a later start of the
    /// same instance is not)?
    fn is_newer(&self, other: &Instance) -> bool {
        other.id != self.id && other > self
    }
}

/// Asks whether the instance with this id still runs on the node.
#[derive(Clone)]
pub(crate) struct Liveness(Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl Liveness {
    pub(crate) fn new(probe: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(probe))
    }

    /// Without a probe every instance counts as alive: the publisher
    /// yields for as long as a newer instance's slices stand.
    pub(crate) fn assume_alive() -> Self {
        Self::new(|_| true)
    }

    pub(crate) fn alive(&self, id: &str) -> bool {
        (self.0)(id)
    }
}

impl fmt::Debug for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Liveness")
    }
}

/// The newest live instance newer than `me` that stamped one of `slices`
/// (the pool's slices of our driver on our node); `None`: `me` publishes.
pub(crate) fn newer_publisher<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    key: &str,
    me: &Instance,
    alive: &Liveness,
) -> Option<Instance> {
    let mut newer: Vec<Instance> = slices
        .into_iter()
        .filter_map(|s| s.metadata.annotations.as_ref()?.get(key))
        .filter_map(|v| Instance::parse(v))
        .filter(|i| me.is_newer(i))
        .collect();
    newer.sort();
    newer.dedup();
    newer.into_iter().rev().find(|i| alive.alive(&i.id))
}

/// Puts `me`'s stamp on every slice of `slices`.
pub(crate) fn stamp_all(slices: &mut [ResourceSlice], key: &str, me: &Instance) {
    for s in slices {
        s.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), me.stamp());
    }
}

/// The publisher's side of the handover: whom it yields to, when it looks
/// again.
#[derive(Debug, Default)]
pub(super) struct Handover {
    yielded_to: Option<Instance>,
    recheck_at: Option<Instant>,
}

impl Handover {
    /// Decides before a reconcile: `true` when a newer live instance
    /// publishes the pool and this one must write nothing. Logs each change.
    pub(super) fn must_yield<'a>(
        &mut self,
        own: impl IntoIterator<Item = &'a ResourceSlice>,
        key: &str,
        me: &Instance,
        alive: &Liveness,
    ) -> bool {
        let newer = newer_publisher(own, key, me, alive);
        match (&self.yielded_to, &newer) {
            (None, Some(to)) => tracing::info!(
                newer = %to.id, this = %me.id,
                "a newer instance of this driver publishes the node's pool; this one stops writing it until that one is gone"
            ),
            (Some(from), None) => tracing::info!(
                newer = %from.id, this = %me.id,
                "the newer instance that published the node's pool is gone or stopped; this one publishes again"
            ),
            _ => {}
        }
        self.recheck_at = newer.as_ref().map(|_| Instant::now() + RECHECK);
        self.yielded_to = newer;
        self.yielded_to.is_some()
    }

    /// When a yielded publisher looks again; `None` when it publishes.
    pub(super) fn recheck_at(&self) -> Option<Instant> {
        self.recheck_at
    }

    /// The recheck is done (or due): no timer until the next decision.
    pub(super) fn recheck_due(&mut self) {
        self.recheck_at = None;
    }
}

#[cfg(test)]
mod tests;
