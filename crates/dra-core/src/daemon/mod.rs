//! The daemon: one driver process from `main` to shutdown.
//!
//! Owns the command line ([`cli`]), the API client ([`client`]), the one
//! rescan loop that feeds scans to the publisher and to kubelet's health
//! stream ([`rescan`]), readiness ([`ready`]), the `/metrics` and `/healthz`
//! server ([`ops`]), `discover --instance-type`'s templates ([`template`]),
//! and the start-up order: [`runner`] sets up the process
//! (logging, runtime, signals) and [`runtime`] starts the plugin, the
//! publisher and the ops server in that order.
//!
//! The last step of the data flow: it may import from every other top-level
//! module, and none of them may import from it.

pub(crate) mod apiserver;
pub(crate) mod checkpoint_event;
pub(crate) mod claim_status;
pub(crate) mod cli;
pub(crate) mod client;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod metric_catalog;
#[cfg(test)]
mod metric_names;
pub(crate) mod node_driver;
pub(crate) mod ops;
pub(crate) mod ready;
pub(crate) mod request_deadline;
pub(crate) mod rescan;
pub(crate) mod runner;
pub(crate) mod runtime;
pub(crate) mod template;
