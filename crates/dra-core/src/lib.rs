//! Everything a DRA node driver needs that is not device-specific: a small SDK.
//!
//! A driver implements two traits, pairs them, and calls one function:
//!
//! - [`DeviceInventory`]: scan the hardware into [`ScannedDevice`]s with their
//!   [`DeviceHealth`], using the standard [`attributes`];
//! - [`Driver`]: turn a claim's [`AllocatedDevice`]s into [`PreparedDevice`]s
//!   (CDI container edits), with its opaque configuration decoded strictly
//!   ([`DriverConfig`], [`decode_config`]);
//! - [`NodeDriver`]: which driver prepares the inventory's devices (neither
//!   trait knows the other);
//! - [`run`]`::<MyInventory>(&`[`Program`]`{ .. })` is the whole `main`:
//!   command line, logging, the async runtime, the kubelet plugin, the
//!   ResourceSlice publisher, the rescan loop and the ops server.
//!
//! That is the whole public surface. The crate is laid out along the data
//! flow, each top-level module private and documented with what it owns and
//! what it may import (the structure test, `crates/e2e/tests/structure.rs`,
//! enforces each rule):
//!
//! 1. `scan`: the inventory trait, device and health types, attributes,
//!    health as taints, hot-plug uevents; imports no other
//!    layer;
//! 2. `publish`: devices → ResourceSlices in the API server, the driver's
//!    Node and its labels; imports `scan`;
//! 3. `prepare`: a claim → CDI specs and the checkpoint (the pipeline, group
//!    commit, the node lock, claim status); imports no other layer;
//! 4. `kubelet`: the registration and DRA plugin gRPC servers on kubelet's
//!    sockets, the health stream, the self-check; imports `prepare` and
//!    `scan`;
//! 5. `daemon`: the process, which pairs an inventory with its driver,
//!    starts the others in order and runs the one rescan loop; imports every
//!    other layer.
//!
//! Test helpers (a driver conformance suite, fixture helpers, the checkpoint
//! reader the end-to-end tests use) are behind the `testing` feature; fuzz
//! entry points are behind `fuzzing`.

#![deny(unreachable_pub)]

mod daemon;
mod kubelet;
mod prepare;
mod publish;
mod scan;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(feature = "testing")]
pub mod testing;

pub use daemon::cli::NoExtraArgs;
pub use daemon::node_driver::NodeDriver;
pub use daemon::ops::PROBE_TIMEOUT;
pub use daemon::rescan::DEFAULT_RESCAN_INTERVAL;
pub use daemon::runner::{Program, main as run};
pub use prepare::config::{
    ConfigEntryError, ConfigError, ConfigSource, DriverConfig, InvalidValue, ResolvedConfig,
    config_for_request, decode_allocation_configs, decode_config,
};
pub use prepare::driver::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, DeviceStatus, Driver,
    DriverError, NetworkData, PreparedDevice,
};
pub use publish::node::device_plugin_resources_present;
pub use scan::attributes;
pub use scan::inventory::{
    ApiSupport, DeviceHealth, DeviceInventory, HealthCondition, HealthState, HostPaths,
    ScannedDevice, Severity,
};
