//! [`KindHost`]: the [`ChartHost`] of a kind cluster, for the scenarios of
//! `cargo xtask e2e --cluster kind`.
//!
//! `xtask` brings the cluster up (its config: [`CLUSTER_NAME`], one worker
//! per role labelled [`ROLE_LABEL`]`=<role>` and with its instance type, its
//! fixture tree bind-mounted at [`FIXTURE_MOUNT`]) and loads the images; this
//! host then gives [`ChartTestbed`] what
//! it needs: nodes found by their role label (kind generates node names), one
//! release per chart with the kubelet's standard paths, files and processes
//! of a node reached with `docker exec <node> …` (a kind node is a container
//! of that name, with `ctr` inside).
//!
//! Run for real by `cargo xtask e2e --cluster kind` (docs/e2e.md has the
//! figures); its unit tests use a `docker` stand-in.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use crate::chart_testbed::ChartTestbed;
use crate::chart_testbed::host::{
    ChartHost, DRIVERS_IMAGE_REPOSITORY, DRIVERS_IMAGE_TAG, Deployment, HostPaths, NodeLayout,
    ROLE_LABEL, cri_image_ref,
};
use crate::testbed::{DriverKind, rescan_interval_env};
use local_cluster::cluster::TeardownReport;
use local_cluster::error::{Error, Result, io};

/// Name of the kind cluster.
pub const CLUSTER_NAME: &str = "aws-dra-e2e";
/// Where each kind node sees its own fixture tree (`sys/`, `dev/`).
pub const FIXTURE_MOUNT: &str = "/opt/aws-dra/fixture";
/// The image `docker build` makes of the repository's Dockerfile, loaded
/// into the nodes with `kind load docker-image` (never pulled).
pub const IMAGE_REPOSITORY: &str = "aws-dra-drivers";
pub const IMAGE_TAG: &str = "e2e";
/// The kubelet's root dir and CDI dir on a kind node (the charts' defaults).
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
pub const CDI_ROOT: &str = "/var/run/cdi";

/// The kind workers: `(role, fixture, drivers)`, the local testbed's p5 and
/// trn2 nodes plus every node a scenario adds there (`Testbed::ensure_node`):
/// trn1 (scenarios 6 and 20) and the 4 trn2u nodes of one UltraServer
/// (scenario 27). kind fixes its nodes when it creates the cluster, so each
/// is here from the start; `tests/kind_nodes.rs` fails when a scenario asks
/// for a node this list lacks. A fixture is an instance type or a fixture
/// name (`trn2u.48xlarge@node0`, see `sysfs_fixtures::spec`). The local
/// testbeds start the same list at bring-up with `AWS_DRA_E2E_NODES=kind`
/// ([`NodeList::Kind`]).
pub fn roles() -> Vec<(String, String, Vec<DriverKind>)> {
    let mut nodes = crate::testbed::LocalOptions::default().nodes;
    nodes.push((
        "trn1".into(),
        "trn1.32xlarge".into(),
        vec![DriverKind::Efa, DriverKind::Neuron],
    ));
    for (role, fixture) in [
        ("us-0", "trn2u.48xlarge@node0"),
        ("us-1", "trn2u.48xlarge@node1"),
        ("us-2", "trn2u.48xlarge@node2"),
        ("us-3", "trn2u.48xlarge@node3-modes1_2_3"),
    ] {
        nodes.push((role.into(), fixture.into(), vec![DriverKind::Neuron]));
    }
    nodes
}

/// The environment variable that picks the node list the scenario harness
/// starts: [`NodeList::Kind`] for `kind`.
pub const NODES_ENV: &str = "AWS_DRA_E2E_NODES";

/// The nodes a scenario testbed has from bring-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeList {
    /// The testbed's own: on the local testbeds p5 and trn2, and the nodes
    /// scenarios add (`Testbed::ensure_node`) when they first need them.
    Testbed,
    /// kind's node list ([`roles`]), every node started at bring-up: the
    /// node set the scenarios see on kind, without Docker, so that a
    /// scenario that assumes fewer nodes than kind has fails here too.
    Kind,
}

