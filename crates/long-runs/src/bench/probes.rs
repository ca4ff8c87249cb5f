//! `cargo xtask bench probes`: what a storm of health probes costs prepare.
//!
//! One `efa-driver` (release build) on node p5 of a fresh local cluster
//! (p5.48xlarge fixture, 32 EFAs; the driver's default rescan interval),
//! started by the testbed as the chart would run it. The bench calls the
//! driver's DRA socket itself, as kubelet does: a burst is
//! [`ProbesOptions::claims`] `NodePrepareResources` calls at once, one
//! claim each, over one connection, every call timed from its send to its
//! answer; then the same claims unprepared (untimed). The claims are real
//! objects in the API server, allocated by the bench (a status write, as
//! the scheduler makes it) to distinct devices of the node's pool, so each
//! prepare GETs its claim, writes its CDI spec and commits the checkpoint.
//!
//! Three conditions, each a window of [`ProbesOptions::bursts`] bursts:
//! - `none`: no storm;
//! - `probes`: a storm of [`ProbesOptions::rate`] requests/s to `/healthz`
//!   and `/readyz` in turn on the driver's ops server;
//! - `nothing`: the same storm to [`NOTHING_PATH`] on the same server, which
//!   answers a fixed 404 and does no work (no probe, no lock, no metrics
//!   encoding), so the storm's cost in connections, parsing and the load of
//!   its client is the same as under `probes`.
//!
//! `probes / nothing` is then the cost of the probes' own work. Every round
//! runs each condition once, in an order that rotates with the round, so
//! that the other work of a shared machine falls on all three alike; the
//! load average is recorded at the end of each window. The storm runs on a
//! runtime of its own, so its tasks do not queue the bench's timing tasks.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::time::{Duration, Instant};

use dra_core::testing::{dra_v1, unix_channel};
use futures::future::join_all;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::idle::CostSample;
use super::probe_storm::{Storm, get_status};
pub use super::probes_report::{
    Condition, ConditionFigures, NOTHING_PATH, PROBE_PATHS, ProbesOptions, ProbesReport, Window,
};
use super::rounds::{self, NAMESPACE, kube_err};
use e2e::local::LocalTestbed;
use e2e::testbed::{DriverKind, LocalOptions, ManagedTestbed, Testbed};
use local_cluster::error::{Error, Result};

/// The node the driver runs on.
pub(super) const NODE: &str = "p5";
pub(super) const INSTANCE_TYPE: &str = "p5.48xlarge";
/// How long a storm runs before the first burst of its window, so that
/// the bursts meet a steady storm (and the probes' shared result).
const STORM_SETTLE: Duration = Duration::from_secs(1);
/// The pause after each burst's unprepare: the claim status writes the
/// driver makes after each call land before the next burst.
pub(super) const BETWEEN_BURSTS: Duration = Duration::from_millis(250);

/// Runs the bench on a fresh local cluster (root and the cluster's built
/// components, like the end-to-end suite).
pub async fn run(options: &ProbesOptions) -> Result<ProbesReport> {
    // The storm's own runtime (see the module doc).
    on_p5(
        &options.bin_dir,
        &options.kubernetes_version,
        "probes",
        "probe-storm",
        async |testbed, storm_runtime| run_on(testbed, options, storm_runtime).await,
    )
    .await
}

/// Starts a local cluster of node p5 with our EFA driver (from `bin_dir`;
/// the rescan interval a node runs, not the testbeds' 1 s) and a runtime of
/// one worker named `thread` for the load the bench sends, so that its
/// tasks do not queue the bench's timing tasks; runs `bench` on them, then
/// shuts both down (the runtime without waiting, as a runtime may not be
/// dropped inside another). `name` labels the teardown's complaint.
pub(super) async fn on_p5<R>(
    bin_dir: &Path,
    kubernetes_version: &local_cluster::KubernetesVersion,
    name: &str,
    thread: &str,
    bench: impl AsyncFnOnce(&LocalTestbed, &tokio::runtime::Handle) -> Result<R>,
) -> Result<R> {
    let testbed = LocalTestbed::start(LocalOptions {
        nodes: vec![(NODE.into(), INSTANCE_TYPE.into(), vec![DriverKind::Efa])],
        bin_dir: Some(bin_dir.to_path_buf()),
        kubernetes_version: kubernetes_version.clone(),
        rescan_interval: Some(dra_core::DEFAULT_RESCAN_INTERVAL),
        ..LocalOptions::default()
    })
    .await?;
    let load_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(thread)
        .enable_all()
        .build()
        .map_err(|e| Error::Testbed(format!("starting the {thread} runtime: {e}")))?;
    let result = bench(&testbed, load_runtime.handle()).await;
    load_runtime.shutdown_background();
    let teardown = testbed.shutdown();
    if !teardown.is_clean() {
        eprintln!("bench {name}: teardown left {teardown:?}");
    }
    result
}

