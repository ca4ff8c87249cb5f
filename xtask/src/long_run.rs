//! What the long runs on a local cluster of their own (`cargo xtask lws`,
//! `cargo xtask autoscale karpenter`) are told alike.

use std::path::PathBuf;

/// The cluster release a long run brings up and where its report goes.
#[derive(clap::Args)]
pub struct RunTarget {
    /// Kubernetes release (a minor such as `1.37`, or an exact version).
    #[arg(long, default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    pub kubernetes: String,
    /// Where the JSON report goes (relative to the repository root).
    #[arg(long, default_value = ".e2e")]
    pub work_dir: PathBuf,
}

impl RunTarget {
    /// The release, resolved to an exact version.
    pub fn version(&self) -> anyhow::Result<e2e::KubernetesVersion> {
        Ok(e2e::KubernetesVersion::resolve(&self.kubernetes)?)
    }
}