impl NodeList {
    /// `value` of [`NODES_ENV`]: unset, empty or `testbed` for the
    /// testbed's own list, `kind` for kind's; anything else is an error
    /// naming both.
    pub fn parse(value: Option<&str>) -> Result<NodeList> {
        match value.map(str::trim) {
            None | Some("" | "testbed") => Ok(NodeList::Testbed),
            Some("kind") => Ok(NodeList::Kind),
            Some(other) => Err(Error::Testbed(format!(
                "{NODES_ENV}={other:?}: not a node list; `testbed` (or unset) for the testbed's \
                 own nodes, `kind` for kind's (e2e::kind_host::roles)"
            ))),
        }
    }

    /// [`Self::parse`] of the environment.
    pub fn from_env() -> Result<NodeList> {
        let value = std::env::var_os(NODES_ENV).map(|v| v.to_string_lossy().into_owned());
        NodeList::parse(value.as_deref())
    }

    /// Its name, for logs and figures.
    pub fn name(self) -> &'static str {
        match self {
            NodeList::Testbed => "testbed",
            NodeList::Kind => "kind",
        }
    }

    /// The `(role, fixture, drivers)` to start at bring-up
    /// (`Testbed::ensure_node`, a no-op for a node the testbed has): none
    /// for the testbed's own list, every kind role for kind's.
    pub fn bring_up_nodes(self) -> Vec<(String, String, Vec<DriverKind>)> {
        match self {
            NodeList::Testbed => Vec::new(),
            NodeList::Kind => roles(),
        }
    }
}

/// How the charts are deployed on kind: one release per chart, pod network,
/// the Dockerfile's image for our drivers and the suite's own image (with
/// `gpu-test-driver`, loaded by `kind load image-archive`) for the GPU stand-in.
pub fn deployment() -> Deployment {
    Deployment {
        image_repository: IMAGE_REPOSITORY.into(),
        image_tag: IMAGE_TAG.into(),
        gpu_test_image: format!("{DRIVERS_IMAGE_REPOSITORY}:{DRIVERS_IMAGE_TAG}"),
        host_network: false,
        extra_env: vec![rescan_interval_env()],
        neuron_partitions: Some(crate::testbed::TESTBED_PARTITIONS.into()),
        tolerations: None,
        per_node_releases: false,
        unique_metrics_ports: false,
    }
}

/// Where `xtask kind` keeps node `role`'s fixture tree (bind-mounted at
/// [`FIXTURE_MOUNT`]), given the testbed's work dir (`<work>/testbed`).
pub fn fixture_host_dir(testbed_work: &Path, role: &str) -> PathBuf {
    testbed_work
        .parent()
        .unwrap_or(testbed_work)
        .join("fixtures")
        .join(role)
}

/// The charts' host paths on every kind node: the kubelet's standard dirs,
/// the fixture mount in place of `/sys` and `/dev`.
pub fn host_paths() -> HostPaths {
    HostPaths {
        kubelet_root: KUBELET_ROOT.into(),
        cdi_root: CDI_ROOT.into(),
        sysfs_root: format!("{FIXTURE_MOUNT}/sys"),
        dev_root: format!("{FIXTURE_MOUNT}/dev"),
    }
}

/// `VmRSS` of `/proc/<pid>/status` text, KiB.
pub fn vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The PID of task `id` in `ctr tasks ls` output (`TASK PID STATUS`).
pub fn task_pid(ctr_tasks_ls: &str, id: &str) -> Option<i32> {
    ctr_tasks_ls.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some(id)).then(|| w.next()?.parse().ok())?
    })
}

/// A kubeconfig like `admin` (same cluster entry) whose only user is the
/// bearer `token`.
pub fn token_kubeconfig(admin: &Value, user: &str, token: &str) -> Result<Value> {
    let context = admin["current-context"].as_str().unwrap_or_default();
    let cluster_name = admin["contexts"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == context))
        .and_then(|c| c["context"]["cluster"].as_str())
        .ok_or_else(|| Error::Testbed("admin kubeconfig has no current context".into()))?;
    let cluster = admin["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == cluster_name))
        .cloned()
        .ok_or_else(|| Error::Testbed(format!("admin kubeconfig has no cluster {cluster_name}")))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": user,
    }))
}

/// [`ChartHost`] on a kind cluster that is already up.
pub struct KindHost {
    client: kube::Client,
    kubeconfig: PathBuf,
    work_dir: PathBuf,
    docker: PathBuf,
}

