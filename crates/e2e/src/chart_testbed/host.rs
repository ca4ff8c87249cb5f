//! The seam between [`super::ChartTestbed`] and the cluster it runs on:
//! what a host must offer ([`ChartHost`]), how its nodes are laid out, and
//! the labels and image names every host uses.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sysfs_fixtures::Fixture;

use crate::testbed::DriverKind;
use local_cluster::cluster::TeardownReport;
use local_cluster::error::Result;

/// Prefix of the node labels that switch a driver on (`<prefix><binary>=run`).
pub const RUN_LABEL_PREFIX: &str = "e2e.aws-dra.dev/";
/// Pod label naming the driver binary, on every driver pod of this testbed.
pub const POD_DRIVER_LABEL: &str = "e2e.aws-dra.dev/driver";
/// Reference of the image with all three driver binaries in
/// `/usr/local/bin` (built by [`driver_image_spec`](super::local_host::driver_image_spec) here; the kind host loads
/// the same archive).
pub const DRIVERS_IMAGE_REPOSITORY: &str = "localhost/aws-dra-e2e/drivers";
pub const DRIVERS_IMAGE_TAG: &str = "e2e";

/// Label naming a node's role (`p5`, `trn2`, `trn1`) on every testbed node.
pub const ROLE_LABEL: &str = "e2e.aws-dra.dev/node";

/// The name containerd stores an image under when a pod spec names it `r`
/// (the CRI's normalization of Docker-style short names): `busybox:1` is
/// `docker.io/library/busybox:1`, `aws/x:1` is `docker.io/aws/x:1`, and a
/// name whose first part is a registry (`localhost/…`, `a.b/…`, `h:5000/…`)
/// stays as it is.
pub fn cri_image_ref(r: &str) -> String {
    match r.split_once('/') {
        None => format!("docker.io/library/{r}"),
        Some((first, _)) if first == "localhost" || first.contains(['.', ':']) => r.to_string(),
        Some(_) => format!("docker.io/{r}"),
    }
}

/// The node label that runs `kind` there.
pub fn run_label(kind: DriverKind) -> String {
    format!("{RUN_LABEL_PREFIX}{}", kind.binary())
}

/// Where a node keeps what the drivers use, as the node itself sees it
/// (the charts' `hostPaths`).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub kubelet_root: String,
    pub cdi_root: String,
    pub sysfs_root: String,
    pub dev_root: String,
}

/// A node of the testbed as its host knows it.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    /// The Kubernetes Node name.
    pub node_name: String,
    /// The fixture hardware (for the expected device counts).
    pub fixture: Fixture,
    pub paths: HostPaths,
    /// Where `paths.sysfs_root` is on the machine running the suite (where
    /// the scenarios inject faults).
    pub host_sysfs: PathBuf,
}

/// How the DaemonSets are deployed on a host's cluster.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub image_repository: String,
    pub image_tag: String,
    /// Image holding `/usr/local/bin/gpu-test-driver`.
    pub gpu_test_image: String,
    pub host_network: bool,
    /// `extraEnv` of the charts (`(name, value)`).
    pub extra_env: Vec<(String, String)>,
    /// `partitions` of the Neuron chart; `None`: the chart's default.
    pub neuron_partitions: Option<String>,
    /// Tolerations replacing the charts' defaults, if any.
    pub tolerations: Option<Value>,
    /// One release per node and chart (nodes differ in kubelet root) rather
    /// than one per chart.
    pub per_node_releases: bool,
    /// Each release gets its own metrics port (host networking on one host).
    pub unique_metrics_ports: bool,
}

/// What a cluster must offer [`ChartTestbed`](super::ChartTestbed).
#[allow(async_fn_in_trait)]
pub trait ChartHost: Send + Sync {
    fn client(&self) -> kube::Client;
    fn admin_kubeconfig(&self) -> &Path;
    fn deployment(&self) -> Deployment;
    /// The layout of node `name` with the fixture of `instance_type`,
    /// adding the node first where the host can.
    async fn node(&self, name: &str, instance_type: &str) -> Result<NodeLayout>;
    /// A file on the node (`None` when absent).
    fn read_file(&self, node: &str, path: &str) -> Result<Option<Vec<u8>>>;
    /// Entry names of a directory on the node (empty when absent).
    fn list_dir(&self, node: &str, path: &str) -> Result<Vec<String>>;
    /// Gives the image `from` the second name `to` in the node's containerd
    /// (both as a pod spec names them): a pod naming `to` then runs the same
    /// image without a pull.
    fn tag_image(&self, node: &str, from: &str, to: &str) -> Result<()>;
    /// SIGKILL to the main process of a container (CRI id, no `containerd://`).
    fn kill_container(&self, node: &str, container_id: &str) -> Result<()>;
    /// VmRSS of a container's main process, KiB.
    fn container_rss_kib(&self, node: &str, container_id: &str) -> Option<u64>;
    /// A kubeconfig for the API server with a bearer token.
    fn kubeconfig_for_token(&self, stem: &str, user: &str, token: &str) -> Result<PathBuf>;
    fn adapt_pod(&self, pod: &mut Value);
    fn logs_hint(&self) -> String;
    /// Where the run's logs and generated files are.
    fn run_dir(&self) -> &Path;
    /// Stops what the host started (the cluster, where it owns it).
    fn shutdown(self) -> TeardownReport
    where
        Self: Sized;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_normalized_as_the_cri_does() {
        for (spec, stored) in [
            (
                "aws-dra-drivers:e2e",
                "docker.io/library/aws-dra-drivers:e2e",
            ),
            ("aws/drivers:1", "docker.io/aws/drivers:1"),
            (
                "localhost/aws-dra-e2e/drivers:e2e",
                "localhost/aws-dra-e2e/drivers:e2e",
            ),
            ("public.ecr.aws/x/y:2", "public.ecr.aws/x/y:2"),
            ("registry:5000/y:2", "registry:5000/y:2"),
        ] {
            assert_eq!(cri_image_ref(spec), stored, "{spec}");
        }
    }
}
