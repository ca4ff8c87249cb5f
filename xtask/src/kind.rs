//! `cargo xtask e2e --cluster kind`: the end-to-end suite on a kind cluster.
//!
//! Generates the kind cluster config (CDI on in containerd; one worker per
//! role of `e2e::kind_host::roles`: p5, trn2, trn1 and the 4 trn2u nodes of
//! an UltraServer, each labelled with its instance type, so the charts' node affinity applies unchanged, and with
//! its role, `e2e.aws-dra.dev/node=<role>`, since kind generates node names;
//! each with its fixture hardware tree mounted at [`FIXTURE_MOUNT`]), brings
//! the cluster up, builds the Dockerfile's image with `docker build` and
//! loads it with `kind load docker-image`, loads the suite's own images (the
//! probe the example pods run, and one with `gpu-test-driver`), then runs
//! the shared scenarios there (`cargo test -p e2e --test scenarios_kind`):
//! the scenarios' testbed installs both charts with
//! [`crate::charts::specs::kind_helm_values`] (one release per chart) and
//! drives the DaemonSets as on the local cluster (`tests/scenarios_chart.rs`).
//!
//! Docker comes from [`crate::docker`] (installed and started when missing),
//! kind from its Go module ([`crate::kind_tool`]). Two sources of images
//! ([`KindImages`]): `offline` (the default) builds every image on the
//! machine ([`crate::kind_images`]: the node image, the Dockerfile's base
//! images) and wires the pod network itself ([`crate::kind_network`]);
//! `registry` uses kind's published `kindest/node` image, its default CNI
//! and the Dockerfile's public base images.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use e2e::chart_testbed::host::ROLE_LABEL;
use serde_json::{Value, json};

pub use e2e::kind_host::{CLUSTER_NAME, FIXTURE_MOUNT, IMAGE_REPOSITORY, IMAGE_TAG};

/// A worker node: its role, the hardware it pretends to be, its fixture tree.
#[derive(Debug, Clone)]
pub struct FixtureNode {
    pub role: String,
    /// An instance type, or a fixture name of one (`trn2u.48xlarge@node0`).
    pub fixture: String,
    /// Host directory holding `sys/` and `dev/`.
    pub fixture_dir: PathBuf,
}

impl FixtureNode {
    /// The instance type the node is labelled with.
    pub fn instance_type(&self) -> &str {
        sysfs_fixtures::instance_type_of(&self.fixture)
    }
}

/// The workers of the e2e: the roles the scenarios use.
pub fn default_nodes(fixtures_root: &Path) -> Vec<FixtureNode> {
    e2e::kind_host::roles()
        .into_iter()
        .map(|(role, fixture, _)| FixtureNode {
            fixture_dir: fixtures_root.join(&role),
            role,
            fixture,
        })
        .collect()
}

/// The kind `Cluster` config as YAML. `offline`: no default CNI (kindnetd is
/// an image from a registry; [`crate::kind_network`] wires the pods).
/// `setup.cgroup_v1`: the kubelet is told to run on a cgroup v1 host, which
/// 1.35+ refuses by default. `setup.kube_proxy_mode`: kube-proxy's mode when
/// the release needs one other than kind's default (`iptables`).
pub fn cluster_config(nodes: &[FixtureNode], offline: bool, setup: &ConfigSetup) -> Result<String> {
    let cgroup_v1 = setup.cgroup_v1;
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
                "node.kubernetes.io/instance-type": n.instance_type(),
                ROLE_LABEL: n.role,
            },
            "extraMounts": [{
                "hostPath": dir,
                "containerPath": FIXTURE_MOUNT,
                "readOnly": true,
            }],
        }));
    }
    // Without apiVersion, kind applies a patch whatever kubeadm API the
    // node image's release uses.
    let mut patches = Vec::new();
    if cgroup_v1 {
        // The kubelet refuses cgroup v1 from 1.35 on unless told otherwise.
        // (kubeadm's preflight, which refuses it too, does not run: kind's
        // own InitConfiguration skips that phase; a patch of skipPhases
        // would replace kind's list, so none is made.)
        patches.push(json!("kind: KubeletConfiguration\nfailCgroupV1: false\n"));
    }
    let mut config = json!({
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
    if !patches.is_empty() {
        config["kubeadmConfigPatches"] = Value::Array(patches);
    }
    if offline {
        config["networking"]["disableDefaultCNI"] = json!(true);
    }
    if let Some(mode) = setup.kube_proxy_mode {
        config["networking"]["kubeProxyMode"] = json!(mode);
    }
    to_yaml(&config)
}

/// What the cluster config takes from the host and the release.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConfigSetup {
    /// The host runs cgroup v1 (kubelet 1.35+ refuses it unless told).
    pub cgroup_v1: bool,
    /// kube-proxy's mode, when not kind's default.
    pub kube_proxy_mode: Option<&'static str>,
}

