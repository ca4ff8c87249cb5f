//! `cargo xtask bench fleet`: many simulated nodes against one API server.
//!
//! A control plane without kubelets; per simulated node a Node object and
//! one `dra_core` slice publisher (the very task our drivers run), each with
//! its own API client (own connections), all in this process, publishing the
//! p5 fixture's 32 EFAs as the node's pool. For each fleet size:
//! - initial publish: spawn → every pool complete (watch event), the API
//!   server's CPU time and the fleet's requests (audit log) meanwhile;
//! - steady state: the fleet's requests over a window (0 writes expected);
//! - re-list storm: kube-apiserver restarted (SIGTERM, same command line);
//!   the fleet's requests per second after it is back, and its CPU.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use super::fleet_report::{FleetReport, FleetSize, Storm};
use super::idle::proc_cpu_seconds;
use super::measure::{count_requests, unix_now};
use super::pool_timer::PoolTimer;
use super::read_audit;
use super::rounds::kube_err;
use local_cluster::cluster::{LocalCluster, client_from_kubeconfig};
use local_cluster::cluster_config::ClusterConfig;
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;

/// The simulated nodes' driver name.
pub const DRIVER_NAME: &str = "fleet.bench.aws-dra.dev";
/// The fleet's identity in the audit log.
pub const USER: &str = "fleet-sim";
const APISERVER: &str = "kube-apiserver";

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Fleet sizes, run one after the other on the same control plane.
    pub nodes: Vec<usize>,
    pub steady: Duration,
    /// How long after the API server is back the storm is recorded.
    pub storm_window: Duration,
    pub kubernetes_version: KubernetesVersion,
    /// `efa-driver`, for the devices (`discover` of the p5 fixture).
    pub efa_driver: PathBuf,
}

/// Runs every fleet size on a fresh control plane.
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
    let devices = fixture_devices(&options.efa_driver, &run_dir)?;
    let kubeconfig = cluster.kubeconfig_for_user("fleet", USER, &["system:masters"])?;
    let mut sizes = Vec::new();
    for &n in &options.nodes {
        eprintln!("fleet: {n} nodes");
        sizes.push(run_size(cluster, options, &kubeconfig, &devices, n).await?);
    }
    Ok(FleetReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        devices_per_node: devices.len(),
        steady_secs: options.steady.as_secs(),
        storm_window_secs: options.storm_window.as_secs(),
        sizes,
        run_dir: run_dir.display().to_string(),
    })
}

/// The p5 fixture's EFAs as our driver publishes them.
fn fixture_devices(efa_driver: &Path, run_dir: &Path) -> Result<Vec<Device>> {
    let fixture = sysfs_fixtures::generate("p5.48xlarge", &run_dir.join("fleet-fixture"))?;
    let out = run_dir.join("fleet-slices.json");
    super::refdriver::discover_devices(
        efa_driver,
        &[],
        &fixture.sys,
        &fixture.dev,
        "template",
        &out,
    )?;
    let text = std::fs::read_to_string(&out).map_err(local_cluster::error::io("reading", &out))?;
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<ResourceSlice>,
    }
    let list: List = serde_json::from_str(&text).map_err(|source| Error::Json {
        what: out.display().to_string(),
        source,
    })?;
    Ok(list
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect())
}

fn apiserver_cpu(cluster: &LocalCluster) -> f64 {
    cluster
        .control_plane_pid(APISERVER)
        .and_then(proc_cpu_seconds)
        .unwrap_or(0.0)
}

