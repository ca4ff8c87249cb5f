//! `cargo xtask e2e --cluster kind`: the end-to-end suite on a kind cluster.
//!
//! Generates the kind cluster config (CDI on in containerd; one worker per
//! role of `e2e::kind_host::roles`, p5, trn2 and trn1, each labelled with its
//! instance type, so the charts' node affinity applies unchanged, and with
//! its role, `e2e.aws-dra.dev/node=<role>`, since kind generates node names;
//! each with its fixture hardware tree mounted at [`FIXTURE_MOUNT`]), brings
//! the cluster up, builds the Dockerfile's image and loads it with the
//! suite's own images (the probe the example pods run, and one with
//! `gpu-test-driver`), then runs the shared scenarios there
//! (`cargo test -p e2e --test scenarios_kind`): the scenarios' testbed
//! installs both charts with [`crate::chart_specs::kind_helm_values`] (one
//! release per chart) and drives the DaemonSets as on the local cluster
//! (`tests/scenarios_chart.rs`).
//! Without a Docker engine it stops at once and names `--cluster local`.
//!
//! Limits: this machine has no Docker engine, so the bring-up here and the
//! kind run of the scenarios have not run; what can be checked is: the
//! generated config and values (unit tests; `cargo xtask charts check`
//! renders both charts with those values), the `docker exec` plumbing of
//! the kind host (its unit tests), and the scenarios and chart-installed
//! testbed themselves on the local cluster.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use e2e::chart_testbed::host::ROLE_LABEL;
use serde_json::{Value, json};

pub use e2e::kind_host::{CLUSTER_NAME, FIXTURE_MOUNT, IMAGE_REPOSITORY, IMAGE_TAG};

/// A worker node: its role, the instance type it pretends to be, its fixture tree.
#[derive(Debug, Clone)]
pub struct FixtureNode {
    pub role: String,
    pub instance_type: String,
    /// Host directory holding `sys/` and `dev/`.
    pub fixture_dir: PathBuf,
}

