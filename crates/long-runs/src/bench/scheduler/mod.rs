//! `cargo xtask bench scheduler`: what our slices cost the real
//! kube-scheduler (issue 41).
//!
//! Per node shape ([`shapes`]) and fleet size, on a control plane of its
//! own (no kubelets): shadow Nodes (Ready, room for many pods) each
//! carrying exactly the slices our drivers' `discover` prints for the
//! shape's fixture, the DeviceClasses as the charts ship them, then one
//! phase per claim kind ([`claims`]): as many pods as nodes, each with its
//! own claim, created at once; the time to bind them all, the scheduler's
//! own latency histograms, the API server's and scheduler's CPU and memory,
//! etcd's database size ([`phase`]). The scheduler's CPU is profiled
//! during the phases of trn2 with cores and with whole chips at the largest
//! size, and `go tool pprof -top` of it goes into the report.
//!
//! Reading the figures: pods/s is capped by more than the slices. Shapes
//! whose pods cost little compute plateau at 22-24 pods/s at 50 nodes
//! whatever their slices, which fits the scheduler's client rate limit
//! (default `clientConnection.qps` 50; two writes per pod: the claim's
//! allocation and the binding) — an inference, not measured apart. The
//! Filter phase's mean and the scheduler's CPU time are the compute cost
//! without that cap. Measured on the 2-core machine (1.37.2), trn2 with
//! cores against whole chips only, same pods: 2.64x the time to bind at 50
//! nodes, 2.88x at 100 (scheduler CPU 5.1x), 4.93x at 500 (866 s vs 176 s;
//! 16 chips: 358.6 s vs 57.0 s); 36-59 % of the scheduler's CPU (cumulative)
//! was CEL evaluation of the class selectors (`DeviceMatches`: every device
//! of every node, cores included although the class never selects them),
//! and at 500 nodes `GatherPools` another 23 %. AWS's shape costs what
//! chips-only costs (0.99x, 1.05x, 1.10x at 50, 100, 500 nodes).
//! The SLI histogram's buckets double (…, 2.56, 5.12, 10.24 s) and the
//! Filter phase's stop at 204.8 ms, so their quantiles are coarse.
//!
//! With `--gang` ([`gang`]), each shape runs a PodGroup of whole-node pods
//! against the same pods scheduled one by one instead of the claim phases,
//! on a control plane with `GenericWorkload` on.
//!
//! Limits: nodes without kubelets are marked unreachable by the node
//! lifecycle controller after its grace period; the pods tolerate that
//! taint, as they tolerate every taint. AWS's shape is our chips-only
//! slice cut down to AWS's attributes, and DRANET's EFA slice carries the
//! EFAs only (DRANET also publishes the node's other NICs).

pub mod claims;
pub mod gang;
pub mod metrics;
pub mod phase;
mod report;
pub mod shapes;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::idle::proc_cpu_seconds;
use super::measure::{proc_memory_kib, unix_now};
use super::rounds::kube_err;
use local_cluster::cluster::LocalCluster;
use local_cluster::cluster_config::ClusterConfig;
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;
use local_cluster::versions::opt_in::OptInFeature;
use metrics::{SchedulerPort, etcd_metrics, total};
pub use report::{GangRun, GangTimes, Latency, Phase, Profile, SchedulerReport, ShapeRun};
use shapes::{ChartClasses, DriverBinaries, LABEL, NodeTemplate, Shape};

const NAMESPACE: &str = "bench-scheduler";

/// What to run.
#[derive(Debug, Clone)]
pub struct SchedulerBenchOptions {
    /// Fleet sizes; each shape runs at each size on a fresh control plane.
    pub nodes: Vec<usize>,
    pub shapes: Vec<Shape>,
    pub kubernetes_version: KubernetesVersion,
    pub drivers: DriverBinaries,
    pub classes: ChartClasses,
    /// Where the fixtures are written.
    pub scratch: PathBuf,
    /// Where the CPU profiles are saved.
    pub profile_dir: PathBuf,
    /// Length of each CPU profile, from the first pod of the shape's first phase.
    pub profile_secs: u64,
    /// The `go` binary (`go tool pprof`).
    pub go: PathBuf,
    /// How long a phase's pods may take to bind, and its claims to go.
    pub phase_timeout: Duration,
    /// Instead of the claim phases: a gang of whole-node pods against the
    /// same pods one by one ([`gang`]).
    pub gang: Option<gang::GangOptions>,
}

