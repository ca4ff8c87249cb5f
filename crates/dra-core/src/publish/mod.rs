//! Publishing the driver's devices as the node's ResourceSlice pool.
//!
//! Split so that everything with rules in it is pure and table-tested:
//! [`validate`] (API limits), [`desired`] (devices → slices), [`mod@reconcile`]
//! (observed + desired → API calls), [`clash`] (which devices another
//! driver already publishes on the node); [`publisher`] is the thin async
//! loop that feeds them from a watch and applies the result with backoff.

mod backoff;
pub mod clash;
pub mod desired;
pub mod publisher;
pub mod reconcile;
pub mod validate;

pub use backoff::{Backoff, BackoffConfig, WatchBackoff};
pub use clash::{
    ClashReason, ClashSource, Clashes, FOREIGN_PUBLISHERS, ForeignIdentity, find_clashes,
};
pub use desired::{
    DesiredPool, MAX_COUNTER_SETS_PER_SLICE, MAX_DEVICES_PER_SLICE, NodeOwner, PoolContent,
    desired_pool, desired_pool_with_counters, desired_slices, desired_slices_with_counters,
    slice_name,
};
pub use publisher::{PublishMetrics, PublisherConfig, PublisherConfigError, run};
pub use reconcile::{SliceAction, reconcile};
pub use validate::{IssueAction, IssueReason, ValidationIssue, validate_devices};
