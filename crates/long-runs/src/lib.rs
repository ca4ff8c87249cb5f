//! The long runs: measurements and fault injection on the same testbeds as
//! the end-to-end scenarios (the `e2e` crate, on the `local-cluster` crate's
//! real components). They are documented commands, run before an issue is
//! resolved and reported with figures, not CI steps; their unit tests (the
//! parsers and the arithmetic of the reports) run in CI.
//!
//! - [`bench`](mod@bench): `cargo xtask bench`, our drivers against a Go reference
//!   (single pods, bursts, idle cost, a fleet of publishers);
//! - [`chaos`]: `cargo xtask chaos`, the drivers killed, restarted and
//!   starved of disk while pods come and go, with the end checks;
//! - [`autoscale`]: `cargo xtask autoscale karpenter`, Karpenter
//!   provisioning a node for a pod's claim from our templates;
//! - [`lws`]: `cargo xtask lws`, a LeaderWorkerSet (its controller built
//!   from its Go module) running a 4-node job on one Trn2 UltraServer of
//!   real kubelets, as AWS documents it.

pub mod autoscale;
pub mod bench;
pub mod chaos;
pub mod lws;