/// Runs every shape at every size.
pub async fn run(options: &SchedulerBenchOptions) -> Result<SchedulerReport> {
    let mut templates = Vec::new();
    for &shape in &options.shapes {
        let t =
            NodeTemplate::discover(shape, &options.drivers, &options.classes, &options.scratch)?;
        eprintln!(
            "scheduler: {} publishes {} devices in {} slices ({} counter sets, {:.1} KiB)",
            shape.name(),
            t.devices(),
            t.slices.len(),
            t.counter_sets(),
            t.spec_bytes() as f64 / 1024.0
        );
        templates.push(t);
    }
    let largest = options.nodes.iter().copied().max().unwrap_or(0);
    let mut report = SchedulerReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        finished_unix: 0.0,
        runs: Vec::new(),
        profiles: Vec::new(),
    };
    for &n in &options.nodes {
        for t in &templates {
            eprintln!("scheduler: {} at {n} nodes", t.shape.name());
            let profile = (n == largest && t.shape.profiled() && options.gang.is_none())
                .then_some(options.profile_secs);
            let mut config = ClusterConfig::with_nodes(&[]);
            config.kubernetes_version = options.kubernetes_version.clone();
            if options.gang.is_some() {
                let release = options.kubernetes_version.release()?;
                if let Some(why) = release.lacks_opt_in(&[OptInFeature::GenericWorkload]) {
                    return Err(Error::Testbed(format!("--gang {why}")));
                }
                config.enable = release.enablement(&[OptInFeature::GenericWorkload]);
                eprintln!("scheduler: turning on {}", config.enable.describe());
            }
            let cluster = LocalCluster::start(config).await?;
            let result = run_shape(&cluster, options, t, n, profile).await;
            let teardown = cluster.shutdown();
            if !teardown.is_clean() {
                eprintln!("scheduler: teardown left {teardown:?}");
            }
            let (run, prof) = result?;
            report.runs.push(run);
            report.profiles.extend(prof);
        }
    }
    report.finished_unix = unix_now();
    Ok(report)
}

fn pid(cluster: &LocalCluster, name: &str) -> Result<i32> {
    cluster
        .control_plane_pid(name)
        .ok_or_else(|| Error::Testbed(format!("no {name} process")))
}

async fn etcd_sizes(etcd: i32) -> (u64, u64) {
    match etcd_metrics(etcd).await {
        Ok(text) => (
            total(&text, "etcd_mvcc_db_total_size_in_bytes", |_| true) as u64,
            total(&text, "etcd_mvcc_db_total_size_in_use_in_bytes", |_| true) as u64,
        ),
        Err(e) => {
            eprintln!("scheduler: {e}");
            (0, 0)
        }
    }
}