impl KindHost {
    /// Connects with kind's kubeconfig; scratch files go to `work_dir`.
    /// `docker` is `$AWS_DRA_DOCKER` or `docker`.
    pub async fn connect(kubeconfig: &Path, work_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(work_dir).map_err(io("creating", work_dir))?;
        Ok(KindHost {
            client: crate::client_from_kubeconfig(kubeconfig).await?,
            kubeconfig: kubeconfig.to_path_buf(),
            work_dir: work_dir.to_path_buf(),
            docker: std::env::var_os("AWS_DRA_DOCKER")
                .map_or_else(|| PathBuf::from("docker"), PathBuf::from),
        })
    }

    /// `docker exec <node> <args…>`: `(success, stdout, stderr)`.
    fn exec(&self, node: &str, args: &[&str]) -> Result<(bool, Vec<u8>, String)> {
        let out = Command::new(&self.docker)
            .arg("exec")
            .arg(node)
            .args(args)
            .output()
            .map_err(|source| Error::Spawn {
                command: format!("{} exec {node} {}", self.docker.display(), args.join(" ")),
                source,
            })?;
        Ok((
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    fn exec_ok(&self, node: &str, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.exec(node, args)?;
        if !ok {
            return Err(Error::Host(format!(
                "docker exec {node} {}: {}",
                args.join(" "),
                stderr.trim()
            )));
        }
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }
}

impl ChartHost for KindHost {
    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    fn deployment(&self) -> Deployment {
        deployment()
    }

    /// kind nodes are fixed when the cluster is created: finds the one
    /// labelled with `name` as its role.
    async fn node(&self, name: &str, instance_type: &str) -> Result<NodeLayout> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = nodes
            .list(&ListParams::default().labels(&format!("{ROLE_LABEL}={name}")))
            .await
            .map_err(|e| Error::Testbed(format!("listing nodes: {e}")))?;
        let node = list.items.into_iter().next().ok_or_else(|| {
            Error::Testbed(format!(
                "the kind cluster has no node labelled {ROLE_LABEL}={name}: kind nodes are \
                 fixed when the cluster is created (xtask/src/kind.rs lists them)"
            ))
        })?;
        let node_name = node.metadata.name.unwrap_or_default();
        // The tree is bind-mounted from the host; this copy only describes it
        // (device names and counts), generated the same way.
        let scratch = self.work_dir.join("fixture-descriptions").join(name);
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch).map_err(io("removing", &scratch))?;
        }
        let fixture = sysfs_fixtures::generate(instance_type, &scratch)?;
        let host_sysfs = fixture_host_dir(&self.work_dir, name).join("sys");
        if !host_sysfs.is_dir() {
            return Err(Error::Testbed(format!(
                "{name}'s fixture tree is not at {} (xtask kind mounts <work>/fixtures/<role>)",
                host_sysfs.display()
            )));
        }
        Ok(NodeLayout {
            node_name,
            fixture,
            paths: host_paths(),
            host_sysfs,
        })
    }

    fn read_file(&self, node: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let (ok, stdout, stderr) = self.exec(node, &["cat", path])?;
        if ok {
            Ok(Some(stdout))
        } else if stderr.contains("No such file") {
            Ok(None)
        } else {
            Err(Error::Host(format!(
                "reading {path} on {node}: {}",
                stderr.trim()
            )))
        }
    }

