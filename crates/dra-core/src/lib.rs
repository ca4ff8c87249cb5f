//! Everything a DRA node driver needs that is not device-specific.

pub mod config;
pub mod driver;
pub mod proto;

pub use config::{ConfigError, DriverConfig, InvalidValue};
pub use driver::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverError,
    PreparedDevice,
};
