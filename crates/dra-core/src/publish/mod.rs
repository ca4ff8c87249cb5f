//! Publishing the driver's devices as the node's ResourceSlice pool.
//!
//! Split so that everything with rules in it is pure and table-tested:
//! [`validate`] (API limits), [`desired`] (devices → slices), [`mod@reconcile`]
//! (observed + desired → API calls), [`clash`] (which devices another
//! driver already publishes on the node); [`publisher`] is the thin async
//! loop that feeds them from a watch and applies the result with backoff.
//!
//! Also the driver's other writes to the API server: asking it what it
//! accepts before the first publish ([`api_probe`]), lookups of the driver's
//! own Node ([`node`]) and the labels the driver keeps on it
//! ([`node_labels`]). Imports from `scan` (devices, health as taints) only;
//! never from `prepare`, `kubelet` or `daemon`.

pub(crate) mod api_probe;
mod backoff;
pub(crate) mod clash;
pub(crate) mod desired;
pub(crate) mod node;
pub(crate) mod node_event;
pub(crate) mod node_labels;
pub(crate) mod publisher;
pub(crate) mod reconcile;
pub(crate) mod validate;

pub(crate) use backoff::{Backoff, BackoffConfig};
pub(crate) use desired::{NodeOwner, PoolContent, desired_slices_with_counters, slice_name};
