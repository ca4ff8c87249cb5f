//! Everything a DRA node driver needs that is not device-specific.
//!
//! The kubelet-facing half: the [`Driver`] trait a device driver implements,
//! strict opaque config decoding ([`DriverConfig`]), the registration and DRA
//! plugin gRPC servers ([`KubeletPlugin`]), claim preparation with CDI specs
//! and a checkpoint (each written to a temp file, synced and renamed; the temp
//! files a killed driver leaves behind are swept once they are a minute old),
//! device health, metrics, and a socket self-check.
//!
//! The API-server-facing half: device validation against the API limits and
//! the ResourceSlice publisher ([`publish`]), Node lookups ([`node`]), the
//! `/metrics` + `/healthz` server ([`ops`]) and the CLI both binaries share
//! ([`cli`]).
//!
//! The device lifecycle: a driver implements [`DeviceInventory`] (scan the
//! hardware into devices with their health) next to [`Driver`];
//! [`runner::main`] does the rest (command line, logging, async runtime, the
//! one [`rescan`] loop, and [`runtime::run`], which starts the plugin, the
//! publisher and the ops server).

pub mod api_probe;
mod atomic;
pub mod attributes;
pub mod authority;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod cli;
mod client;
pub mod config;
pub mod connection;
mod crash;
pub mod driver;
pub mod health;
pub mod inventory;
mod lock;
pub mod metrics;
pub mod node;
pub mod node_labels;
pub mod ops;
pub mod plugin;
pub mod proto;
pub mod publish;
mod ready;
pub mod rescan;
mod resolve;
pub mod runner;
pub mod runtime;
pub mod self_check;
mod state;
pub mod taints;
pub mod uevent;

pub use claims::{ClaimSource, InMemoryClaimSource, KubeClaimSource};
pub use config::{ConfigError, DriverConfig, InvalidValue};
pub use driver::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverError,
    PreparedDevice,
};
pub use health::{DeviceHealthStatus, HealthState};
pub use inventory::{
    ApiSupport, DeviceHealth, DeviceInventory, HealthCondition, HostPaths, ScannedDevice, Severity,
};
pub use metrics::PluginMetrics;
pub use plugin::{KubeletPlugin, PluginError, PluginOptions, PluginSockets, RunningPlugin};
pub use runtime::{RuntimeError, RuntimeOptions};
pub use self_check::{SelfCheckError, self_check};
