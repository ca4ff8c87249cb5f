//! Node autoscalers on claims: `cargo xtask autoscale karpenter`, Karpenter
//! (its kwok cloud provider, our drivers' `discover --instance-type`
//! templates attached to its instance types) provisioning a node for a
//! pod's claim on the local control plane, the drivers then publishing on
//! that node's fixture and the pod bound ([`karpenter`]). What it shows and
//! the figures are in docs/autoscaling.md.
//!
//! Layers: `karpenter` runs the scenario with `tools` (building the Go
//! programs), `objects` (what it applies), `observe` (what it reads) and
//! `report`; those four import none of each other.

pub mod karpenter;
pub mod objects;
pub mod observe;
pub mod report;
pub mod tools;
