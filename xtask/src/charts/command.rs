//! `cargo xtask charts check|scan|render`: the Helm charts, checked with
//! real Helm ([`crate::charts::checks`]), scanned by a third-party policy
//! scanner ([`crate::charts::scan`]) or rendered for `kubectl apply`
//! ([`crate::charts::render`]).

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::{checks, render, scan};
use crate::charts::expect::{NAMESPACE, RELEASE};
use crate::charts::specs::CHARTS;
use crate::{helm, paths};

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
        ChartsCommand::Check => checks::check(&helm, &root),
        ChartsCommand::Scan => scan::scan(&helm, &root),
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
                render::render(&helm, &root, spec, &release, &namespace, &values, None)?
            );
            Ok(())
        }
    }
}