async fn run_shape(
    cluster: &LocalCluster,
    options: &SchedulerBenchOptions,
    template: &NodeTemplate,
    n: usize,
    profile_secs: Option<u64>,
) -> Result<(ShapeRun, Option<Profile>)> {
    let client = cluster.client()?;
    let (apiserver, scheduler_pid, etcd) = (
        pid(cluster, "kube-apiserver")?,
        pid(cluster, "kube-scheduler")?,
        pid(cluster, "etcd")?,
    );
    let scheduler = SchedulerPort::connect(scheduler_pid, cluster.admin_kubeconfig()).await?;
    scheduler.metrics().await?;
    prepare_namespace(&client).await?;
    for class in &template.classes {
        e2e::manifests::apply(&client, class, None).await?;
    }
    let (etcd_start, _) = etcd_sizes(etcd).await;

    let cpu0 = proc_cpu_seconds(apiserver).unwrap_or(0.0);
    let t = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("n{i:05}")).collect();
    let uids = create_nodes(&client, &names, template.shape).await?;
    let slices_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "resource.k8s.io",
            "v1",
            "ResourceSlice",
        )),
    );
    let all: Vec<serde_json::Value> = names
        .iter()
        .zip(&uids)
        .flat_map(|(name, uid)| template.for_node(name, uid))
        .collect();
    stream::iter(all.into_iter().map(|slice| {
        let api = slices_api.clone();
        async move {
            let obj: DynamicObject =
                serde_json::from_value(slice).map_err(|source| Error::Json {
                    what: "slice".into(),
                    source,
                })?;
            api.create(&PostParams::default(), &obj)
                .await
                .map_err(kube_err(format!("creating slice {}", obj.name_any())))
        }
    }))
    .buffer_unordered(phase::CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    let publish_s = t.elapsed().as_secs_f64();
    let publish_cpu = proc_cpu_seconds(apiserver).unwrap_or(0.0) - cpu0;
    let mut notes = Vec::new();
    if let Some(note) = dropped_counters(&slices_api, template, &names[0]).await? {
        notes.push(note);
    }
    eprintln!(
        "scheduler: {n} nodes and {} slices in {publish_s:.1} s",
        n * template.slices.len()
    );
    // Let the scheduler's informers take in the last slices.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (etcd_after_slices, etcd_in_use) = etcd_sizes(etcd).await;
    let rss = |pid| proc_memory_kib(pid).unwrap_or_default();

    let mut run = ShapeRun {
        shape: template.shape.name().into(),
        nodes: n,
        slices_per_node: template.slices.len(),
        devices_per_node: template.devices(),
        counter_sets_per_node: template.counter_sets(),
        slice_bytes_per_node: template.spec_bytes(),
        publish_s,
        publish_apiserver_cpu_s: publish_cpu,
        etcd_db_bytes_start: etcd_start,
        etcd_db_bytes_after_slices: etcd_after_slices,
        etcd_db_bytes_end: 0,
        etcd_in_use_bytes_after_slices: etcd_in_use,
        apiserver_rss_kib_after_slices: rss(apiserver).0,
        apiserver_peak_rss_kib: 0,
        scheduler_rss_kib_after_slices: rss(scheduler_pid).0,
        scheduler_peak_rss_kib: 0,
        phases: Vec::new(),
        gang: None,
        notes,
        run_dir: cluster.run_dir().display().to_string(),
    };
    let profiling = profile_secs.map(|secs| {
        let port = scheduler.clone();
        (
            secs,
            tokio::spawn(async move { port.cpu_profile(secs).await }),
        )
    });
    let subjects = phase::Subjects {
        client: &client,
        namespace: NAMESPACE,
        selector: (LABEL, "true"),
        scheduler: &scheduler,
        scheduler_pid,
        apiserver_pid: apiserver,
        timeout: options.phase_timeout,
    };
    if let Some(g) = options.gang {
        let run_gang = gang::run(&subjects, template.shape, g).await?;
        for (what, times) in [
            ("gang", &run_gang.gang),
            ("independent", &run_gang.independent),
        ] {
            if !times.all_bound {
                run.notes.push(format!(
                    "{what}: not every pod bound within {} s ({:?} of {})",
                    options.phase_timeout.as_secs(),
                    times.bound,
                    run_gang.pods
                ));
            }
        }
        if !run_gang.scheduling_group_kept {
            run.notes
                .push("the API server dropped the pods' schedulingGroup: not a gang".into());
        }
        run.gang = Some(run_gang);
    }
    let kinds = if options.gang.is_some() {
        Vec::new()
    } else {
        template.shape.claims()
    };
    for kind in kinds {
        let p = phase::run(&subjects, kind, n).await?;
        eprintln!(
            "scheduler: {} {n} nodes {}: {}/{} bound in {:.2} s ({:.1} pods/s), sli p50 {:?} ms p99 {:?} ms, {} unschedulable attempts",
            template.shape.name(),
            p.claim,
            p.bound,
            p.pods,
            p.bind_s,
            p.pods_per_s,
            p.sli.p50_ms.map(|v| v.round()),
            p.sli.p99_ms.map(|v| v.round()),
            p.attempts_unschedulable
        );
        if p.bound < p.pods {
            run.notes.push(format!(
                "{}: {} of {} pods bound within {} s",
                p.claim,
                p.bound,
                p.pods,
                options.phase_timeout.as_secs()
            ));
        }
        run.phases.push(p);
    }
    run.etcd_db_bytes_end = etcd_sizes(etcd).await.0;
    run.apiserver_peak_rss_kib = rss(apiserver).1;
    run.scheduler_peak_rss_kib = rss(scheduler_pid).1;
    let profile = match profiling {
        Some((secs, task)) => {
            let bytes = task
                .await
                .map_err(|e| Error::Testbed(format!("the profile task failed: {e}")))??;
            Some(save_profile(options, template.shape, n, secs, &bytes)?)
        }
        None => None,
    };
    Ok((run, profile))
}

