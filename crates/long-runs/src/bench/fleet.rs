//! `cargo xtask bench fleet`: many simulated nodes against one API server.
//!
//! A control plane without kubelets; per simulated node a Node object and,
//! per driver of the node's shape ([`shape`]: p5's EFAs, or trn2's
//! NeuronCore partitions or whole chips beside its EFAs), one `dra_core`
//! slice publisher (the very task our drivers run), each with its own API
//! client (own connections), all in this process. For each shape and fleet
//! size, on an API server process of its own (restarted before the size, so
//! that its memory is the size's):
//! - initial publish: spawn → every pool complete (watch event), the API
//!   server's CPU time and peak memory, the fleet's requests (audit log);
//! - steady state: the fleet's requests over a window (0 expected);
//! - re-list storm: kube-apiserver restarted (SIGTERM, same command line);
//!   the fleet's requests per second after it is back, until the last one
//!   (the fleet steady again), and the new process's CPU and memory.

pub mod shape;

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::fleet_report::{FleetReport, FleetSize, ShapeRun, Storm};
use super::idle::proc_cpu_seconds;
use super::measure::{AuditRequest, count_requests, parse_audit_log, proc_memory_kib, unix_now};
use super::pool_timer::PoolTimer;
use super::rounds::kube_err;
use local_cluster::cluster::{LocalCluster, client_from_kubeconfig};
use local_cluster::cluster_config::ClusterConfig;
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;
use shape::{FleetShape, NodePool};

/// The fleet's identity in the audit log.
pub const USER: &str = "fleet-sim";
const APISERVER: &str = "kube-apiserver";
/// Longest wait for a size's pools: 1,000 trn2 nodes publish 6,000 slices
/// through one debug-built process on two shared cores.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1800);

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Node shapes, each run at every size.
    pub shapes: Vec<FleetShape>,
    /// Fleet sizes, run one after the other on the same control plane.
    pub nodes: Vec<usize>,
    pub steady: Duration,
    /// How long after the API server is back the storm is recorded.
    pub storm_window: Duration,
    pub kubernetes_version: KubernetesVersion,
    /// `efa-driver` and `neuron-driver`, for the devices (`discover` of the
    /// shape's fixture).
    pub efa_driver: std::path::PathBuf,
    pub neuron_driver: std::path::PathBuf,
}

/// Runs every shape and fleet size on one fresh control plane.
pub async fn run(options: &FleetOptions) -> Result<FleetReport> {
    let mut config = ClusterConfig::with_nodes(&[]);
    config.kubernetes_version = options.kubernetes_version.clone();
    config.audit_log = true;
    let cluster = LocalCluster::start(config).await?;
    let result = run_on(&cluster, options).await;
    let teardown = cluster.shutdown();
    if !teardown.is_clean() {
        eprintln!("fleet: teardown left {teardown:?}");
    }
    result
}

async fn run_on(cluster: &LocalCluster, options: &FleetOptions) -> Result<FleetReport> {
    let run_dir = cluster.run_dir().to_path_buf();
    let kubeconfig = cluster.kubeconfig_for_user("fleet", USER, &["system:masters"])?;
    let mut shapes = Vec::new();
    let mut first = true;
    for &shape in &options.shapes {
        let pools =
            shape::node_pools(shape, &options.efa_driver, &options.neuron_driver, &run_dir)?;
        let (pools, pool_sizes): (Vec<NodePool>, Vec<_>) = pools.into_iter().unzip();
        let mut sizes = Vec::new();
        for &n in &options.nodes {
            eprintln!("fleet: {shape}, {n} nodes");
            if !first {
                cluster.restart_apiserver(Duration::ZERO).await?;
            }
            first = false;
            let size = run_size(cluster, options, &kubeconfig, shape, &pools, n).await?;
            sizes.push(size);
        }
        shapes.push(ShapeRun {
            shape: shape.to_string(),
            pools: pool_sizes,
            sizes,
        });
    }
    Ok(FleetReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        steady_secs: options.steady.as_secs(),
        storm_window_secs: options.storm_window.as_secs(),
        shapes,
        run_dir: run_dir.display().to_string(),
    })
}

fn apiserver_pid(cluster: &LocalCluster) -> i32 {
    cluster.control_plane_pid(APISERVER).unwrap_or(0)
}

fn apiserver_cpu(cluster: &LocalCluster) -> f64 {
    proc_cpu_seconds(apiserver_pid(cluster)).unwrap_or(0.0)
}

