//! `kubectl dra topology NODE`: one node's accelerators as a picture.
//!
//! People pair GPUs with EFAs by PCIe root and Neuron chips with EFAs by
//! device group; a table (`kubectl dra devices`) lists those attributes, but
//! whether four free chips and four free EFAs share a group is quicker seen
//! than read. This module turns what the node publishes into a [`NodeTopology`]
//! (PCIe roots with the devices on each, the Neuron chips on their grid with
//! their NeuronCore partitions, device groups as short labels, who holds what,
//! which taints apply); [`text`] and [`svg`] draw it.
//!
//! Everything comes from the ResourceSlices, claims and DeviceTaintRules the
//! scheduler sees (the [`World`](crate::world::World)), never from the node
//! itself, so the picture shows what allocation works with. Devices are
//! recognised by the attributes the drivers publish (`resourceType`,
//! `deviceId`, `coreId`, `topology_x`, `resource.kubernetes.io/pcieRoot`, …),
//! not by their names, which differ between driver versions.
//!
//! The parts: `model` is the picture (what [`text`] and [`svg`] draw, and
//! what `-o json|yaml` prints), `unit` reads one published device into a
//! [`Unit`], `build` lays out the node (roots, grid, group labels), and
//! `natural` orders device names as people count.

mod build;
mod model;
mod natural;
pub mod svg;
pub mod text;
mod unit;

#[cfg(test)]
mod tests;

pub use build::{TopologyError, build};
pub use model::{
    ChipCell, GroupLabel, NeuronGrid, NodeTopology, PcieRootBox, State, TaintMark, TroubleLine,
    Unit, UnitKind,
};
