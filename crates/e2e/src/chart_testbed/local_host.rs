//! [`LocalChartHost`]: the [`ChartHost`] on a [`LocalCluster`] of real
//! processes, with the drivers' image packed here and imported into every
//! node's containerd.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::host_env::{driver_bin_dir, rss_kib};
use crate::pod_adapt::adapt_pod_for_local;
use crate::testbed::LocalOptions;
use crate::testbed::{DriverKind, rescan_interval_env};
use local_cluster::cluster::{ClusterConfig, LocalCluster, NodeSpec, TeardownReport};
use local_cluster::error::{Error, Result, io};
use local_cluster::process::run_checked;
use local_cluster::versions::KubernetesVersion;

use super::host::{
    ChartHost, DRIVERS_IMAGE_REPOSITORY, DRIVERS_IMAGE_TAG, Deployment, HostPaths, NodeLayout,
    ROLE_LABEL, cri_image_ref,
};
use super::{ChartTestbed, block};

/// The image files: the three driver binaries in `/usr/local/bin` (as the
/// Dockerfile puts them) and the shared libraries they load, from this
/// host (Debian 12 here, the distroless base's release too).
pub fn driver_image_spec(bin_dir: &Path) -> Result<local_cluster::image::ImageSpec> {
    let mut files = Vec::new();
    let mut libs = std::collections::BTreeSet::new();
    for kind in DriverKind::ALL {
        let bin = bin_dir.join(kind.binary());
        let bin = std::fs::canonicalize(&bin).map_err(io("resolving", &bin))?;
        libs.extend(local_cluster::image::shared_libraries(&bin)?);
        files.push((bin, format!("/usr/local/bin/{}", kind.binary())));
    }
    files.extend(libs.into_iter().map(|l| {
        let inside = l.display().to_string();
        (l, inside)
    }));
    let (main, main_at) = files.remove(0);
    Ok(local_cluster::image::ImageSpec {
        reference: format!("{DRIVERS_IMAGE_REPOSITORY}:{DRIVERS_IMAGE_TAG}"),
        binary: main,
        entrypoint: main_at,
        files,
    })
}

/// The Kubernetes name of the local node the scenarios call `role`: not the
/// role itself, so that a scenario that confuses the two fails here as it
/// would on kind, whose node names are generated.
pub fn local_node_name(role: &str) -> String {
    format!("chart-{role}")
}

fn node_spec(role: &str, instance_type: &str) -> NodeSpec {
    NodeSpec::for_fixture(&local_node_name(role), instance_type).label(ROLE_LABEL, role)
}

/// [`ChartHost`] on a [`LocalCluster`].
pub struct LocalChartHost {
    cluster: tokio::sync::Mutex<LocalCluster>,
    client: kube::Client,
    admin_kubeconfig: PathBuf,
    run_dir: PathBuf,
    api_host_port: (String, String),
    ctr: PathBuf,
    image_archive: PathBuf,
    handle: tokio::runtime::Handle,
    /// The Neuron chart's `partitions` (the testbeds': `auto`).
    neuron_partitions: Option<String>,
}

impl LocalChartHost {
    /// Starts a local cluster with `nodes` (`(name, instance type)`) and
    /// loads the driver image (binaries from `bin_dir`) into every node.
    pub async fn start(
        nodes: &[(String, String)],
        bin_dir: &Path,
        kubernetes_version: &KubernetesVersion,
    ) -> Result<Self> {
        let mut config = ClusterConfig::with_nodes(&[]);
        config.kubernetes_version = kubernetes_version.clone();
        config.nodes = nodes.iter().map(|(n, t)| node_spec(n, t)).collect();
        let cluster = LocalCluster::start(config).await?;
        let client = cluster.client()?;
        let run_dir = cluster.run_dir().to_path_buf();
        let image_archive = run_dir.join("drivers.oci.tar");
        local_cluster::image::write_archive(&driver_image_spec(bin_dir)?, &image_archive)?;
        let server = cluster
            .server_url()
            .trim_start_matches("https://")
            .to_string();
        let (h, p) = server
            .rsplit_once(':')
            .ok_or_else(|| Error::Testbed(format!("server URL without port: {server}")))?;
        let host = LocalChartHost {
            client,
            admin_kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
            run_dir,
            api_host_port: (h.to_string(), p.to_string()),
            ctr: cluster.binaries().ctr.clone(),
            image_archive,
            cluster: tokio::sync::Mutex::new(cluster),
            handle: tokio::runtime::Handle::current(),
            neuron_partitions: Some(crate::testbed::TESTBED_PARTITIONS.into()),
        };
        for (n, _) in nodes {
            host.import_image(&local_node_name(n)).await?;
        }
        Ok(host)
    }

    fn ctr(&self, socket: &Path) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io"]);
        c
    }

    async fn local_node(&self, name: &str) -> Result<local_cluster::node::LocalNode> {
        self.cluster
            .lock()
            .await
            .node(name)
            .cloned()
            .ok_or_else(|| Error::Testbed(format!("no node {name} in the cluster")))
    }

    async fn import_image(&self, name: &str) -> Result<()> {
        let n = self.local_node(name).await?;
        run_checked(
            self.ctr(&n.containerd_socket)
                .args(["images", "import", "--snapshotter", &n.snapshotter])
                .arg(&self.image_archive),
        )?;
        Ok(())
    }

    fn socket_of(&self, node: &str) -> Result<PathBuf> {
        block(&self.handle, async {
            Ok(self.local_node(node).await?.containerd_socket)
        })
    }

    fn task_pid(&self, node: &str, container_id: &str) -> Option<i32> {
        let socket = self.socket_of(node).ok()?;
        let out = run_checked(self.ctr(&socket).args(["tasks", "ls"])).ok()?;
        out.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(container_id)).then(|| w.next()?.parse().ok())?
        })
    }
}