/// The EFA driver on p5, ready for bursts: its pid, its ops address, the
/// `claims` claims allocated on its devices, its DRA socket, after one
/// warm-up burst.
pub(super) struct BurstSetup {
    pub(super) pid: i32,
    pub(super) ops: SocketAddr,
    pub(super) claims: Vec<dra_v1::Claim>,
    pub(super) dra: DraSocket,
}

impl BurstSetup {
    /// Waits for the driver to be ready, allocates the claims and warms up
    /// (`name` labels the log line).
    pub(super) async fn start(testbed: &LocalTestbed, claims: usize, name: &str) -> Result<Self> {
        let efa = DriverKind::Efa;
        let client = testbed.client();
        let pid = testbed
            .driver_pid(NODE, efa)
            .ok_or_else(|| Error::Testbed("efa-driver has no pid".into()))?;
        let ops = ops_address(pid)?;
        let node = testbed
            .local_node(NODE)
            .await
            .ok_or_else(|| Error::Testbed(format!("no local node {NODE}")))?;
        let socket = node.plugins_dir.join(efa.driver_name()).join("dra.sock");
        wait_ready(ops).await?;
        rounds::create_namespace(&client).await?;
        let devices = pool_devices(&client, efa.driver_name()).await?;
        if devices.len() < claims {
            return Err(Error::Testbed(format!(
                "{NODE} publishes {} devices, a burst needs {claims}",
                devices.len(),
            )));
        }
        let claims = allocated_claims(&client, efa.driver_name(), &devices[..claims]).await?;
        let dra = DraSocket::connect(&socket).await?;
        eprintln!(
            "bench {name}: driver pid {pid}, ops {ops}, {} claims allocated; a warm-up burst",
            claims.len()
        );
        dra.burst(&claims).await?;
        Ok(Self {
            pid,
            ops,
            claims,
            dra,
        })
    }
}

async fn run_on(
    testbed: &LocalTestbed,
    options: &ProbesOptions,
    storm_runtime: &tokio::runtime::Handle,
) -> Result<ProbesReport> {
    let BurstSetup {
        pid,
        ops,
        claims,
        dra,
    } = BurstSetup::start(testbed, options.claims, "probes").await?;

    let mut windows = Vec::new();
    for round in 0..options.rounds {
        let mut order = Condition::ALL;
        order.rotate_left(round % Condition::ALL.len());
        for condition in order {
            let w = run_window(
                &dra,
                &claims,
                condition,
                round,
                pid,
                ops,
                options,
                storm_runtime,
            )
            .await?;
            eprintln!("bench probes: {}", w.summary());
            windows.push(w);
        }
    }
    Ok(ProbesReport::new(
        options,
        NODE,
        DriverKind::Efa.driver_name(),
        windows,
        testbed.run_dir(),
    ))
}

/// One condition's window: the storm (if any) started and settled, the
/// bursts, the storm stopped; the driver's CPU time over the window.
#[allow(clippy::too_many_arguments)]
async fn run_window(
    dra: &DraSocket,
    claims: &[dra_v1::Claim],
    condition: Condition,
    round: usize,
    pid: i32,
    ops: SocketAddr,
    options: &ProbesOptions,
    storm_runtime: &tokio::runtime::Handle,
) -> Result<Window> {
    let before = CostSample::take(pid);
    let storm = condition
        .paths()
        .map(|paths| Storm::start(storm_runtime, ops, paths, options.rate));
    if storm.is_some() {
        tokio::time::sleep(STORM_SETTLE).await;
    }
    let mut prepare_ms = Vec::new();
    let mut spans_ms = Vec::new();
    for _ in 0..options.bursts {
        let burst = dra.burst(claims).await?;
        prepare_ms.extend(burst.calls_ms);
        spans_ms.push(burst.span_ms);
        tokio::time::sleep(BETWEEN_BURSTS).await;
    }
    let after = CostSample::take(pid);
    let storm = match storm {
        Some(s) => Some(s.stop().await),
        None => None,
    };
    let driver_cpu_ms_per_s = match (before, after) {
        (Some(b), Some(a)) => b.until(&a).cpu_ms_per_min / 60.0,
        _ => f64::NAN,
    };
    Ok(Window {
        round,
        condition,
        prepare_ms,
        spans_ms,
        driver_cpu_ms_per_s,
        load_1m: load_average().unwrap_or(f64::NAN),
        storm,
    })
}

/// The ops server's address: the `METRICS_ADDRESS` the testbed started
/// the driver with, from the process's environment.
pub(super) fn ops_address(pid: i32) -> Result<SocketAddr> {
    let path = format!("/proc/{pid}/environ");
    let environ = std::fs::read(&path).map_err(local_cluster::error::io("reading", &path))?;
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("METRICS_ADDRESS="))
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| Error::Testbed(format!("no METRICS_ADDRESS in {path}")))
}

/// Waits (bounded) until `/readyz` answers 200: before that it answers
/// 503 without running the probe, and a storm would measure nothing.
pub(super) async fn wait_ready(ops: SocketAddr) -> Result<()> {
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {ops}\r\nConnection: close\r\n\r\n");
    let t = Instant::now();
    while t.elapsed() < super::START_TIMEOUT {
        let answer =
            tokio::time::timeout(Duration::from_secs(5), get_status(ops, request.as_bytes()));
        if answer.await.ok().flatten() == Some(200) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::Testbed(format!(
        "efa-driver's /readyz on {ops} did not answer 200 within {:?}",
        super::START_TIMEOUT
    )))
}

