//! `cargo xtask charts check|render`: the Helm charts, checked with real Helm
//! ([`crate::chart_checks`]) or rendered for `kubectl apply`
//! ([`crate::chart_render`]).

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::chart_expect::{NAMESPACE, RELEASE};
use crate::chart_specs::CHARTS;
use crate::{chart_checks, chart_render, helm, paths};

#[derive(clap::Args)]
pub struct ChartsArgs {
    #[command(subcommand)]
    command: ChartsCommand,
}

#[derive(clap::Subcommand)]
enum ChartsCommand {
    /// helm lint --strict + helm template (default and non-default values) + assertions.
    Check,
    /// Print the rendered manifests of one chart (for `kubectl apply`).
    Render {
        /// efa-dra-driver or neuron-dra-driver
        chart: String,
        /// Extra values files, as `helm template -f`.
        #[arg(short = 'f', long = "values")]
        values: Vec<PathBuf>,
        #[arg(long, default_value = NAMESPACE)]
        namespace: String,
        #[arg(long, default_value = RELEASE)]
        release: String,
    },
}

pub fn run(args: ChartsArgs) -> Result<()> {
    let root = paths::repo_root();
    let helm = helm::ensure(&root)?;
    match args.command {
        ChartsCommand::Check => chart_checks::check(&helm, &root),
        ChartsCommand::Render {
            chart,
            values,
            namespace,
            release,
        } => {
            let spec = CHARTS
                .into_iter()
                .find(|c| c.name == chart)
                .with_context(|| {
                    format!("unknown chart {chart}: efa-dra-driver or neuron-dra-driver")
                })?;
            print!(
                "{}",
                chart_render::render(&helm, &root, spec, &release, &namespace, &values, None)?
            );
            Ok(())
        }
    }
}
