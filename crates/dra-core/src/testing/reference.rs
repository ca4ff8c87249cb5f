//! What the reference parts of the docs are generated from (`cargo xtask
//! docs`): a driver binary's command line as clap describes it, and every
//! metric the process registers.

use crate::daemon::cli::DriverCli;
use crate::daemon::node_driver::NodeDriver;
use crate::daemon::runner::Program;

pub use crate::daemon::metric_catalog::register_every_metric;

/// The command line of the binary `program` with the driver `I`'s own
/// flags, exactly as the binary parses it (`--help` is printed from it).
pub fn driver_command<I: NodeDriver>(program: &Program) -> clap::Command {
    DriverCli::<I::Flags>::command_for(program.binary, program.version, program.driver_name)
}

/// [`register_every_metric`] with the rescan prefix the binary `program`
/// gives its metrics (`aws_dra_efa` for `efa-driver`).
pub fn register_program_metrics(
    registry: &prometheus::Registry,
    program: &Program,
) -> Result<(), prometheus::Error> {
    register_every_metric(registry, &program.metrics_prefix())
}