/// `(VmRSS, VmHWM)` of the API server, KiB.
fn apiserver_memory(cluster: &LocalCluster) -> (u64, u64) {
    proc_memory_kib(apiserver_pid(cluster)).unwrap_or((0, 0))
}

fn audit_path(run_dir: &Path) -> std::path::PathBuf {
    run_dir.join("audit.log")
}

fn audit_len(run_dir: &Path) -> u64 {
    std::fs::metadata(audit_path(run_dir)).map_or(0, |m| m.len())
}

/// The audit log's requests from byte `from` on: each size reads only its
/// own part of a log that grows by tens of MB per size.
fn audit_from(run_dir: &Path, from: u64) -> Result<Vec<AuditRequest>> {
    let path = audit_path(run_dir);
    let mut file =
        std::fs::File::open(&path).map_err(local_cluster::error::io("opening", &path))?;
    file.seek(SeekFrom::Start(from))
        .map_err(local_cluster::error::io("seeking in", &path))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(local_cluster::error::io("reading", &path))?;
    // A line cut at `from` fails to parse and is skipped: it is older.
    Ok(parse_audit_log(&String::from_utf8_lossy(&bytes)))
}

/// Creates `n` Nodes labelled `label`; their owner references for the slices.
async fn create_nodes(
    nodes: &Api<Node>,
    prefix: &str,
    label: &str,
    n: usize,
) -> Result<Vec<dra_core::testing::NodeOwner>> {
    let mut owners = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}-{i:04}");
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"bench.aws-dra.dev/fleet": label}},
        }))
        .map_err(|source| Error::Json {
            what: "node".into(),
            source,
        })?;
        let created = nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(kube_err(format!("creating node {name}")))?;
        owners.push(dra_core::testing::NodeOwner {
            name,
            uid: created.metadata.uid.unwrap_or_default(),
        });
    }
    Ok(owners)
}

/// One driver of one simulated node: its own client, a GET of its Node (as
/// a driver does at start), then the publisher until `stop`.
fn spawn_publisher(
    kubeconfig: &Path,
    owner: dra_core::testing::NodeOwner,
    pool: &NodePool,
    metrics: dra_core::testing::PublishMetrics,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<Result<()>> {
    let kubeconfig = kubeconfig.to_path_buf();
    let content = pool.content.clone();
    let driver = pool.driver;
    tokio::spawn(async move {
        let client = client_from_kubeconfig(&kubeconfig).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .get(&owner.name)
            .await
            .map_err(kube_err(format!("reading node {}", owner.name)))?;
        let name = owner.name.clone();
        let config = dra_core::testing::PublisherConfig::new(driver, &name, Some(owner), metrics)
            .map_err(|e| Error::Testbed(e.to_string()))?;
        let (_content_tx, content_rx) = watch::channel(content);
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        dra_core::testing::publish(client, config, content_rx, shutdown).await;
        Ok(())
    })
}

/// Stops the publishers and reports, in one line, those that failed.
async fn stop_publishers(stop: watch::Sender<bool>, tasks: Vec<JoinHandle<Result<()>>>) {
    let _ = stop.send(true);
    let aborts: Vec<_> = tasks.iter().map(JoinHandle::abort_handle).collect();
    let total = tasks.len();
    match tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks)).await {
        Ok(results) => {
            let mut failed = results.iter().filter(|r| !matches!(r, Ok(Ok(()))));
            if let Some(first) = failed.next() {
                eprintln!(
                    "fleet: {} of {total} publishers failed, the first: {first:?}",
                    failed.count() + 1
                );
            }
        }
        Err(_) => {
            eprintln!("fleet: publishers did not all stop within 60 s; aborted");
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
        }
    }
}

/// Complete pools of every driver of `pools` in the API now.
async fn complete_pools(admin: &kube::Client, pools: &[NodePool]) -> Result<usize> {
    let mut complete = 0;
    for pool in pools {
        let timer = PoolTimer::start(admin, pool.driver).await?;
        complete += timer.complete_pools(pool.content.devices.len());
    }
    Ok(complete)
}

async fn delete_fleet(admin: &kube::Client, pools: &[NodePool], label: &str) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    for pool in pools {
        slices
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields(&format!("spec.driver={}", pool.driver)),
            )
            .await
            .map_err(kube_err(format!("deleting the slices of {}", pool.driver)))?;
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("bench.aws-dra.dev/fleet={label}")),
        )
        .await
        .map_err(kube_err("deleting the fleet's nodes".into()))?;
    Ok(())
}

