//! The end-to-end scenarios (see `e2e::scenarios`) with the drivers
//! installed by `helm upgrade --install` of the repository's charts, as pods
//! of their DaemonSets on a local cluster (`e2e::chart_testbed`): the same
//! trials as `tests/scenarios.rs`, which runs the drivers as host processes.
//!
//! Figures go to `$AWS_DRA_E2E_CHART_FIGURES` when set. Needs what
//! `tests/scenarios.rs` needs (`cargo xtask e2e --cluster local` provides it).

use std::process::ExitCode;

use e2e::{ChartTestbed, DriverKind, LocalChartHost, LocalOptions, TeardownReport};

mod harness;

impl harness::Bed for ChartTestbed<LocalChartHost> {
    fn start_times(&self) -> Vec<(String, DriverKind, std::time::Duration)> {
        ChartTestbed::start_times(self)
    }
    fn admin_kubeconfig(&self) -> std::path::PathBuf {
        ChartTestbed::admin_kubeconfig(self).to_path_buf()
    }
    fn shutdown(self) -> TeardownReport {
        ChartTestbed::shutdown(self)
    }
}

fn main() -> ExitCode {
    harness::main::<ChartTestbed<LocalChartHost>>(
        Box::new(|| {
            Box::pin(async {
                ChartTestbed::start_local(&LocalOptions::default().nodes, None).await
            })
        }),
        "AWS_DRA_E2E_CHART_FIGURES",
    )
}
