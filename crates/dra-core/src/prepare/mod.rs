//! Preparing: a claim kubelet hands over becomes CDI specs on disk.
//!
//! Owns the [`Driver`](driver::Driver) trait a driver implements, strict
//! opaque config ([`config`]), where claims are read from ([`claims`]),
//! resolving a claim into this driver's devices ([`resolve`]), the
//! prepare/unprepare pipeline with its group commit ([`state`]), the CDI
//! writer ([`cdi`]), the checkpoint ([`checkpoint`]), atomic file replacement
//! ([`atomic`]), the node lock ([`lock`]) and the pipeline's metrics.
//!
//! Knows nothing of sockets or gRPC (that is `kubelet`) and nothing of
//! ResourceSlices (that is `publish`); imports nothing from the other
//! top-level modules.

pub(crate) mod atomic;
pub(crate) mod attributes_file;
pub(crate) mod cdi;
pub(crate) mod checkpoint;
pub(crate) mod claims;
pub(crate) mod config;
pub(crate) mod crash;
pub(crate) mod driver;
pub(crate) mod lock;
pub(crate) mod metrics;
pub(crate) mod resolve;
pub(crate) mod state;
pub(crate) mod status;
