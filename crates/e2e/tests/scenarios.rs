//! The end-to-end scenarios (see `e2e::scenarios`) on one local cluster.
//!
//! A harness of its own (libtest-mimic) so that every scenario is a named
//! test (`cargo test -p e2e --test scenarios -- s05` runs one, `--list`
//! lists them) while all of them share one bring-up, started lazily by the
//! first scenario that runs and torn down after the last. Scenarios run one
//! at a time, in order.
//!
//! After the run it prints the figures (driver start → slices visible,
//! prepare latency, driver RSS) and writes them as JSON to
//! `$AWS_DRA_E2E_FIGURES` when set (`cargo xtask e2e --cluster local` reads
//! them from there).
//!
//! Needs root, `cargo xtask k8s build`, helm (built by `cargo xtask charts
//! check`), and the driver binaries (`cargo build -p efa-driver -p
//! neuron-driver -p e2e --bins`); `cargo xtask e2e --cluster local` does all
//! of that first.

use std::process::ExitCode;

use e2e::{LocalOptions, LocalTestbed};

mod harness;

fn main() -> ExitCode {
    harness::main::<LocalTestbed>(
        Box::new(|enable| {
            Box::pin(LocalTestbed::start(LocalOptions {
                enable,
                ..LocalOptions::default()
            }))
        }),
        "AWS_DRA_E2E_FIGURES",
    )
}
