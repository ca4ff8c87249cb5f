//! Scanning and health: what a driver says about its hardware.
//!
//! Owns the [`DeviceInventory`](inventory::DeviceInventory) trait a driver
//! implements, the device and health types a scan returns, the standard
//! attributes ([`attributes`]), health as device taints ([`taints`]) and the
//! kernel's hot-plug events ([`uevent`]).
//!
//! The first step of the data flow and the bottom layer: nothing here talks
//! to the API server or to kubelet, and it imports from no other top-level
//! module (not even `prepare`: the inventory does not know the driver that
//! prepares its devices; `daemon::node_driver` pairs them). The structure
//! test enforces each layer's rule. The loop that runs scans lives in
//! `daemon::rescan`.

pub mod attributes;
pub(crate) mod inventory;
pub(crate) mod taints;
pub(crate) mod uevent;
