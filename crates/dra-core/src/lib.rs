//! Everything a DRA node driver needs that is not device-specific.

pub mod cli;
pub mod config;
pub mod driver;
pub mod node;
pub mod ops;
pub mod proto;
pub mod publish;

pub use config::{ConfigError, DriverConfig, InvalidValue};
pub use driver::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverError,
    PreparedDevice,
};
