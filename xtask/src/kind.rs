//! `cargo xtask e2e --cluster kind`: the end-to-end suite on a kind cluster.
//!
//! Generates the kind cluster config (CDI on in containerd, one p5-like and
//! one trn2-like worker, each with its fixture hardware tree mounted at the
//! same path [`FIXTURE_MOUNT`] and labelled with its instance type so the
//! charts' node affinity applies unchanged) and the Helm values that point
//! both drivers at the fixtures. Bring-up needs Docker and `kind`; without a
//! Docker engine it stops at once and names `--cluster local`.
//!
//! Limits: this machine has no Docker engine, so only the generated config
//! and values are tested here (unit tests, and `cargo xtask charts check`
//! renders both charts with these values); the bring-up path itself has not
//! run yet.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::charts::ChartSpec;

/// Where each kind node sees its own fixture tree (`sys/`, `dev/`).
pub const FIXTURE_MOUNT: &str = "/opt/aws-dra/fixture";
/// Image name loaded into the kind nodes (never pulled).
pub const IMAGE_REPOSITORY: &str = "aws-dra-drivers";
pub const IMAGE_TAG: &str = "e2e";
pub const CLUSTER_NAME: &str = "aws-dra-e2e";

/// A worker node: the instance type it pretends to be and its fixture tree.
#[derive(Debug, Clone)]
pub struct FixtureNode {
    pub instance_type: &'static str,
    /// Host directory holding `sys/` and `dev/` (from `cargo xtask fixtures`).
    pub fixture_dir: PathBuf,
}

/// The two workers of the e2e: one GPU+EFA node, one Neuron+EFA node.
pub fn default_nodes(fixtures_root: &Path) -> Vec<FixtureNode> {
    ["p5.48xlarge", "trn2.48xlarge"]
        .into_iter()
        .map(|t| FixtureNode {
            instance_type: t,
            fixture_dir: fixtures_root.join(t),
        })
        .collect()
}

/// The kind `Cluster` config as YAML.
pub fn cluster_config(nodes: &[FixtureNode]) -> Result<String> {
    let mut node_list = vec![json!({"role": "control-plane"})];
    for n in nodes {
        let dir = n
            .fixture_dir
            .to_str()
            .with_context(|| format!("fixture path is not UTF-8: {}", n.fixture_dir.display()))?;
        node_list.push(json!({
            "role": "worker",
            // kubelet may set node.kubernetes.io/* labels on itself, so the
            // charts' instance-type affinity selects these nodes as on EKS.
            "labels": {
                "node.kubernetes.io/instance-type": n.instance_type,
                "aws-dra.dev/fixture": "true",
            },
            "extraMounts": [{
                "hostPath": dir,
                "containerPath": FIXTURE_MOUNT,
                "readOnly": true,
            }],
        }));
    }
    let config = json!({
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": CLUSTER_NAME,
        // kind's containerd config is still the version-2 format. CDI is on
        // by default in containerd 2.x; say so explicitly, with the spec
        // directories the charts write to, so an older node image fails loud
        // rather than ignoring the drivers' device edits.
        "containerdConfigPatches": [
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n  enable_cdi = true\n  cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n"
        ],
        "nodes": node_list,
    });
    to_yaml(&config)
}

/// Helm values for one driver chart on the kind cluster.
pub fn helm_values(_spec: &ChartSpec) -> Result<String> {
    let values = json!({
        "image": {
            "repository": IMAGE_REPOSITORY,
            "tag": IMAGE_TAG,
            // Loaded with `kind load`, never pulled.
            "pullPolicy": "Never",
        },
        "logFormat": "text",
        "logLevel": "info,dra_core=debug",
        "hostPaths": {
            "sysfsRoot": format!("{FIXTURE_MOUNT}/sys"),
            "devRoot": format!("{FIXTURE_MOUNT}/dev"),
        },
    });
    to_yaml(&values)
}

fn to_yaml(v: &Value) -> Result<String> {
    serde_saphyr::to_string(v).map_err(|e| anyhow::anyhow!("serializing YAML: {e}"))
}