/// The bench's namespace, once its default ServiceAccount exists
/// (admission refuses pods before).
async fn prepare_namespace(client: &kube::Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).map_err(|source| {
            Error::Json {
                what: "namespace".into(),
                source,
            }
        })?;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .map_err(kube_err("creating the bench namespace".into()))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(accounts.get_opt("default").await, Ok(Some(_))) {
        if Instant::now() > deadline {
            return Err(Error::Testbed(format!(
                "no ServiceAccount default in {NAMESPACE} after 60 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Shadow nodes: no kubelet, Ready, room for many pods; their UIDs.
async fn create_nodes(
    client: &kube::Client,
    names: &[String],
    shape: Shape,
) -> Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let instance_type = sysfs_fixtures::instance_type_of(shape.fixture());
    stream::iter(names.iter().map(|name| {
        let nodes = nodes.clone();
        async move {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {
                    LABEL: "true",
                    "kubernetes.io/hostname": name,
                    "node.kubernetes.io/instance-type": instance_type,
                }},
            }))
            .map_err(|source| Error::Json {
                what: "node".into(),
                source,
            })?;
            let created = nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(kube_err(format!("creating node {name}")))?;
            let resources = json!({"cpu": "1000", "memory": "4Ti", "pods": "1000"});
            nodes
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "capacity": resources, "allocatable": resources,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "ShadowNode",
                            "message": "no kubelet: a scheduler bench node"}],
                    }})),
                )
                .await
                .map_err(kube_err(format!("setting the status of node {name}")))?;
            Ok::<_, Error>(created.metadata.uid.unwrap_or_default())
        }
    }))
    .buffered(phase::CONCURRENCY)
    .try_collect()
    .await
}

/// A note when the template's devices consume counters but the API server
/// kept none on `node`'s slices (partitionable devices off).
async fn dropped_counters(
    api: &Api<DynamicObject>,
    template: &NodeTemplate,
    node: &str,
) -> Result<Option<String>> {
    let consumes = |slices: &mut dyn Iterator<Item = &serde_json::Value>| {
        slices
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter(|d| d.get("consumesCounters").is_some())
            .count()
    };
    let wanted = consumes(&mut template.slices.iter());
    if wanted == 0 {
        return Ok(None);
    }
    let list = api
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(kube_err(format!("listing the slices of {node}")))?;
    let stored: Vec<serde_json::Value> = list.items.into_iter().map(|o| o.data).collect();
    let kept = consumes(&mut stored.iter());
    Ok((kept != wanted).then(|| {
        format!(
            "{wanted} devices consume counters in the template, {kept} as stored by the API server"
        )
    }))
}

/// Saves a CPU profile and reads its top functions.
fn save_profile(
    options: &SchedulerBenchOptions,
    shape: Shape,
    n: usize,
    seconds: u64,
    bytes: &[u8],
) -> Result<Profile> {
    std::fs::create_dir_all(&options.profile_dir)
        .map_err(local_cluster::error::io("creating", &options.profile_dir))?;
    let file = options
        .profile_dir
        .join(format!("kube-scheduler-{}-{n}.pprof", shape.name()));
    std::fs::write(&file, bytes).map_err(local_cluster::error::io("writing", &file))?;
    Ok(Profile {
        shape: shape.name().into(),
        nodes: n,
        seconds,
        top: pprof_top(&options.go, &file, &[]),
        top_cum: pprof_top(&options.go, &file, &["-cum"]),
        file: file.display().to_string(),
    })
}

/// `go tool pprof -top` of a profile, its lines; the error as the only line
/// when it fails (the profile itself is saved either way).
fn pprof_top(go: &Path, file: &Path, extra: &[&str]) -> Vec<String> {
    let output = std::process::Command::new(go)
        .args(["tool", "pprof", "-top", "-nodecount=30"])
        .args(extra)
        .arg(file)
        .output();
    match output {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect(),
        Ok(o) => vec![format!(
            "go tool pprof failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )],
        Err(e) => vec![format!("running {} tool pprof: {e}", go.display())],
    }
}