/// kube-proxy's mode for `version`: `nftables` where the release is built
/// with our iptables stand-in (1.38+: the proxy refuses
/// `sigs.k8s.io/iptables-wrappers`, and the stand-in reports no iptables;
/// docs/e2e.md), kind's default otherwise.
pub fn kube_proxy_mode(version: &e2e::KubernetesVersion) -> Option<&'static str> {
    let module = crate::paths::repo_root().join(version.release().ok()?.module_dir());
    local_cluster::go_stand_ins::replaces(&module, local_cluster::go_stand_ins::IPTABLES_WRAPPERS)
        .then_some("nftables")
}

fn to_yaml(v: &Value) -> Result<String> {
    serde_saphyr::to_string(v).map_err(|e| anyhow::anyhow!("serializing YAML: {e}"))
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

/// Where the images of the kind run come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KindImages {
    /// Every image built on this machine (no registry needed): the node
    /// image, the Dockerfile's base images; pod network wired by xtask.
    Offline,
    /// kind's published node image (`kindest/node:<version>`), its default
    /// CNI, and the Dockerfile's public base images (needs registry access).
    Registry,
}

/// How the cluster is made: the tools and images [`prepare_images`] settled on.
pub struct KindSetup {
    /// The kind binary.
    pub kind: PathBuf,
    pub images: KindImages,
    /// `--image` of `kind create cluster`.
    pub node_image: String,
    /// The host runs cgroup v1 (kubelet 1.35+ refuses it unless told),
    /// and kube-proxy's mode.
    pub config: ConfigSetup,
}

/// The message of a machine where Docker cannot be had.
pub fn no_docker_message(why: &str) -> String {
    format!(
        "cargo xtask e2e --cluster kind needs Docker: {why}.\n\
         Run the same scenarios without Docker on a local control plane:\n\
         \n    cargo xtask e2e --cluster local\n"
    )
}

/// Docker (installed and started when missing) and kind (built from its Go
/// module); both before any other build, so a machine that cannot have
/// them learns it at once.
pub fn prepare_tools(root: &Path) -> Result<PathBuf> {
    crate::docker::ensure_engine()
        .map_err(|e| anyhow::anyhow!(no_docker_message(&format!("{e:#}"))))?;
    crate::kind_tool::ensure(root)
}

/// The Dockerfile's base images for `images` as `--build-arg`s: built here
/// for [`KindImages::Offline`] (Debian and the host's Rust toolchain), the
/// Dockerfile's public defaults otherwise. Needs no Kubernetes build.
pub fn base_image_args(images: KindImages) -> Result<Vec<(String, String)>> {
    match images {
        KindImages::Registry => Ok(Vec::new()),
        KindImages::Offline => {
            let started = Instant::now();
            let rust = crate::base_images::ensure_rust()?;
            eprintln!(
                "==> e2e(kind): local base images ready in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            Ok(vec![
                ("BUILD_IMAGE".to_string(), rust),
                (
                    "RUNTIME_IMAGE".to_string(),
                    crate::base_images::DEBIAN_IMAGE.to_string(),
                ),
            ])
        }
    }
}

