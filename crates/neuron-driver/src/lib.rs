//! `neuron-driver`: the DRA driver for AWS Neuron chips (Inferentia2,
//! Trainium1/2/3), as a library so that the binary stays a thin CLI and tests
//! reach every part.
//!
//! - [`discovery`]: sysfs + `/dev` → [`discovery::NodeInventory`];
//! - [`bdf`]: the chip → PCI address ioctl, behind [`bdf::BdfSource`];
//! - [`attributes`]: inventory → DRA `Device`s;
//! - [`config`]: the opaque `NeuronConfig`;
//! - [`lnc`]: Logical NeuronCore rules and core numbering;
//! - [`partitions`]: NeuronCores as partitions of their chip (`--partitions`);
//! - [`prepare`]: [`prepare::NeuronDriver`], the `dra-core` driver;
//! - [`inventory`]: the `dra-core` inventory (what a scan finds);
//! - [`safety`]: the classic device plugin's resources;
//! - [`ultraserver`]: Trn2 UltraServer membership, node labels and runtime variables;
//! - [`template`]: what a node of an instance type publishes, without the node.

pub mod attributes;
pub mod bdf;
pub mod config;
pub mod discovery;
pub mod health;
pub mod inventory;
pub mod lnc;
pub mod partitions;
pub mod prepare;
pub mod safety;
pub mod template;
pub mod ultraserver;

/// Default `--driver-name`.
pub const DRIVER_NAME: &str = "neuron.aws.com";

pub use attributes::devices;
pub use config::NeuronConfig;
pub use discovery::{NodeInventory, discover};
pub use inventory::NeuronInventory;
pub use prepare::NeuronDriver;
