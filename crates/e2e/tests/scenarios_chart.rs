//! The end-to-end scenarios (see `e2e::scenarios`) with the drivers
//! installed by `helm upgrade --install` of the repository's charts, as pods
//! of their DaemonSets on a local cluster (`e2e::chart_testbed`): the same
//! trials as `tests/scenarios.rs`, which runs the drivers as host processes.
//!
//! Figures go to `$AWS_DRA_E2E_CHART_FIGURES` when set. Needs what
//! `tests/scenarios.rs` needs (`cargo xtask e2e --cluster local` provides it).

use std::process::ExitCode;

use e2e::{ChartTestbed, LocalChartHost, LocalOptions};

mod harness;

fn main() -> ExitCode {
    harness::main::<ChartTestbed<LocalChartHost>>(
        // No `TestbedOp::EnableFeatureGates` here: nothing to turn on.
        Box::new(|_| Box::pin(async { ChartTestbed::start_local(&LocalOptions::default()).await })),
        "AWS_DRA_E2E_CHART_FIGURES",
    )
}
