//! The drivers' Helm charts, rendered with the project's own `helm` for the
//! objects the suite applies: DeviceClasses, ServiceAccounts, RBAC and the
//! ValidatingAdmissionPolicy (+ binding).
//!
//! The suite runs the drivers as host processes, so the DaemonSet, the
//! metrics Service and ServiceMonitor are left out; everything else is
//! applied as rendered, server-side, so the API server validates it.
//!
//! `helm` is the binary `cargo xtask charts check` builds from its Go module
//! into `<cache>/helm/<version>/helm` (`AWS_DRA_CACHE_DIR` or `~/.cache/aws-dra`; the version pinned by
//! `e2e/go/helm/go.mod`); `AWS_DRA_HELM` overrides the path. This module
//! never builds it: `cargo xtask e2e --cluster local` does that first.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::manifests;
use local_cluster::error::{Error, Result, io};
use local_cluster::toolchain::repo_root;

/// Release name the suite renders the charts under.
pub const RELEASE: &str = "dra";
/// Namespace of the drivers' ServiceAccounts.
pub const NAMESPACE: &str = "aws-dra";

/// Kinds the suite does not apply (the drivers run as host processes).
pub const SKIPPED_KINDS: [&str; 3] = ["DaemonSet", "Service", "ServiceMonitor"];

/// Taken (exclusively) while a helm command names a path under the
/// repository's `charts/` directory; `None` when none of `args` does.
///
/// `helm dependency build` rewrites `charts/<chart>/charts/` through a
/// `tmpcharts-<pid>` directory inside the chart, and a helm process that
/// loads the same chart meanwhile fails (`lstat …/tmpcharts-<pid>: no such
/// file or directory`). Processes that run helm side by side (CI's e2e legs,
/// the chart checks) therefore take turns on `charts/.helm.lock`; each helm
/// command is short (none of ours waits for a rollout).
pub fn chart_dirs_lock(args: &[&str]) -> std::io::Result<Option<std::fs::File>> {
    let charts = repo_root().join("charts").canonicalize()?;
    let names_a_chart = args.iter().any(|a| {
        Path::new(a)
            .canonicalize()
            .is_ok_and(|path| path.starts_with(&charts))
    });
    if !names_a_chart {
        return Ok(None);
    }
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(charts.join(".helm.lock"))?;
    file.lock()?;
    Ok(Some(file))
}

/// One driver chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chart {
    /// Directory under `charts/`.
    pub name: &'static str,
}

pub const EFA_CHART: Chart = Chart {
    name: "efa-dra-driver",
};
pub const NEURON_CHART: Chart = Chart {
    name: "neuron-dra-driver",
};

impl Chart {
    /// The ServiceAccount the chart's DaemonSet runs as (`<release>-<chart>`).
    pub fn service_account(&self) -> String {
        format!("{RELEASE}-{}", self.name)
    }
}

/// `helm` with private config/cache/data dirs, found as described above.
#[derive(Debug, Clone)]
pub struct Helm {
    pub binary: PathBuf,
    home: PathBuf,
}

/// The version `e2e/go/helm/go.mod` requires of `helm.sh/helm/v4`.
pub fn pinned_helm_version(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|l| {
        let l = l.trim().trim_start_matches("require").trim();
        let mut words = l.split_whitespace();
        (words.next() == Some("helm.sh/helm/v4"))
            .then(|| words.next())
            .flatten()
            .filter(|v| v.starts_with('v'))
            .map(str::to_owned)
    })
}

impl Helm {
    pub fn locate() -> Result<Helm> {
        let not_built = |path: &Path| Error::MissingBinary {
            what: "helm (built by `cargo xtask charts check` or `cargo xtask e2e --cluster local`)"
                .into(),
            path: path.to_path_buf(),
        };
        if let Some(p) = std::env::var_os("AWS_DRA_HELM") {
            let binary = PathBuf::from(p);
            if !binary.is_file() {
                return Err(not_built(&binary));
            }
            let home = binary
                .parent()
                .map_or_else(|| PathBuf::from("."), |d| d.join("home"));
            return Ok(Helm { binary, home });
        }
        let go_mod = repo_root().join("e2e/go/helm/go.mod");
        let text = std::fs::read_to_string(&go_mod).map_err(io("reading", &go_mod))?;
        let version = pinned_helm_version(&text).ok_or_else(|| Error::Manifest {
            what: go_mod.display().to_string(),
            message: "does not require helm.sh/helm/v4".into(),
        })?;
        // The cache xtask's helm module builds into.
        let cache = local_cluster::toolchain::cache_root();
        let dir = cache.join("helm").join(&version);
        let binary = dir.join("helm");
        if !binary.is_file() {
            return Err(not_built(&binary));
        }
        Ok(Helm {
            binary,
            home: dir.join("home"),
        })
    }