/// Why Docker cannot be used, or `None` when it can.
fn docker_unavailable() -> Option<String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(e) => Some(format!("`docker` could not be run ({e})")),
        Ok(out) if !out.status.success() => Some(format!(
            "no Docker engine answers ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    }
}

fn run_step(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("==> e2e(kind): {what}");
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Brings up the kind cluster with both charts installed on fixture nodes.
/// Returns the kubeconfig path for the scenarios.
pub fn bring_up(root: &Path, work: &Path) -> Result<PathBuf> {
    if let Some(why) = docker_unavailable() {
        bail!(
            "cargo xtask e2e --cluster kind needs Docker, but {why}.\n\
             Run the same scenarios without Docker on a local control plane:\n\
             \n    cargo xtask e2e --cluster local\n"
        );
    }
    if Command::new("kind").arg("version").output().is_err() {
        bail!(
            "`kind` is not on PATH (go install sigs.k8s.io/kind@v0.30.0), or use --cluster local"
        );
    }
    std::fs::create_dir_all(work)?;
    let fixtures = work.join("fixtures");
    let nodes = default_nodes(&fixtures);
    for n in &nodes {
        run_step(
            &format!("fixtures for {}", n.instance_type),
            Command::new("cargo")
                .current_dir(root)
                .args(["xtask", "fixtures", n.instance_type])
                .arg(&n.fixture_dir),
        )?;
    }
    let config = work.join("kind-config.yaml");
    std::fs::write(&config, cluster_config(&nodes)?)?;
    let kubeconfig = work.join("kubeconfig");
    run_step(
        "kind create cluster",
        Command::new("kind")
            .args(["create", "cluster", "--config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(&kubeconfig),
    )?;
    let image = format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}");
    run_step(
        "docker build",
        Command::new("docker")
            .current_dir(root)
            .args(["build", "-t", &image, "."]),
    )?;
    run_step(
        "kind load docker-image",
        Command::new("kind").args(["load", "docker-image", &image, "--name", CLUSTER_NAME]),
    )?;
    let helm = crate::helm::ensure(root)?;
    for spec in crate::charts::CHARTS {
        crate::charts::build_dependencies(&helm, root, spec)?;
        let values = work.join(format!("{}-values.yaml", spec.name));
        std::fs::write(&values, helm_values(spec)?)?;
        let kc = kubeconfig
            .to_str()
            .context("kubeconfig path is not UTF-8")?;
        let chart = root.join("charts").join(spec.name);
        let args = [
            "upgrade",
            "--install",
            spec.name,
            chart.to_str().context("chart path is not UTF-8")?,
            "--namespace",
            "aws-dra",
            "--create-namespace",
            "--kubeconfig",
            kc,
            "-f",
            values.to_str().context("values path is not UTF-8")?,
            "--wait",
            "--timeout",
            "5m",
        ];
        eprintln!("==> e2e(kind): helm {}", args.join(" "));
        helm.output(&args)?;
    }
    Ok(kubeconfig)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<FixtureNode> {
        default_nodes(Path::new("/work/.e2e/fixtures"))
    }

    #[test]
    fn cluster_config_has_cdi_and_one_fixture_per_worker() {
        let yaml = cluster_config(&nodes()).unwrap();
        let cfg: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(cfg["apiVersion"], "kind.x-k8s.io/v1alpha4");
        assert_eq!(cfg["kind"], "Cluster");
        let patch = cfg["containerdConfigPatches"][0].as_str().unwrap();
        assert!(
            patch.contains("[plugins.\"io.containerd.grpc.v1.cri\"]"),
            "{patch}"
        );
        assert!(patch.contains("enable_cdi = true"), "{patch}");
        assert!(patch.contains("\"/var/run/cdi\""), "{patch}");
        let nodes = cfg["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0]["role"], "control-plane");
        assert!(nodes[0]["extraMounts"].is_null());
        for (node, (ty, dir)) in nodes[1..].iter().zip([
            ("p5.48xlarge", "/work/.e2e/fixtures/p5.48xlarge"),
            ("trn2.48xlarge", "/work/.e2e/fixtures/trn2.48xlarge"),
        ]) {
            assert_eq!(node["role"], "worker");
            assert_eq!(node["labels"]["node.kubernetes.io/instance-type"], ty);
            let m = &node["extraMounts"][0];
            assert_eq!(m["hostPath"], dir);
            assert_eq!(m["containerPath"], FIXTURE_MOUNT);
            assert_eq!(m["readOnly"], true);
        }
    }

    #[test]
    fn the_labelled_instance_types_are_in_the_charts_default_affinity() {
        // Otherwise the DaemonSets would not schedule on the kind workers.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (chart, ty) in [
            ("efa-dra-driver", "p5.48xlarge"),
            ("efa-dra-driver", "trn2.48xlarge"),
            ("neuron-dra-driver", "trn2.48xlarge"),
        ] {
            let values: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(root.join("charts").join(chart).join("values.yaml"))
                    .unwrap(),
            )
            .unwrap();
            let types = values["nodeAffinity"]["instanceTypes"].as_array().unwrap();
            assert!(
                types.iter().any(|t| t == ty),
                "{chart} does not select {ty}"
            );
        }
    }

    #[test]
    fn helm_values_point_the_drivers_at_the_fixture_mount() {
        for spec in crate::charts::CHARTS {
            let v: Value = serde_saphyr::from_str(&helm_values(spec).unwrap()).unwrap();
            assert_eq!(v["hostPaths"]["sysfsRoot"], "/opt/aws-dra/fixture/sys");
            assert_eq!(v["hostPaths"]["devRoot"], "/opt/aws-dra/fixture/dev");
            assert_eq!(v["image"]["pullPolicy"], "Never");
            assert_eq!(v["image"]["repository"], IMAGE_REPOSITORY);
            // Every key must exist in the chart's values.yaml (the schema
            // refuses unknown keys; `charts check` renders with these too).
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let defaults: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(root.join("charts").join(spec.name).join("values.yaml"))
                    .unwrap(),
            )
            .unwrap();
            for (k, sub) in v.as_object().unwrap() {
                assert!(
                    !defaults[k].is_null(),
                    "{k} is not a value of {}",
                    spec.name
                );
                if let Some(sub) = sub.as_object() {
                    for k2 in sub.keys() {
                        assert!(
                            !defaults[k][k2].is_null(),
                            "{k}.{k2} is not a value of {}",
                            spec.name
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn without_docker_kind_stops_at_once_naming_cluster_local() {
        if docker_unavailable().is_none() {
            // A machine with Docker cannot show this path; the bring-up runs there.
            return;
        }
        let err = bring_up(Path::new("."), Path::new("/nonexistent/aws-dra-e2e"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--cluster local"), "{err}");
        assert!(!Path::new("/nonexistent/aws-dra-e2e").exists());
    }
}