    fn list_dir(&self, node: &str, path: &str) -> Result<Vec<String>> {
        let (ok, stdout, stderr) = self.exec(node, &["ls", "-1A", path])?;
        if ok {
            Ok(String::from_utf8_lossy(&stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect())
        } else if stderr.contains("No such file") {
            Ok(Vec::new())
        } else {
            Err(Error::Host(format!(
                "listing {path} on {node}: {}",
                stderr.trim()
            )))
        }
    }

    fn tag_image(&self, node: &str, from: &str, to: &str) -> Result<()> {
        let (from, to) = (cri_image_ref(from), cri_image_ref(to));
        self.exec_ok(
            node,
            &[
                "ctr",
                "--namespace",
                "k8s.io",
                "images",
                "tag",
                "--force",
                &from,
                &to,
            ],
        )?;
        Ok(())
    }

    fn kill_container(&self, node: &str, container_id: &str) -> Result<()> {
        self.exec_ok(
            node,
            &[
                "ctr",
                "--namespace",
                "k8s.io",
                "tasks",
                "kill",
                "--signal",
                "SIGKILL",
                container_id,
            ],
        )?;
        Ok(())
    }

    fn container_rss_kib(&self, node: &str, container_id: &str) -> Option<u64> {
        let tasks = self
            .exec_ok(node, &["ctr", "--namespace", "k8s.io", "tasks", "ls"])
            .ok()?;
        let pid = task_pid(&tasks, container_id)?;
        let status = self
            .exec_ok(node, &["cat", &format!("/proc/{pid}/status")])
            .ok()?;
        vm_rss_kib(&status)
    }

    fn kubeconfig_for_token(&self, stem: &str, user: &str, token: &str) -> Result<PathBuf> {
        let text =
            std::fs::read_to_string(&self.kubeconfig).map_err(io("reading", &self.kubeconfig))?;
        let admin: Value = serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
            what: self.kubeconfig.display().to_string(),
            message: e.to_string(),
        })?;
        let config = token_kubeconfig(&admin, user, token)?;
        let path = self.work_dir.join(format!("{stem}.kubeconfig"));
        let bytes = serde_json::to_vec_pretty(&config).map_err(|source| Error::Json {
            what: "kubeconfig".into(),
            source,
        })?;
        std::fs::write(&path, bytes).map_err(io("writing", &path))?;
        Ok(path)
    }

    /// The suite's probe image (loaded, never pulled) in place of the
    /// example's; the pod network of kind needs nothing else.
    fn adapt_pod(&self, pod: &mut Value) {
        crate::pod_adapt::use_probe_image(pod);
    }

    /// The testbed's scratch files (kubeconfigs, fixture descriptions).
    fn run_dir(&self) -> &Path {
        &self.work_dir
    }

    /// Nothing to stop: the cluster belongs to `cargo xtask e2e`, which deletes it.
    fn shutdown(self) -> TeardownReport {
        TeardownReport::default()
    }

    fn logs_hint(&self) -> String {
        format!(
            "node logs: kind export logs --name {CLUSTER_NAME} {}",
            self.work_dir.join("kind-logs").display()
        )
    }
}