/// The workers of the e2e: the roles the scenarios use.
pub fn default_nodes(fixtures_root: &Path) -> Vec<FixtureNode> {
    e2e::kind_host::roles()
        .into_iter()
        .map(|(role, instance_type, _)| FixtureNode {
            fixture_dir: fixtures_root.join(&role),
            role,
            instance_type,
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
                ROLE_LABEL: n.role,
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

/// Stops with the message of a machine without Docker or kind.
pub fn check_tools() -> Result<()> {
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
    Ok(())
}

/// Brings up the kind cluster of [`default_nodes`] with the images loaded
/// (the charts are installed by the scenarios' testbed). `bin_dir` holds the
/// three driver binaries, `probe_archive` the probe image. Returns the
/// kubeconfig path.
pub fn bring_up(root: &Path, work: &Path, bin_dir: &Path, probe_archive: &Path) -> Result<PathBuf> {
    check_tools()?;
    std::fs::create_dir_all(work)?;
    let fixtures = work.join("fixtures");
    let nodes = default_nodes(&fixtures);
    for n in &nodes {
        if n.fixture_dir.exists() {
            std::fs::remove_dir_all(&n.fixture_dir)
                .with_context(|| format!("removing {}", n.fixture_dir.display()))?;
        }
        let fixture = sysfs_fixtures::generate(&n.instance_type, &n.fixture_dir)
            .with_context(|| format!("fixture for {} ({})", n.role, n.instance_type))?;
        // containerd in the node opens the device nodes the CDI specs name
        // (under the mounted fixture): empty files would fail every pod.
        if fixture.device_nodes != sysfs_fixtures::DeviceNodes::CharDevices {
            bail!(
                "the fixture of {} got plain files instead of character devices \
                 (mknod needs root): run cargo xtask e2e --cluster kind as root",
                n.role
            );
        }
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
    let drivers_archive = work.join("drivers.oci.tar");
    e2e::image::write_archive(
        &e2e::chart_testbed::local_host::driver_image_spec(bin_dir)?,
        &drivers_archive,
    )?;
    for archive in [&drivers_archive, &probe_archive.to_path_buf()] {
        run_step(
            &format!("kind load image-archive {}", archive.display()),
            Command::new("kind")
                .args(["load", "image-archive"])
                .arg(archive)
                .args(["--name", CLUSTER_NAME]),
        )?;
    }
    Ok(kubeconfig)
}

/// Runs the shared scenarios on the cluster (`cargo test -p e2e --test
/// scenarios_kind`); figures to `figures`.
pub fn run_scenarios(root: &Path, kubeconfig: &Path, work: &Path, figures: &Path) -> Result<()> {
    let started = Instant::now();
    let status = Command::new("cargo")
        .current_dir(root)
        .args(["test", "--locked", "-p", "e2e", "--test", "scenarios_kind"])
        .env("AWS_DRA_KIND_KUBECONFIG", kubeconfig)
        .env("AWS_DRA_KIND_WORK", work.join("testbed"))
        .env("AWS_DRA_E2E_FIGURES", figures)
        .status()
        .context("running cargo test -p e2e --test scenarios_kind")?;
    eprintln!(
        "==> e2e(kind): scenarios took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!(
            "the scenarios failed on kind ({status}); node logs: kind export logs --name {CLUSTER_NAME}"
        );
    }
    Ok(())
}

/// `kind delete cluster`.
pub fn delete() -> Result<()> {
    run_step(
        "kind delete cluster",
        Command::new("kind").args(["delete", "cluster", "--name", CLUSTER_NAME]),
    )
}

#[cfg(test)]
mod tests {
    use e2e::DriverKind;

    use super::*;

    fn nodes() -> Vec<FixtureNode> {
        default_nodes(Path::new("/work/.e2e/fixtures"))
    }

    #[test]
    fn cluster_config_has_cdi_and_one_fixture_per_role() {
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
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0]["role"], "control-plane");
        assert!(nodes[0]["extraMounts"].is_null());
        for (node, (role, ty)) in nodes[1..].iter().zip([
            ("p5", "p5.48xlarge"),
            ("trn2", "trn2.48xlarge"),
            ("trn1", "trn1.32xlarge"),
        ]) {
            assert_eq!(node["role"], "worker");
            assert_eq!(node["labels"]["node.kubernetes.io/instance-type"], ty);
            // The scenarios find kind's generated node names by this label.
            assert_eq!(node["labels"]["e2e.aws-dra.dev/node"], role);
            let m = &node["extraMounts"][0];
            assert_eq!(m["hostPath"], format!("/work/.e2e/fixtures/{role}"));
            assert_eq!(m["containerPath"], FIXTURE_MOUNT);
            assert_eq!(m["readOnly"], true);
        }
    }

    #[test]
    fn the_labelled_instance_types_are_in_the_charts_default_affinity() {
        // Otherwise the DaemonSets would not schedule on the kind workers.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for n in nodes() {
            for (chart, kind) in [
                ("efa-dra-driver", DriverKind::Efa),
                ("neuron-dra-driver", DriverKind::Neuron),
            ] {
                let runs = e2e::kind_host::roles()
                    .iter()
                    .any(|(r, _, d)| *r == n.role && d.contains(&kind));
                if !runs {
                    continue;
                }
                let values: Value = serde_saphyr::from_str(
                    &std::fs::read_to_string(root.join("charts").join(chart).join("values.yaml"))
                        .unwrap(),
                )
                .unwrap();
                let types = values["nodeAffinity"]["instanceTypes"].as_array().unwrap();
                assert!(
                    types.iter().any(|t| t == n.instance_type.as_str()),
                    "{chart} does not select {}",
                    n.instance_type
                );
            }
        }
    }

    #[test]
    fn without_docker_kind_stops_at_once_naming_cluster_local() {
        if docker_unavailable().is_none() {
            // A machine with Docker cannot show this path; the bring-up runs there.
            return;
        }
        let err = bring_up(
            Path::new("."),
            Path::new("/nonexistent/aws-dra-e2e"),
            Path::new("/nonexistent/bin"),
            Path::new("/nonexistent/probe.oci.tar"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--cluster local"), "{err}");
        assert!(!Path::new("/nonexistent/aws-dra-e2e").exists());
    }
}
