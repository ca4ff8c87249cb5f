//! What `run` needs of a driver: its inventory and the driver that prepares
//! the inventory's devices, paired here rather than in either trait, so
//! that the scan layer knows nothing of preparing and a program can use an
//! inventory with the publisher alone, or a driver with the plugin alone.

use crate::prepare::driver::Driver;
use crate::scan::inventory::DeviceInventory;

/// An inventory and its driver: what [`crate::run`] serves.
pub trait NodeDriver: DeviceInventory {
    /// The driver that prepares this inventory's devices.
    type Driver: Driver;

    /// The driver, sharing whatever state the scan keeps current. Called
    /// once, after the first successful scan.
    fn driver(&self) -> Self::Driver;
}
