//! Never serve EFAs next to the classic EFA device plugin.
//!
//! The device plugin advertises `vpc.amazonaws.com/efa` as an integer count
//! and hands EFAs to pods on its own; if this driver published the same EFAs,
//! one adapter could be given to two pods. The check itself (the Node's
//! `status.allocatable` has the resource with a quantity above zero, and
//! `--allow-device-plugin-coexistence` was not given) runs in
//! `dra-core` at start-up with [`DEVICE_PLUGIN_RESOURCES`].

/// Extended resources of the classic EFA device plugin.
pub const DEVICE_PLUGIN_RESOURCES: &[&str] = &["vpc.amazonaws.com/efa"];
