//! `kubectl dra`: why a DRA claim is pending, and which devices are free.
//!
//! The library holds everything the binary does apart from argument parsing
//! and printing (`main.rs`), so that tests and the benchmark drive the same
//! code. Data flows from the inputs to the three commands:
//!
//! - [`inventory`]: loads the objects from files (`-f`: `kubectl get` dumps
//!   and our drivers' `discover` output); `document` reads a file object by
//!   object.
//! - [`online`]: the same objects from the API server, with kubectl's
//!   kubeconfig rules; `pages` lists in pages with progress.
//! - [`slices`]: ResourceSlices in the compact form kept for a whole fleet
//!   (strings interned, only what allocation reads).
//! - [`world`]: the devices the scheduler can see, who holds each and what is
//!   left of each shared counter; every command reads from it.
//! - [`cel`]: selectors evaluated as kube-scheduler does, per Kubernetes
//!   release ([`cel::release`]); `check` refuses what the API server
//!   refuses, `macros` adds what the `cel` crate lacks (`types` the type
//!   values, `timestamps` Go's reading of timestamps, `ordering` each
//!   release's ordering of a NaN), `reads` finds what of `device` a selector
//!   reads (so that only that is built, and outcomes are reused).
//! - [`explain`]: `explain claim|pod`, one verdict per claim;
//!   [`explain::subject`] finds what is explained (a claim, or each claim of
//!   a pod), `request` checks one request against every device, `solve` fits
//!   the requests together on one node under the constraints, `allocated`
//!   checks a claim that is already allocated and [`explain::device_status`]
//!   shows what the drivers wrote in its `status.devices`.
//! - [`lookup`]: `-A` for `explain`: the namespace that holds the claim or pod.
//! - [`render`]: an explanation as plain text.
//! - [`devices`]: `devices`: the device table.
//! - [`topology`]: `topology NODE`: one node as a picture, drawn by
//!   [`topology::text`] for a terminal and [`topology::svg`] for docs.

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
