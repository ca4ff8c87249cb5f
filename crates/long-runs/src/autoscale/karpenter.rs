//! `cargo xtask autoscale karpenter`: Karpenter provisions a node for a
//! pod's claim, on the local control plane.
//!
//! The run, in order:
//! 1. each driver's `discover --instance-type T -o json` for every offered
//!    type, into the folder Karpenter reads (`AWS_DRA_TEMPLATES_DIR`), and
//!    the offered types in kwok's instance-types file;
//! 2. a control plane without kubelets; Karpenter's and kwok's CRDs (from
//!    the module cache), our charts' DeviceClasses, a KWOKNodeClass and a
//!    NodePool of the offered types;
//! 3. the KWOK controller and Karpenter (`IGNORE_DRA_REQUESTS=false`) as
//!    host processes;
//! 4. pods whose claims no offered type satisfies: none may get a
//!    NodeClaim, and each should carry Karpenter's reason (an event);
//! 5. an `examples/` file as written (by default [`EXAMPLE`]); once
//!    Karpenter's kwok provider has created the Node, both drivers start
//!    for it (`run --node-name`) on the fixture of its instance type and
//!    publish; Karpenter's initialization waits for both drivers' pools
//!    (`karpenter.sh/requested-dra-drivers`); the scheduler allocates the
//!    claim from the published slices and binds the pod; KWOK runs it.
//!
//! Every step is timed from the pod's creation by polling the API every
//! 200 ms. Nothing here prepares a device: no kubelet runs on a kwok node,
//! so the drivers publish but are never asked to prepare.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, PostParams};
use local_cluster::cluster::LocalCluster;
use local_cluster::cluster_config::ClusterConfig;
use local_cluster::paths::repo_root;
use local_cluster::process::ManagedProcess;
use local_cluster::versions::KubernetesVersion;
use serde_json::{Value, json};

use super::objects::{self, Offer};
use super::observe;
use super::report::{KarpenterReport, Provisioned, Unprovisioned};
use super::tools::Tools;

/// The namespace of the run's pods.
pub const NAMESPACE: &str = "autoscale-karpenter";
/// The claim shape the run provisions for by default (AWS's "4 connected
/// chips and their 4 EFAs"), applied as written.
pub const EXAMPLE: &str = "examples/neuron/neuron-4-chips-with-efas.yaml";
const POLL: Duration = Duration::from_millis(200);

/// What to run.
#[derive(Debug, Clone)]
pub struct KarpenterOptions {
    pub kubernetes_version: KubernetesVersion,
    pub tools: Tools,
    pub efa_driver: PathBuf,
    pub neuron_driver: PathBuf,
    /// The instance types offered to Karpenter.
    pub offers: Vec<Offer>,
    /// The `examples/` file (repository-relative) whose pod Karpenter
    /// provisions for, applied as written.
    pub example: String,
    /// The charts' DeviceClasses.
    pub classes: Vec<Value>,
    /// Scratch space: templates, fixtures, logs of the host processes.
    pub scratch: PathBuf,
    /// How long the provisioned pod may take to run.
    pub timeout: Duration,
    /// How long unsatisfiable pods are watched for a NodeClaim.
    pub unsatisfiable_window: Duration,
}

/// Runs the scenario on a fresh control plane.
pub async fn run(options: &KarpenterOptions) -> Result<KarpenterReport> {
    let templates = options.scratch.join("templates");
    write_templates(options, &templates)?;
    let mut config = ClusterConfig::with_nodes(&[]);
    config.kubernetes_version = options.kubernetes_version.clone();
    let cluster = LocalCluster::start(config).await?;
    let logs = cluster.run_dir().join("autoscale");
    eprintln!(
        "autoscale: logs of Karpenter, KWOK and the drivers in {}",
        logs.display()
    );
    let mut processes = Vec::new();
    let result = run_on(&cluster, options, &templates, &logs, &mut processes).await;
    for mut p in processes.drain(..).rev() {
        p.terminate(Duration::from_secs(5));
    }
    let teardown = cluster.shutdown();
    if !teardown.is_clean() {
        eprintln!("autoscale: teardown left {teardown:?}");
    }
    result
}