    pub(crate) fn run(&self, args: &[&str]) -> Result<String> {
        let lock = repo_root().join("charts/.helm.lock");
        let _turn = chart_dirs_lock(args).map_err(io("locking", &lock))?;
        let out = Command::new(&self.binary)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .args(args)
            .output()
            .map_err(|source| Error::Spawn {
                command: self.binary.display().to_string(),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::Helm {
                args: args.join(" "),
                message: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        String::from_utf8(out.stdout).map_err(|e| Error::Helm {
            args: args.join(" "),
            message: format!("non-UTF-8 output: {e}"),
        })
    }

    /// `helm dependency build` + `helm template` of `chart` with default
    /// values: every rendered object.
    pub fn render(&self, chart: Chart) -> Result<Vec<Value>> {
        self.render_with_values(chart, &[])
    }

    /// As [`Self::render`], with values files relative to the chart's
    /// directory (e.g. `ci/nondefault-values.yaml`).
    pub fn render_with_values(&self, chart: Chart, values: &[&str]) -> Result<Vec<Value>> {
        self.render_for(chart, values, None)
    }

    /// As [`Self::render_with_values`], for a cluster of `kube_version`
    /// (`v1.37.2`: what `.Capabilities.KubeVersion` says, so version-gated
    /// defaults such as the extended-resource DeviceClasses follow the
    /// cluster as they do on `helm install`).
    pub fn render_for(
        &self,
        chart: Chart,
        values: &[&str],
        kube_version: Option<&str>,
    ) -> Result<Vec<Value>> {
        let dir = repo_root().join("charts").join(chart.name);
        let dir_str = dir.to_str().ok_or_else(|| Error::Manifest {
            what: dir.display().to_string(),
            message: "path is not UTF-8".into(),
        })?;
        self.run(&["dependency", "build", dir_str])?;
        let files: Vec<String> = values
            .iter()
            .map(|v| dir.join(v).display().to_string())
            .collect();
        let mut args = vec!["template", RELEASE, dir_str, "--namespace", NAMESPACE];
        for file in &files {
            args.extend(["-f", file.as_str()]);
        }
        if let Some(v) = kube_version {
            args.extend(["--kube-version", v]);
        }
        let yaml = self.run(&args)?;
        manifests::parse(&format!("helm template {} {values:?}", chart.name), &yaml)
    }
}

/// What both charts render for the cluster `client` reaches (its version
/// decides the version-gated defaults), without the kinds the suite skips.
pub async fn cluster_objects(helm: &Helm, client: &kube::Client) -> Result<Vec<Value>> {
    let version = client
        .apiserver_version()
        .await
        .map_err(|source| Error::Kube {
            action: "reading the API server version".into(),
            source,
        })?
        .git_version;
    let mut objects = Vec::new();
    for chart in [EFA_CHART, NEURON_CHART] {
        objects.extend(applied_objects(&helm.render_for(
            chart,
            &[],
            Some(&version),
        )?));
    }
    Ok(objects)
}

/// The objects of a rendered chart the suite applies.
pub fn applied_objects(rendered: &[Value]) -> Vec<Value> {
    rendered
        .iter()
        .filter(|o| !SKIPPED_KINDS.iter().any(|k| o["kind"].as_str() == Some(*k)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_commands_on_a_chart_directory_take_turns() {
        let chart = repo_root().join("charts").join(EFA_CHART.name);
        let chart = chart.to_str().unwrap();
        assert!(chart_dirs_lock(&["version"]).unwrap().is_none());
        let held = chart_dirs_lock(&["dependency", "build", chart])
            .unwrap()
            .expect("a chart directory is locked");
        let other = std::fs::File::open(repo_root().join("charts/.helm.lock")).unwrap();
        assert!(
            matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
            "a second holder got the lock"
        );
        drop(held);
        // Blocking: another process (a CI leg) may take a turn first.
        other.lock().expect("free once the first holder is done");
    }

    #[test]
    fn pinned_version_is_read_from_the_require_line() {
        assert_eq!(
            pinned_helm_version("module m\nrequire (\n\thelm.sh/helm/v4 v4.0.1\n)\n").as_deref(),
            Some("v4.0.1")
        );
        assert_eq!(pinned_helm_version("module m\n"), None);
        let committed = std::fs::read_to_string(repo_root().join("e2e/go/helm/go.mod")).unwrap();
        assert!(pinned_helm_version(&committed).is_some());
    }

    #[test]
    fn daemonsets_and_services_are_not_applied() {
        let objs: Vec<Value> = [
            "DaemonSet",
            "Service",
            "DeviceClass",
            "ClusterRole",
            "ServiceMonitor",
        ]
        .iter()
        .map(|k| serde_json::json!({"kind": k, "metadata": {"name": "x"}}))
        .collect();
        let kept: Vec<String> = applied_objects(&objs).iter().map(manifests::id).collect();
        assert_eq!(kept, ["DeviceClass/x", "ClusterRole/x"]);
    }

    #[test]
    fn service_account_names_follow_the_chart_fullname() {
        assert_eq!(EFA_CHART.service_account(), "dra-efa-dra-driver");
        assert_eq!(NEURON_CHART.service_account(), "dra-neuron-dra-driver");
    }
}
