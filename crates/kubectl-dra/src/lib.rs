//! `kubectl dra`: why a DRA claim is pending, and which devices are free.
//!
//! The library holds everything the binary does apart from argument parsing
//! and printing, so that tests and the benchmark drive the same code:
//! [`inventory`] loads objects (from files, or the API server through
//! [`online`]) and keeps ResourceSlices in the compact form of [`slices`], [`cel`]
//! evaluates selectors as kube-scheduler does, [`explain`] works out per
//! request which devices qualify and why the others do not, [`devices`]
//! builds the device table, [`topology`] draws one node.

pub mod cel;
pub mod devices;
pub mod explain;
pub mod inventory;
pub mod lookup;
pub mod online;
pub mod render;
pub mod slices;
pub mod topology;
pub mod world;