/// The devices of `driver` in the node's pool, by name.
pub(super) async fn pool_devices(client: &kube::Client, driver: &str) -> Result<Vec<String>> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let slices = api
        .list(&ListParams::default().fields(&format!("spec.driver={driver}")))
        .await
        .map_err(kube_err(format!("listing the slices of {driver}")))?;
    let mut names: Vec<String> = slices
        .items
        .iter()
        .filter(|s| s.spec.pool.name == NODE)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// One claim per device, created and allocated to it on the node, as the
/// scheduler would write the allocation.
pub(super) async fn allocated_claims(
    client: &kube::Client,
    driver: &str,
    devices: &[String],
) -> Result<Vec<dra_v1::Claim>> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let mut claims = Vec::new();
    for (i, device) in devices.iter().enumerate() {
        let name = format!("probes-{i}");
        let created = api
            .create(&PostParams::default(), &rounds::claim(&name, driver, None)?)
            .await
            .map_err(kube_err(format!("creating claim {name}")))?;
        let allocation = json!({"status": {"allocation": {
            "devices": {"results": [
                {"request": "dev", "driver": driver, "pool": NODE, "device": device}
            ]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}
            ]}]},
        }}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&allocation))
            .await
            .map_err(kube_err(format!("allocating claim {name} to {device}")))?;
        claims.push(dra_v1::Claim {
            namespace: NAMESPACE.into(),
            uid: created.metadata.uid.unwrap_or_default(),
            name,
        });
    }
    Ok(claims)
}

/// The 1-minute load average of the machine.
pub(super) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A call's outcome: the claim's error in the answer, or the call's.
type CallFuture = Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>;
type Call = Box<dyn Fn(dra_v1::Claim) -> CallFuture + Send + Sync>;

/// A per-claim answer as kubelet reads it: an empty error is success.
fn claim_outcome(error: Option<&String>) -> std::result::Result<(), String> {
    match error {
        Some(e) if e.is_empty() => Ok(()),
        Some(e) => Err(e.clone()),
        None => Err("no answer for the claim".into()),
    }
}

/// The driver's DRA socket, one connection for every call, as kubelet
/// holds it.
pub(super) struct DraSocket {
    prepare: Call,
    unprepare: Call,
}

/// One burst: each call's time and first call → last answer, ms.
pub(super) struct Burst {
    pub(super) calls_ms: Vec<f64>,
    pub(super) span_ms: f64,
}

impl DraSocket {
    pub(super) async fn connect(path: &Path) -> Result<DraSocket> {
        let channel = unix_channel(path)
            .await
            .map_err(|e| Error::Testbed(format!("connecting to {}: {e}", path.display())))?;
        let client = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
        let c = client.clone();
        let prepare: Call = Box::new(move |claim: dra_v1::Claim| {
            let mut c = c.clone();
            Box::pin(async move {
                let uid = claim.uid.clone();
                let answer = c
                    .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                        claims: vec![claim],
                    })
                    .await
                    .map_err(|s| s.to_string())?
                    .into_inner();
                claim_outcome(answer.claims.get(&uid).map(|a| &a.error))
            })
        });
        let c = client;
        let unprepare: Call = Box::new(move |claim: dra_v1::Claim| {
            let mut c = c.clone();
            Box::pin(async move {
                let uid = claim.uid.clone();
                let answer = c
                    .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                        claims: vec![claim],
                    })
                    .await
                    .map_err(|s| s.to_string())?
                    .into_inner();
                claim_outcome(answer.claims.get(&uid).map(|a| &a.error))
            })
        });
        Ok(DraSocket { prepare, unprepare })
    }

    /// Prepares every claim at once (timed), then unprepares them all.
    pub(super) async fn burst(&self, claims: &[dra_v1::Claim]) -> Result<Burst> {
        let start = Instant::now();
        let timed = claims.iter().map(|claim| {
            let call = (self.prepare)(claim.clone());
            async move {
                let t = Instant::now();
                let outcome = call.await;
                (t.elapsed(), start.elapsed(), outcome)
            }
        });
        let answers = join_all(timed).await;
        let span_ms = answers
            .iter()
            .map(|(_, done, _)| done.as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        let mut calls_ms = Vec::new();
        for (claim, (took, _, outcome)) in claims.iter().zip(answers) {
            outcome.map_err(|e| Error::Testbed(format!("preparing {}: {e}", claim.name)))?;
            calls_ms.push(took.as_secs_f64() * 1e3);
        }
        let released = join_all(claims.iter().map(|c| (self.unprepare)(c.clone()))).await;
        for (claim, outcome) in claims.iter().zip(released) {
            outcome.map_err(|e| Error::Testbed(format!("unpreparing {}: {e}", claim.name)))?;
        }
        Ok(Burst { calls_ms, span_ms })
    }
}