/// `docker build` of the repository's Dockerfile into
/// `IMAGE_REPOSITORY:IMAGE_TAG`, before any cluster exists (the release
/// compile inside is the longest step, and a cluster waiting for it would
/// only hold memory). BuildKit's cache mounts make a rebuild incremental.
pub fn build_driver_image(root: &Path, build_args: &[(String, String)]) -> Result<()> {
    let started = Instant::now();
    let image = format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}");
    let mut build = crate::docker::build_command()?;
    build.current_dir(root).args(["-t", &image]);
    for (name, value) in build_args {
        build.arg("--build-arg").arg(format!("{name}={value}"));
    }
    run_step("docker build (the Dockerfile)", build.arg("."))?;
    eprintln!(
        "==> e2e(kind): driver image {image} built in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The node image for `images` (built here for [`KindImages::Offline`],
/// from the Kubernetes binaries of `version`).
pub fn prepare_images(
    root: &Path,
    kind: PathBuf,
    images: KindImages,
    version: &e2e::KubernetesVersion,
) -> Result<KindSetup> {
    let cgroup_v1 = !Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let node_image = match images {
        KindImages::Registry => format!("kindest/node:{version}"),
        KindImages::Offline => {
            let started = Instant::now();
            let binaries = e2e::Binaries::locate(version)?;
            let t = Instant::now();
            let mut progress: local_cluster::go_build::Progress = Box::new(move |line: &str| {
                eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
            });
            let kind_node_dir =
                local_cluster::toolchain::ensure_kind_node_built(version, &mut progress)?;
            let base_files = crate::kind_tool::base_files(root)?;
            let coredns_binary = local_cluster::toolchain::ensure_coredns_built(
                &crate::kind_images::coredns_tag(
                    &kind_node_dir.join("kubeadm"),
                    &version.to_string(),
                )?,
                &mut progress,
            )?;
            let pause_binary = binaries
                .pause_image
                .parent()
                .context("pause image archive has no directory")?
                .join("pause");
            let node = crate::kind_images::ensure_node(&crate::kind_images::NodeInputs {
                version,
                binaries: &binaries,
                kind_node_dir: &kind_node_dir,
                kind_base_files: &base_files,
                pause_binary: &pause_binary,
                coredns_binary: &coredns_binary,
            })?;
            eprintln!(
                "==> e2e(kind): node image ready in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            node
        }
    };
    // Every image of the run is built by now (the driver image, the base
    // and node images): their build cache is not needed again.
    crate::docker::prune_build_cache();
    Ok(KindSetup {
        kind,
        images,
        node_image,
        config: ConfigSetup {
            cgroup_v1,
            kube_proxy_mode: kube_proxy_mode(version),
        },
    })
}

/// Brings up the kind cluster of [`default_nodes`] with the images loaded
/// (the charts are installed by the scenarios' testbed). `bin_dir` holds the
/// three driver binaries, `probe_archive` the probe image. Returns the
/// kubeconfig path. When a step fails, the cluster is deleted (eight nodes,
/// each holding its copy of the loaded images: issue 53 found a failed run's
/// cluster left running), unless `keep`.
pub fn bring_up(
    work: &Path,
    bin_dir: &Path,
    probe_archive: &Path,
    setup: &KindSetup,
    keep: bool,
) -> Result<PathBuf> {
    // kind's nodes run their kubelets and containerd on this kernel's
    // inotify limits, as the local clusters do.
    for line in local_cluster::host_limits::raise_inotify_limits() {
        eprintln!("==> e2e(kind): {line}");
    }
    let result = create_and_load(work, bin_dir, probe_archive, setup);
    if let Err(e) = &result {
        after_failure(&setup.kind, keep, &format!("bring-up failed: {e:#}"));
    }
    result
}

/// What happens to the cluster after a failed step: kept (and said so)
/// with `keep`, else deleted.
fn after_failure(kind: &Path, keep: bool, why: &str) {
    eprintln!("==> e2e(kind): {why}");
    if keep {
        eprintln!(
            "==> e2e(kind): cluster {CLUSTER_NAME}, if created, left running (--keep); \
             `kind export logs --name {CLUSTER_NAME}` saves its logs, \
             `kind delete cluster --name {CLUSTER_NAME}` removes it"
        );
    } else if let Err(e) = delete(kind) {
        eprintln!("==> e2e(kind): the failed run's cluster could not be deleted: {e:#}");
    }
}

fn create_and_load(
    work: &Path,
    bin_dir: &Path,
    probe_archive: &Path,
    setup: &KindSetup,
) -> Result<PathBuf> {
    std::fs::create_dir_all(work)?;
    let fixtures = work.join("fixtures");
    let nodes = default_nodes(&fixtures);
    for n in &nodes {
        if n.fixture_dir.exists() {
            std::fs::remove_dir_all(&n.fixture_dir)
                .with_context(|| format!("removing {}", n.fixture_dir.display()))?;
        }
        let fixture = sysfs_fixtures::generate(&n.fixture, &n.fixture_dir)
            .with_context(|| format!("fixture for {} ({})", n.role, n.fixture))?;
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
    let offline = setup.images == KindImages::Offline;
    std::fs::write(&config, cluster_config(&nodes, offline, &setup.config)?)?;
    let kubeconfig = work.join("kubeconfig");
    // A cluster left by an interrupted run would make `create` fail.
    let _ = Command::new(&setup.kind)
        .args(["delete", "cluster", "--name", CLUSTER_NAME])
        .output();
    run_step(
        &format!("kind create cluster --image {}", setup.node_image),
        Command::new(&setup.kind)
            .args(["create", "cluster", "--config"])
            .arg(&config)
            .arg("--image")
            .arg(&setup.node_image)
            .arg("--kubeconfig")
            .arg(&kubeconfig),
    )?;
    if offline {
        eprintln!("==> e2e(kind): pod network (ptp + routes, no CNI image)");
        crate::kind_network::wire(CLUSTER_NAME)?;
    }
    // CoreDNS turns ready only once its kubernetes plugin has listed
    // Services through the API server's ClusterIP: a pod on the pod
    // network reaching a Service through kube-proxy, before any driver
    // depends on the same path.
    run_step(
        "CoreDNS ready (pod network, kube-proxy, DNS)",
        Command::new("docker").args([
            "exec",
            &format!("{CLUSTER_NAME}-control-plane"),
            "kubectl",
            "--kubeconfig=/etc/kubernetes/admin.conf",
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/coredns",
            "--timeout=180s",
        ]),
    )?;
    let image = format!("{IMAGE_REPOSITORY}:{IMAGE_TAG}");
    run_step(
        "kind load docker-image",
        Command::new(&setup.kind).args(["load", "docker-image", &image, "--name", CLUSTER_NAME]),
    )?;
    let drivers_archive = work.join("drivers.oci.tar");
    local_cluster::image::write_archive(
        &e2e::chart_testbed::local_host::driver_image_spec(bin_dir)?,
        &drivers_archive,
    )?;
    for archive in [&drivers_archive, &probe_archive.to_path_buf()] {
        run_step(
            &format!("kind load image-archive {}", archive.display()),
            Command::new(&setup.kind)
                .args(["load", "image-archive"])
                .arg(archive)
                .args(["--name", CLUSTER_NAME]),
        )?;
    }
    Ok(kubeconfig)
}

/// Runs the shared scenarios on the cluster of Kubernetes `version` (`cargo
/// test -p e2e --test scenarios_kind`); figures to `figures`. The version
/// tells the scenarios which features the release has (their skips) and what
/// the drivers publish there (NeuronCores only where partitionable devices
/// are served).
pub fn run_scenarios(
    root: &Path,
    version: &e2e::KubernetesVersion,
    kubeconfig: &Path,
    work: &Path,
    figures: &Path,
) -> Result<()> {
    let started = Instant::now();
    let status = crate::cargo_command::cargo()
        .current_dir(root)
        .args(["test", "--locked", "-p", "e2e", "--test", "scenarios_kind"])
        .env("AWS_DRA_K8S_VERSION", version.to_string())
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
pub fn delete(kind: &Path) -> Result<()> {
    run_step(
        "kind delete cluster",
        Command::new(kind).args(["delete", "cluster", "--name", CLUSTER_NAME]),
    )
}

#[cfg(test)]
mod tests;
