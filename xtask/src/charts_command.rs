//! `cargo xtask charts check|scan|render`: the Helm charts, checked with
//! real Helm ([`crate::chart_checks`]), scanned by a third-party policy
//! scanner ([`crate::chart_scan`]) or rendered for `kubectl apply`
//! ([`crate::chart_render`]).

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::chart_expect::{NAMESPACE, RELEASE};
use crate::chart_specs::CHARTS;
use crate::{chart_checks, chart_render, chart_scan, helm, paths};

#[derive(clap::Args)]
pub struct ChartsArgs {
    #[command(subcommand)]
    command: ChartsCommand,
}

#[derive(clap::Subcommand)]
enum ChartsCommand {
    /// helm lint --strict + helm template (default and non-default values) + assertions.
    Check,
    /// checkov (pinned, from PyPI) on the default renderings: only the
    /// failures docs/install.md explains, at most 4 per chart.
    Scan,
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
        ChartsCommand::Scan => chart_scan::scan(&helm, &root),
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