async fn run_size(
    cluster: &LocalCluster,
    options: &FleetOptions,
    kubeconfig: &Path,
    shape: FleetShape,
    pools: &[NodePool],
    n: usize,
) -> Result<FleetSize> {
    let run_dir = cluster.run_dir();
    let admin = cluster.client()?;
    let label = format!("{shape}-{n}");
    let owners = create_nodes(&Api::all(admin.clone()), &label, &label, n).await?;
    let metrics = dra_core::testing::PublishMetrics::register(&prometheus::Registry::new())
        .map_err(|e| Error::Testbed(format!("publisher metrics: {e}")))?;
    let mut timers = Vec::with_capacity(pools.len());
    for pool in pools {
        timers.push(PoolTimer::start(&admin, pool.driver).await?);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let rss_before = apiserver_memory(cluster).0;
    let audit_offset = audit_len(run_dir);
    let cpu0 = apiserver_cpu(cluster);
    let t0 = unix_now();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n * pools.len());
    for owner in owners {
        for pool in pools {
            tasks.push(spawn_publisher(
                kubeconfig,
                owner.clone(),
                pool,
                metrics.clone(),
                stop_rx.clone(),
            ));
        }
    }
    let mut publish = Duration::ZERO;
    for (timer, pool) in timers.iter_mut().zip(pools) {
        let done = timer
            .wait(n, pool.content.devices.len(), started, PUBLISH_TIMEOUT)
            .await?;
        publish = publish.max(done);
    }
    let t1 = unix_now();
    let cpu1 = apiserver_cpu(cluster);
    let peak_rss = apiserver_memory(cluster).1;
    eprintln!(
        "fleet: {shape}, {n} nodes: pools complete in {:.2} s",
        publish.as_secs_f64()
    );
    drop(timers);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (t2, cpu2) = (unix_now(), apiserver_cpu(cluster));
    tokio::time::sleep(options.steady).await;
    let (t3, cpu3) = (unix_now(), apiserver_cpu(cluster));
    let steady_rss = apiserver_memory(cluster).0;
    // The simulator's own peak so far (all its sizes): what a size costs
    // the machine beside the API server.
    let fleet_peak_rss_kib = std::process::id()
        .try_into()
        .ok()
        .and_then(proc_memory_kib)
        .map_or(0, |(_, hwm)| hwm);

    eprintln!("fleet: {shape}, {n} nodes: restarting {APISERVER}");
    let t4 = unix_now();
    let restarted = Instant::now();
    let pid = cluster.restart_apiserver(Duration::ZERO).await?;
    let back = restarted.elapsed();
    let start_cpu = proc_cpu_seconds(pid).unwrap_or(0.0);
    tokio::time::sleep(options.storm_window).await;
    let t6 = unix_now();
    let storm_cpu = proc_cpu_seconds(pid).unwrap_or(0.0);
    let storm_peak_rss = proc_memory_kib(pid).map_or(0, |(_, hwm)| hwm);
    // After the storm every pool must still be complete and unchanged.
    let still_complete = complete_pools(&admin, pools).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = audit_from(run_dir, audit_offset)?;
    let fleet = |u: &str| u == USER;

    stop_publishers(stop_tx, tasks).await;
    delete_fleet(&admin, pools, &label).await?;

    let storm_requests: Vec<f64> = audit
        .iter()
        .filter(|r| r.received >= t4 && r.received < t6 && fleet(&r.user))
        .map(|r| r.received - t4)
        .collect();
    let mut storm = Storm::from_offsets(
        back.as_secs_f64(),
        &storm_requests,
        count_requests(&audit, fleet, t4, t6),
    );
    storm.apiserver_start_cpu_s = start_cpu;
    storm.apiserver_cpu_s = storm_cpu;
    storm.apiserver_peak_rss_kib = storm_peak_rss;
    storm.pools_complete_after = still_complete;
    Ok(FleetSize {
        nodes: n,
        publish_s: publish.as_secs_f64(),
        publish_apiserver_cpu_s: cpu1 - cpu0,
        publish_requests: count_requests(&audit, fleet, t0, t1 + 1.0),
        apiserver_rss_before_kib: rss_before,
        apiserver_peak_rss_kib: peak_rss,
        steady_apiserver_cpu_s: cpu3 - cpu2,
        steady_requests: count_requests(&audit, fleet, t2, t3),
        steady_apiserver_rss_kib: steady_rss,
        fleet_peak_rss_kib,
        storm,
    })
}
