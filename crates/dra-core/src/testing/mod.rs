//! Test helpers for drivers and the end-to-end harness, behind the `testing`
//! feature: never part of a production build.
//!
//! What is here is the crate's own machinery, reachable so that tests can
//! drive it directly: the rescan loop with a driver's inventory, the slice
//! publisher (the fleet benchmark), the kubelet plugin on a temporary
//! directory with an in-memory claim source, the generated kubelet protocol
//! (to call the plugin as kubelet does), and the checkpoint (its on-disk
//! format, which the end-to-end tests read and, to simulate a reboot,
//! rewrite). Each of these items is declared `pub` where it lives, marked
//! `cfg_attr(not(feature = "testing"), allow(unreachable_pub))`: without this
//! feature it is reachable from nowhere outside the crate.

pub use crate::daemon::rescan::{
    DeviceFeeds, PoolId, RescanConfig, RescanError, RescanMetrics, Rescanner, Trigger,
};
pub use crate::daemon::runner::run_in_process;
pub use crate::kubelet::authority::{
    AdapterError, Frame, InboundStream, MAX_IN_FRAME, PREFACE, Rewrite, parse_frame, read_frame,
};
pub use crate::kubelet::connection::ConnectionLimits;
pub use crate::kubelet::health::DeviceHealthStatus;
pub use crate::kubelet::plugin::{
    KubeletPlugin, PluginError, PluginOptions, PluginSockets, RunningPlugin,
};
pub use crate::kubelet::proto::{
    dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration,
};
pub use crate::kubelet::self_check::{SelfCheckError, self_check, unix_channel};
pub use crate::prepare::attributes_file::AttributeFiles;
pub use crate::prepare::cdi::{CdiError, CdiWriter};
pub use crate::prepare::checkpoint::{
    CHECKPOINT_VERSION, Checkpoint, CheckpointError, CheckpointStore, PreparedClaim,
};
pub use crate::prepare::claims::{ClaimSource, ClaimSourceError, InMemoryClaimSource};
pub use crate::prepare::metrics::PluginMetrics;
pub use crate::publish::desired::{NodeOwner, PoolContent, desired_slices};
pub use crate::publish::publisher::{
    PublishMetrics, PublisherConfig, PublisherConfigError, run as publish,
};
pub use crate::scan::uevent::{Uevent, UeventError, UeventSocket};

pub mod conformance;
pub mod reference;
pub mod rescan_bench;
