//! Scanning and health: what a driver says about its hardware.
//!
//! Owns the [`DeviceInventory`](inventory::DeviceInventory) trait a driver
//! implements, the device and health types a scan returns, the standard
//! attributes ([`attributes`]), health as device taints ([`taints`]) and the
//! kernel's hot-plug events ([`uevent`]).
//!
//! The first step of the data flow: nothing here talks to the API server or
//! to kubelet, and nothing here may import from `publish`, `kubelet` or
//! `daemon` (the structure test forbids import circles between top-level
//! modules). The loop that runs scans lives in `daemon::rescan`.

pub mod attributes;
pub(crate) mod inventory;
pub(crate) mod reuse;
pub(crate) mod taints;
pub(crate) mod uevent;
