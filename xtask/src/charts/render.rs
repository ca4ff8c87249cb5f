//! `helm template` of a driver chart, after vendoring the shared library
//! chart into it. Used by `cargo xtask charts render` and by the chart
//! checks; it renders, it does not judge.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::charts::specs::ChartSpec;
use crate::helm::Helm;

/// Vendors the library chart into `charts/<chart>/charts/` (idempotent).
pub fn build_dependencies(helm: &Helm, root: &Path, spec: &ChartSpec) -> Result<()> {
    let dir = root.join("charts").join(spec.name);
    helm.output(&["dependency", "build", path_str(&dir)?])?;
    Ok(())
}

/// `helm template` of one chart: the YAML stream.
pub fn render(
    helm: &Helm,
    root: &Path,
    spec: &ChartSpec,
    release: &str,
    namespace: &str,
    values: &[PathBuf],
    kube_version: Option<&str>,
) -> Result<String> {
    build_dependencies(helm, root, spec)?;
    let dir = root.join("charts").join(spec.name);
    let mut args = vec![
        "template",
        release,
        path_str(&dir)?,
        "--namespace",
        namespace,
    ];
    for v in values {
        args.extend(["-f", path_str(v)?]);
    }
    if let Some(v) = kube_version {
        args.extend(["--kube-version", v]);
    }
    helm.output(&args)
}

/// `p` as the `&str` helm's argument list needs.
pub fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("path is not UTF-8: {}", p.display()))
}