impl ChartTestbed<KindHost> {
    /// The scenarios' testbed on a kind cluster that is already up (see
    /// [`crate::kind_host`]): installs the charts and starts the drivers on
    /// the nodes labelled with the roles of `nodes`.
    pub async fn start_kind(
        kubeconfig: &Path,
        work_dir: &Path,
        nodes: &[(String, String, Vec<DriverKind>)],
    ) -> Result<Self> {
        let host = KindHost::connect(kubeconfig, work_dir).await?;
        Self::start(host, nodes, &work_dir.join("charts")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_are_named_by_the_environment() {
        assert_eq!(NodeList::parse(None).unwrap(), NodeList::Testbed);
        assert_eq!(NodeList::parse(Some(" ")).unwrap(), NodeList::Testbed);
        assert_eq!(NodeList::parse(Some("testbed")).unwrap(), NodeList::Testbed);
        assert_eq!(NodeList::parse(Some("kind")).unwrap(), NodeList::Kind);
        let err = NodeList::parse(Some("KIND")).unwrap_err().to_string();
        assert!(err.contains(NODES_ENV) && err.contains("`kind`"), "{err}");
        assert!(NodeList::Testbed.bring_up_nodes().is_empty());
        assert_eq!(NodeList::Kind.bring_up_nodes(), roles());
        assert_eq!(NodeList::Kind.name(), "kind");
        assert_eq!(NodeList::Testbed.name(), "testbed");
    }

    #[test]
    fn ctr_and_proc_output_are_parsed() {
        let tasks = "TASK                                                                PID      STATUS\n\
            3f2a9c                                                              4242     RUNNING\n\
            77bb01                                                              17       RUNNING\n";
        assert_eq!(task_pid(tasks, "77bb01"), Some(17));
        assert_eq!(task_pid(tasks, "3f2a9c"), Some(4242));
        assert_eq!(task_pid(tasks, "nope"), None);
        assert_eq!(
            vm_rss_kib("Name:\tefa-driver\nVmPeak:\t  9000 kB\nVmRSS:\t   12544 kB\n"),
            Some(12544)
        );
        assert_eq!(vm_rss_kib("Name: x\n"), None);
    }

    #[test]
    fn token_kubeconfig_keeps_the_cluster_and_replaces_the_user() {
        let admin = json!({
            "apiVersion": "v1", "kind": "Config",
            "current-context": "kind-aws-dra-e2e",
            "clusters": [
                {"name": "other", "cluster": {"server": "https://10.0.0.9:6443"}},
                {"name": "kind-aws-dra-e2e", "cluster": {
                    "server": "https://127.0.0.1:41234",
                    "certificate-authority-data": "Q0E=",
                }},
            ],
            "contexts": [{"name": "kind-aws-dra-e2e", "context": {"cluster": "kind-aws-dra-e2e", "user": "kind-aws-dra-e2e"}}],
            "users": [{"name": "kind-aws-dra-e2e", "user": {"client-certificate-data": "X", "client-key-data": "Y"}}],
        });
        let kc = token_kubeconfig(&admin, "system:serviceaccount:aws-dra:x", "tok").unwrap();
        assert_eq!(kc["clusters"].as_array().unwrap().len(), 1);
        assert_eq!(
            kc["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:41234"
        );
        assert_eq!(
            kc["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(kc["users"][0]["user"], json!({"token": "tok"}));
        assert_eq!(kc["current-context"], "system:serviceaccount:aws-dra:x");
        assert!(token_kubeconfig(&json!({}), "u", "t").is_err());
    }

    /// The `docker exec` plumbing, against a stand-in `docker` that runs the
    /// command on this host (no cluster needed; see the module docs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn files_and_processes_are_reached_through_docker_exec() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("docker");
        // `docker exec <node> <cmd…>` → `<cmd…>`, after checking the verb.
        // Written by another process (`cp`), so that no write descriptor of
        // this one, inherited by a child another test thread forks at the
        // same moment, can make the exec fail with ETXTBSY.
        let draft = dir.path().join("docker.draft");
        std::fs::write(
            &draft,
            "#!/bin/sh\n[ \"$1\" = exec ] || exit 99\nshift 2\nexec \"$@\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&draft, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copied = std::process::Command::new("cp")
            .arg("-p")
            .arg(&draft)
            .arg(&fake)
            .status()
            .unwrap();
        assert!(copied.success());
        let host = KindHost {
            client: kube::Client::try_from(kube::Config::new(
                "http://127.0.0.1:9".parse().unwrap(),
            ))
            .unwrap(),
            kubeconfig: dir.path().join("kubeconfig"),
            work_dir: dir.path().to_path_buf(),
            docker: fake,
        };
        let file = dir.path().join("checkpoint.json");
        std::fs::write(&file, b"{\"v\":1}").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(host.read_file("n", f).unwrap().unwrap(), b"{\"v\":1}");
        assert_eq!(host.read_file("n", "/nonexistent/x").unwrap(), None);
        let cdi = dir.path().join("cdi");
        assert_eq!(
            host.list_dir("n", cdi.to_str().unwrap()).unwrap(),
            Vec::<String>::new()
        );
        std::fs::create_dir(&cdi).unwrap();
        std::fs::write(cdi.join("b.json"), b"").unwrap();
        std::fs::write(cdi.join(".a.json"), b"").unwrap();
        let mut listed = host.list_dir("n", cdi.to_str().unwrap()).unwrap();
        listed.sort();
        assert_eq!(listed, [".a.json", "b.json"]);
        // RSS of this very process, through `cat /proc/<pid>/status`.
        let status = host
            .exec_ok(
                "n",
                &["cat", &format!("/proc/{}/status", std::process::id())],
            )
            .unwrap();
        assert!(vm_rss_kib(&status).unwrap() > 0);
        // Example pods run the probe on kind's pod network.
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "ubuntu", "command": ["sleep"]}]}});
        host.adapt_pod(&mut pod);
        assert_eq!(pod["spec"]["containers"][0]["image"], crate::PROBE_IMAGE);
        assert!(pod["spec"]["containers"][0]["command"].is_null());
        assert!(pod["spec"]["hostNetwork"].is_null());
        // A failing command is an error naming it.
        let err = host.kill_container("n", "abc").unwrap_err().to_string();
        assert!(err.contains("docker exec n ctr"), "{err}");
    }
}
