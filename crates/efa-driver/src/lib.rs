//! `efa-driver`: the Kubernetes DRA driver for AWS Elastic Fabric Adapters.
//!
//! One file per concern: [`discovery`] (sysfs → [`discovery::Efa`]),
//! [`attributes`] (EFA → DRA `Device`), [`config`] (the strict `EfaConfig`),
//! [`prepare`] (the `dra-core` [`dra_core::Driver`] impl), [`inventory`]
//! (the `dra-core` [`dra_core::DeviceInventory`] impl: what a scan finds),
//! [`safety`] (refusing to run next to the classic device plugin),
//! [`sharing`] (EFAs shared by capacity, `--sharing capacity`),
//! [`template`] (what a node of an instance type publishes, without the node).

pub mod attributes;
pub mod config;
pub mod discovery;
pub mod health;
pub mod inventory;
pub mod prepare;
pub mod safety;
pub mod sharing;
pub mod template;

pub use config::EfaConfig;
pub use discovery::{Discovery, DiscoveryError, Efa, discover};
pub use inventory::EfaInventory;
pub use prepare::EfaDriver;
pub use sharing::{EfaFlags, SharingFlag};

/// The DRA driver name (`--driver-name` default, DeviceClass name).
pub const DRIVER_NAME: &str = "efa.networking.k8s.aws";
/// The CDI kind of the devices this driver prepares.
pub const CDI_KIND: &str = "k8s.efa.networking.k8s.aws/efa";