impl ChartHost for LocalChartHost {
    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    fn deployment(&self) -> Deployment {
        Deployment {
            image_repository: DRIVERS_IMAGE_REPOSITORY.into(),
            image_tag: DRIVERS_IMAGE_TAG.into(),
            gpu_test_image: format!("{DRIVERS_IMAGE_REPOSITORY}:{DRIVERS_IMAGE_TAG}"),
            // No CNI: only host-network pods run.
            host_network: true,
            // No kube-proxy: the kubernetes Service's ClusterIP leads nowhere,
            // so the in-cluster config points at the API server itself
            // (loopback, in the pods' host network).
            extra_env: vec![
                (
                    "KUBERNETES_SERVICE_HOST".into(),
                    self.api_host_port.0.clone(),
                ),
                (
                    "KUBERNETES_SERVICE_PORT".into(),
                    self.api_host_port.1.clone(),
                ),
                rescan_interval_env(),
            ],
            neuron_partitions: self.neuron_partitions.clone(),
            // A node is tainted until its kubelet reports Ready; the drivers
            // must start before that.
            tolerations: Some(json!([{"operator": "Exists"}])),
            per_node_releases: true,
            unique_metrics_ports: true,
        }
    }

    async fn node(&self, name: &str, instance_type: &str) -> Result<NodeLayout> {
        let k8s_name = local_node_name(name);
        let exists = self.cluster.lock().await.node(&k8s_name).is_some();
        if !exists {
            self.cluster
                .lock()
                .await
                .add_node_now(&node_spec(name, instance_type))
                .await?;
            self.import_image(&k8s_name).await?;
        }
        let n = self.local_node(&k8s_name).await?;
        let fixture_dir = n.run_dir.join("fixture");
        if fixture_dir.exists() {
            std::fs::remove_dir_all(&fixture_dir).map_err(io("removing", &fixture_dir))?;
        }
        let fixture = sysfs_fixtures::generate(instance_type, &fixture_dir)?;
        Ok(NodeLayout {
            node_name: n.name.clone(),
            paths: HostPaths {
                kubelet_root: n.kubelet_root_dir.display().to_string(),
                cdi_root: n.cdi_dir.display().to_string(),
                sysfs_root: fixture.sys.display().to_string(),
                dev_root: fixture.dev.display().to_string(),
            },
            host_sysfs: fixture.sys.clone(),
            fixture,
        })
    }

    fn read_file(&self, _node: &str, path: &str) -> Result<Option<Vec<u8>>> {
        match std::fs::read(path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", Path::new(path))(e)),
        }
    }

    fn list_dir(&self, _node: &str, path: &str) -> Result<Vec<String>> {
        match std::fs::read_dir(path) {
            Ok(entries) => Ok(entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io("listing", Path::new(path))(e)),
        }
    }

    fn tag_image(&self, node: &str, from: &str, to: &str) -> Result<()> {
        let socket = self.socket_of(node)?;
        run_checked(self.ctr(&socket).args([
            "images",
            "tag",
            "--force",
            &cri_image_ref(from),
            &cri_image_ref(to),
        ]))?;
        Ok(())
    }

    fn kill_container(&self, node: &str, container_id: &str) -> Result<()> {
        let socket = self.socket_of(node)?;
        run_checked(self.ctr(&socket).args([
            "tasks",
            "kill",
            "--signal",
            "SIGKILL",
            container_id,
        ]))?;
        Ok(())
    }

    fn container_rss_kib(&self, node: &str, container_id: &str) -> Option<u64> {
        rss_kib(self.task_pid(node, container_id)?)
    }

    fn kubeconfig_for_token(&self, stem: &str, user: &str, token: &str) -> Result<PathBuf> {
        block(&self.handle, async {
            self.cluster
                .lock()
                .await
                .kubeconfig_for_token(stem, user, token)
        })
    }

    fn adapt_pod(&self, pod: &mut Value) {
        adapt_pod_for_local(pod);
    }

    fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    fn shutdown(self) -> TeardownReport {
        self.cluster.into_inner().shutdown()
    }

    fn logs_hint(&self) -> String {
        format!(
            "component logs in {} (kubelet: nodes/<node>/kubelet.log, containers: nodes/<node>/pod-logs)",
            self.run_dir.display()
        )
    }
}

impl ChartTestbed<LocalChartHost> {
    /// The local cluster of [`crate::testbed::LocalOptions::default`]'s nodes
    /// with the drivers installed from the charts; driver binaries from
    /// `bin_dir`, or where [`crate::host_env::driver_bin_dir`] finds them.
    pub async fn start_local(options: &LocalOptions) -> Result<Self> {
        let bin_dir = match &options.bin_dir {
            Some(d) => d.clone(),
            None => driver_bin_dir(&DriverKind::ALL)?,
        };
        let names: Vec<(String, String)> = options
            .nodes
            .iter()
            .map(|(n, t, _)| (n.clone(), t.clone()))
            .collect();
        let mut host = LocalChartHost::start(&names, &bin_dir, &options.kubernetes_version).await?;
        // The chart's `partitions` from the drivers' environment, as the
        // host-process testbed passes it (none, as in the demo: the
        // chart's default).
        host.neuron_partitions = options
            .driver_env
            .iter()
            .rev()
            .find(|(k, _)| k == "NEURON_PARTITIONS")
            .map(|(_, v)| v.clone());
        let work = host.run_dir().join("charts");
        Self::start(host, &options.nodes, &work).await
    }
}