async fn run_size(
    cluster: &LocalCluster,
    options: &FleetOptions,
    kubeconfig: &Path,
    devices: &[Device],
    n: usize,
) -> Result<FleetSize> {
    let admin = cluster.client()?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let label = format!("bench.aws-dra.dev/fleet={n}");
    let mut owners = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("f{n}-{i:04}");
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"bench.aws-dra.dev/fleet": n.to_string()}},
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
    let metrics = dra_core::testing::PublishMetrics::register(&prometheus::Registry::new())
        .map_err(|e| Error::Testbed(format!("publisher metrics: {e}")))?;
    let mut timer = PoolTimer::start(&admin, DRIVER_NAME).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let cpu0 = apiserver_cpu(cluster);
    let t0 = unix_now();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for owner in owners {
        let kubeconfig = kubeconfig.to_path_buf();
        let devices = devices.to_vec();
        let metrics = metrics.clone();
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let client = client_from_kubeconfig(&kubeconfig).await?;
            // As a driver does at start: read its Node.
            let nodes: Api<Node> = Api::all(client.clone());
            nodes
                .get(&owner.name)
                .await
                .map_err(kube_err(format!("reading node {}", owner.name)))?;
            let name = owner.name.clone();
            let config =
                dra_core::testing::PublisherConfig::new(DRIVER_NAME, &name, Some(owner), metrics)
                    .map_err(|e| Error::Testbed(e.to_string()))?;
            let (_devices_tx, devices_rx) =
                watch::channel(dra_core::testing::PoolContent::devices(devices));
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            dra_core::testing::publish(client, config, devices_rx, shutdown).await;
            Ok::<(), Error>(())
        }));
    }
    let publish = timer
        .wait(n, devices.len(), started, Duration::from_secs(900))
        .await?;
    let t1 = unix_now();
    let cpu1 = apiserver_cpu(cluster);
    eprintln!(
        "fleet: {n} pools complete in {:.2} s",
        publish.as_secs_f64()
    );
    drop(timer);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (t2, cpu2) = (unix_now(), apiserver_cpu(cluster));
    tokio::time::sleep(options.steady).await;
    let (t3, cpu3) = (unix_now(), apiserver_cpu(cluster));

    eprintln!("fleet: restarting {APISERVER}");
    let t4 = unix_now();
    let restarted = Instant::now();
    let pid = cluster.restart_apiserver(Duration::ZERO).await?;
    let back = restarted.elapsed();
    tokio::time::sleep(options.storm_window).await;
    let t6 = unix_now();
    let storm_cpu = proc_cpu_seconds(pid).unwrap_or(0.0);
    // After the storm every pool must still be complete and unchanged.
    let timer = PoolTimer::start(&admin, DRIVER_NAME).await?;
    let still_complete = timer.complete_pools(devices.len());
    drop(timer);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = read_audit(cluster.run_dir())?;
    let fleet = |u: &str| u == USER;

    let _ = stop_tx.send(true);
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(30), t).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("fleet: a publisher failed: {e}"),
            Ok(Err(e)) => eprintln!("fleet: a publisher task panicked: {e}"),
            Err(_) => eprintln!("fleet: a publisher did not stop within 30 s"),
        }
    }
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&format!("spec.driver={DRIVER_NAME}")),
        )
        .await
        .map_err(kube_err("deleting the fleet's slices".into()))?;
    nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&label),
        )
        .await
        .map_err(kube_err("deleting the fleet's nodes".into()))?;

    let storm_requests: Vec<f64> = audit
        .iter()
        .filter(|r| r.received >= t4 && r.received < t6 && fleet(&r.user))
        .map(|r| r.received - t4)
        .collect();
    Ok(FleetSize {
        nodes: n,
        publish_s: publish.as_secs_f64(),
        publish_apiserver_cpu_s: cpu1 - cpu0,
        publish_requests: count_requests(&audit, fleet, t0, t1 + 1.0),
        steady_apiserver_cpu_s: cpu3 - cpu2,
        steady_requests: count_requests(&audit, fleet, t2, t3),
        storm: Storm::from_offsets(
            back.as_secs_f64(),
            &storm_requests,
            count_requests(&audit, fleet, t4, t6),
            storm_cpu,
            still_complete,
        ),
    })
}