/// Step 1: the templates Karpenter attaches and kwok's instance types.
fn write_templates(options: &KarpenterOptions, dir: &Path) -> Result<()> {
    for offer in &options.offers {
        let type_dir = dir.join(offer.name);
        std::fs::create_dir_all(&type_dir)
            .with_context(|| format!("creating {}", type_dir.display()))?;
        for (file, binary) in [
            ("efa", &options.efa_driver),
            ("neuron", &options.neuron_driver),
        ] {
            let out = Command::new(binary)
                .args(["discover", "--instance-type", offer.name, "-o", "json"])
                .output()
                .with_context(|| format!("running {}", binary.display()))?;
            if !out.status.success() {
                bail!(
                    "{} discover --instance-type {}: {}",
                    binary.display(),
                    offer.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let path = type_dir.join(format!("{file}.json"));
            std::fs::write(&path, &out.stdout)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let path = dir.with_file_name("instance-types.json");
    std::fs::write(
        &path,
        objects::kwok_instance_types(&options.offers).to_string(),
    )
    .with_context(|| format!("writing {}", path.display()))
}

async fn run_on(
    cluster: &LocalCluster,
    options: &KarpenterOptions,
    templates: &Path,
    logs: &Path,
    processes: &mut Vec<ManagedProcess>,
) -> Result<KarpenterReport> {
    let client = cluster.client()?;
    let kubeconfig = cluster.admin_kubeconfig().to_path_buf();
    setup_cluster(&client, options).await?;
    processes.push(start_kwok(options, &kubeconfig, logs)?);
    processes.push(start_karpenter(options, &kubeconfig, templates, logs)?);
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("creating the namespace")?;

    let mut report = KarpenterReport {
        kubernetes: options.kubernetes_version.to_string(),
        karpenter_version: options.tools.karpenter_version.clone(),
        kwok_version: options.tools.kwok_version.clone(),
        offered: options.offers.iter().map(|o| o.name.to_string()).collect(),
        ..KarpenterReport::default()
    };
    report.unsatisfiable = unsatisfiable(&client, options.unsatisfiable_window).await?;
    report.provisioned = provision(cluster, &client, options, logs, processes).await?;
    // The unsatisfiable pods once more, after the node came: still pending,
    // and the only NodeClaim is the provisioned pod's.
    let claims = observe::list_nodeclaims(&client).await?;
    let others = claims
        .iter()
        .filter(|c| Some(&c.name) != report.provisioned.nodeclaim.as_ref())
        .count();
    for u in report
        .unsatisfiable
        .iter_mut()
        .filter(|u| u.refused.is_none())
    {
        u.nodeclaims = u.nodeclaims.max(others);
        u.phase = observe::pod_state(&client, NAMESPACE, &u.pod).await?.1;
        if let Some(reason) = observe::karpenter_event(&client, NAMESPACE, &u.pod).await? {
            u.karpenter_reason = Some(reason);
        }
    }
    Ok(report)
}

/// Step 2: CRDs, DeviceClasses, the NodeClass and the NodePool.
async fn setup_cluster(client: &Client, options: &KarpenterOptions) -> Result<()> {
    let crd_dirs = [
        options.tools.karpenter_source.join("pkg/apis/crds"),
        options.tools.karpenter_source.join("kwok/apis/crds"),
    ];
    for dir in crd_dirs {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            for obj in e2e::manifests::parse(&file.display().to_string(), &text)? {
                e2e::manifests::apply(client, &obj, None).await?;
            }
        }
    }
    for class in &options.classes {
        e2e::manifests::apply(client, class, None).await?;
    }
    // The CRDs take a moment to be served: retry for up to a minute.
    let started = Instant::now();
    for obj in [objects::node_class(), objects::node_pool(&options.offers)] {
        while let Err(e) = e2e::manifests::apply(client, &obj, None).await {
            if started.elapsed() > Duration::from_secs(60) {
                return Err(e.into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// A free TCP port on 127.0.0.1 (released before use; the processes bind it
/// a moment later).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Step 3: the KWOK controller, with KWOK's own "fast" stages (a Node is
/// Ready at once and heartbeats, a pod runs once bound) from its module.
fn start_kwok(
    options: &KarpenterOptions,
    kubeconfig: &Path,
    logs: &Path,
) -> Result<ManagedProcess> {
    let stages = options.tools.kwok_source.join("kustomize/stage");
    let mut config = String::new();
    for file in [
        "node/fast/node-initialize.yaml",
        "node/heartbeat/node-heartbeat.yaml",
        "pod/fast/pod-ready.yaml",
        "pod/fast/pod-complete.yaml",
        "pod/fast/pod-delete.yaml",
    ] {
        let path = stages.join(file);
        config.push_str(
            &std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
        config.push_str("\n---\n");
    }
    let path = options.scratch.join("kwok-stages.yaml");
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(&options.tools.kwok);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--config")
        .arg(&path)
        .args([
            "--manage-nodes-with-annotation-selector",
            "kwok.x-k8s.io/node=fake",
        ])
        .arg(format!("--server-address=127.0.0.1:{}", free_port()?));
    Ok(ManagedProcess::spawn("kwok", cmd, &logs.join("kwok.log"))?)
}

/// Step 3: Karpenter with DRA on, out of the cluster, one replica.
fn start_karpenter(
    options: &KarpenterOptions,
    kubeconfig: &Path,
    templates: &Path,
    logs: &Path,
) -> Result<ManagedProcess> {
    let mut cmd = Command::new(&options.tools.karpenter);
    cmd.env("KUBECONFIG", kubeconfig)
        .env("IGNORE_DRA_REQUESTS", "false")
        .env("DISABLE_LEADER_ELECTION", "true")
        .env("METRICS_PORT", free_port()?.to_string())
        .env("HEALTH_PROBE_PORT", free_port()?.to_string())
        .env(
            "INSTANCE_TYPES_FILE_PATH",
            templates.with_file_name("instance-types.json"),
        )
        .env("AWS_DRA_TEMPLATES_DIR", templates)
        .env("LOG_LEVEL", "debug");
    Ok(ManagedProcess::spawn(
        "karpenter",
        cmd,
        &logs.join("karpenter.log"),
    )?)
}

/// Step 4: the pods no offered type can serve, watched for a window.
async fn unsatisfiable(client: &Client, window: Duration) -> Result<Vec<Unprovisioned>> {
    let mut out = Vec::new();
    for (what, objs) in objects::unsatisfiable() {
        let pod = objects::pod_name(&objs).context("no pod")?;
        let mut refused = None;
        for obj in &objs {
            if let Err(e) = apply_when_ready(client, obj).await {
                refused = Some(e.to_string());
                break;
            }
        }
        out.push(Unprovisioned {
            what: what.to_string(),
            pod,
            refused,
            ..Unprovisioned::default()
        });
    }
    tokio::time::sleep(window).await;
    let claims = observe::list_nodeclaims(client).await?.len();
    for u in out.iter_mut().filter(|u| u.refused.is_none()) {
        u.nodeclaims = claims;
        u.phase = observe::pod_state(client, NAMESPACE, &u.pod).await?.1;
        u.karpenter_reason = observe::karpenter_event(client, NAMESPACE, &u.pod).await?;
    }
    Ok(out)
}

/// Applies `obj` in the run's namespace, retrying while the namespace's
/// `default` ServiceAccount does not exist yet (a pod is refused until the
/// controller-manager has made it).
async fn apply_when_ready(client: &Client, obj: &Value) -> Result<()> {
    let started = Instant::now();
    loop {
        match e2e::manifests::apply(client, obj, Some(NAMESPACE)).await {
            Ok(_) => return Ok(()),
            Err(e)
                if e.to_string().contains("serviceaccount")
                    && started.elapsed() < Duration::from_secs(30) =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Step 5: the example's pod from Pending to Running.
async fn provision(
    cluster: &LocalCluster,
    client: &Client,
    options: &KarpenterOptions,
    logs: &Path,
    processes: &mut Vec<ManagedProcess>,
) -> Result<Provisioned> {
    let example = &options.example;
    let path = repo_root().join(example);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {example}"))?;
    let objs = e2e::manifests::parse(example, &text)?;
    let pod = objects::pod_name(&objs).context("the example has no pod")?;
    let mut p = Provisioned {
        example: example.clone(),
        pod: pod.clone(),
        expected_drivers: objects::requested_classes(&objs),
        ..Provisioned::default()
    };
    for obj in &objs {
        apply_when_ready(client, obj).await?;
    }
    let t0 = Instant::now();
    let since = |t0: Instant| Some(t0.elapsed().as_secs_f64());
    let before: Vec<String> = observe::list_nodeclaims(client)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    let kubeconfig = cluster.admin_kubeconfig().to_path_buf();
    while t0.elapsed() < options.timeout {
        let claims = observe::list_nodeclaims(client).await?;
        if let Some(c) = claims.iter().find(|c| !before.contains(&c.name)) {
            if p.nodeclaim.is_none() {
                p.to_nodeclaim_s = since(t0);
                p.nodeclaim = Some(c.name.clone());
                p.candidate_types = c.candidate_types.clone();
                p.requested_dra_drivers = c.requested_dra_drivers.clone();
                eprintln!(
                    "autoscale: {:.1} s: NodeClaim {} for [{}], requested-dra-drivers {:?}",
                    t0.elapsed().as_secs_f64(),
                    c.name,
                    c.candidate_types.join(", "),
                    c.requested_dra_drivers
                );
            }
            if p.node.is_none()
                && let Some(node) = kwok_node(client, &c.name).await?
            {
                p.to_node_s = since(t0);
                let instance_type = node.1.clone();
                eprintln!(
                    "autoscale: {:.1} s: Node {} ({instance_type}); starting both drivers on its fixture",
                    t0.elapsed().as_secs_f64(),
                    node.0
                );
                processes.extend(start_drivers(
                    options,
                    &node.0,
                    &instance_type,
                    &kubeconfig,
                    logs,
                )?);
                p.node = Some(node.0);
                p.instance_type = Some(instance_type);
            }
            if c.initialized && p.to_initialized_s.is_none() {
                p.to_initialized_s = since(t0);
            }
        }
        if let Some(node) = &p.node
            && p.to_pools_published_s.is_none()
        {
            let drivers = observe::complete_pools(client, node).await?;
            if p.expected_drivers.iter().all(|d| drivers.contains(d)) {
                p.to_pools_published_s = since(t0);
            }
        }
        let (bound, phase) = observe::pod_state(client, NAMESPACE, &pod).await?;
        if bound.is_some() && p.to_bound_s.is_none() {
            p.to_bound_s = since(t0);
        }
        if phase == "Running" && p.to_running_s.is_none() {
            p.to_running_s = since(t0);
        }
        // The scheduler binds as soon as the slices are there; Karpenter
        // marks the NodeClaim Initialized on its own schedule: wait for both.
        if p.to_running_s.is_some() && p.to_initialized_s.is_some() {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    p.allocated = observe::allocated_devices(client, NAMESPACE, &pod).await?;
    if p.nodeclaim.is_none()
        && let Some(reason) = observe::karpenter_event(client, NAMESPACE, &pod).await?
    {
        eprintln!("autoscale: no NodeClaim for {pod}; Karpenter: {reason}");
    }
    Ok(p)
}

/// The Node of NodeClaim `claim`, with its instance type: the one whose
/// `kubernetes.io/hostname` label is the claim's name, which Karpenter's
/// kwok provider sets when it creates the Node (its name has random parts).
async fn kwok_node(client: &Client, claim: &str) -> Result<Option<(String, String)>> {
    use k8s_openapi::api::core::v1::Node;
    let nodes = Api::<Node>::all(client.clone())
        .list(&kube::api::ListParams::default().labels(&format!("kubernetes.io/hostname={claim}")))
        .await
        .context("listing Nodes")?;
    Ok(nodes.items.into_iter().next().map(|n| {
        let labels = n.metadata.labels.unwrap_or_default();
        (
            n.metadata.name.unwrap_or_default(),
            labels
                .get("node.kubernetes.io/instance-type")
                .cloned()
                .unwrap_or_default(),
        )
    }))
}

/// Both drivers for `node`, on the fixture of its instance type, with the
/// admin's kubeconfig (a kwok node has no kubelet to hold a node identity).
fn start_drivers(
    options: &KarpenterOptions,
    node: &str,
    instance_type: &str,
    kubeconfig: &Path,
    logs: &Path,
) -> Result<Vec<ManagedProcess>> {
    // Short paths: the kubelet sockets live there (unix socket paths end at
    // 107 bytes, and a kwok node's name is long); one node per run.
    let root = options.scratch.join("node");
    let fixture = sysfs_fixtures::generate(instance_type, &root.join("fixture"))
        .with_context(|| format!("writing the fixture of {instance_type}"))?;
    let mut out = Vec::new();
    for (name, short, binary) in [
        ("efa-driver", "efa", &options.efa_driver),
        ("neuron-driver", "neuron", &options.neuron_driver),
    ] {
        let dir = root.join(short);
        for sub in ["registry", "plugins", "cdi"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let mut cmd = Command::new(binary);
        cmd.arg("run")
            .args(["--node-name", node])
            .arg("--sysfs-root")
            .arg(&fixture.sys)
            .arg("--dev-root")
            .arg(&fixture.dev)
            .arg("--kubelet-registrar-dir")
            .arg(dir.join("registry"))
            .arg("--kubelet-plugins-dir")
            .arg(dir.join("plugins"))
            .arg("--cdi-root")
            .arg(dir.join("cdi"))
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{}", free_port()?))
            .env("LOG_FORMAT", "text")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("LOG_FORMAT", "text")
            .env("NO_COLOR", "1");
        out.push(ManagedProcess::spawn(
            name,
            cmd,
            &logs.join(format!("{name}.log")),
        )?);
    }
    Ok(out)
}
