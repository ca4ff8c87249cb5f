//! `cargo xtask bench neuron`: the Neuron driver on a trn2.48xlarge node
//! (16 chips), on its own, once with NeuronCore partitions published
//! (`NEURON_PARTITIONS=cores`: a device per chip and one per core) and once
//! without (`chips`). Each run is a fresh local cluster:
//! - CPU time and wake-ups of the driver over an idle window, at the
//!   driver's default rescan interval (what a node pays at rest);
//! - bursts of single-chip pods (N = 16 by default: every chip at once),
//!   timed as the EFA bursts are ([`super::burst`]).
//!
//! The idle window measures, beside our driver, the Go reference driver
//! ([`super::refdriver`]) publishing the same devices (`neuron-driver
//! discover` of the node, shared counters included) under its own name:
//! what a Go driver on the upstream helper costs at rest with this pool. It
//! reads no health and never rescans; it serves no Neuron prepare, so the
//! bursts are ours alone.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::burst::{self, Burst};
use super::idle::{IdleCost, IdleMeter};
use super::measure::Stats;
use super::{pool_timer, refdriver, rounds};
use e2e::local::LocalTestbed;
use e2e::testbed::{DriverKind, LocalOptions, ManagedTestbed, Testbed};
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;

const NODE: &str = "trn2";
const INSTANCE_TYPE: &str = "trn2.48xlarge";
/// Only chips (not cores) in the bursts' claims.
const CHIPS: &str = r#"device.attributes["neuron.aws.com"].resourceType == "neuron_device""#;

#[derive(Debug, Clone)]
pub struct NeuronBenchOptions {
    pub steady: Duration,
    pub bursts: Vec<usize>,
    pub burst_rounds: usize,
    pub kubernetes_version: KubernetesVersion,
    /// Where `neuron-driver` (release build) is.
    pub bin_dir: PathBuf,
    /// The reference driver's binary ([`refdriver::build`]).
    pub refdriver: PathBuf,
}

/// One mode's figures.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NeuronRun {
    /// `NEURON_PARTITIONS`: `cores` or `chips`.
    pub partitions: String,
    /// Devices in the pool once complete.
    pub devices: usize,
    pub idle_cost: Option<IdleCost>,
    /// The Go reference publishing the same devices, same window. Reports
    /// before this field: absent.
    #[serde(default)]
    pub reference_idle_cost: Option<IdleCost>,
    pub bursts: Vec<Burst>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NeuronBenchReport {
    pub kubernetes_version: String,
    pub steady_secs: u64,
    pub runs: Vec<NeuronRun>,
}

impl NeuronBenchReport {
    pub fn table(&self) -> Vec<String> {
        let mut out = vec![format!(
            "Kubernetes {}, node {NODE} ({INSTANCE_TYPE}), neuron-driver (release), idle window {} s",
            self.kubernetes_version, self.steady_secs
        )];
        for run in &self.runs {
            let idle = run.idle_cost.map_or("-".to_string(), |c| c.summary());
            let reference = run
                .reference_idle_cost
                .map_or("-".to_string(), |c| c.summary());
            out.push(format!(
                "partitions {:<5} ({} devices): at rest {idle}; Go reference, same devices: {reference}",
                run.partitions, run.devices
            ));
            let mut sizes: Vec<usize> = run.bursts.iter().map(|b| b.pods).collect();
            sizes.dedup();
            for pods in sizes {
                let of = |f: fn(&Burst) -> Vec<f64>| {
                    Stats::of(
                        &run.bursts
                            .iter()
                            .filter(|b| b.pods == pods)
                            .flat_map(f)
                            .collect::<Vec<_>>(),
                    )
                };
                let calls = of(|b| b.prepare_call_ms.clone());
                let span = of(|b| vec![b.prepare_span_ms]);
                let running = of(|b| vec![b.created_to_last_running_ms]);
                out.push(format!(
                    "  burst N={pods}: prepare call p50 {:.1} ms, max {:.1} ms; first call -> last answer p50 {:.1} ms; created -> last Running p50 {:.0} ms",
                    calls.p50, calls.max, span.p50, running.p50
                ));
            }
        }
        out
    }
}

pub async fn run(options: &NeuronBenchOptions) -> Result<NeuronBenchReport> {
    let mut runs = Vec::new();
    for partitions in ["cores", "chips"] {
        let testbed = LocalTestbed::start(LocalOptions {
            nodes: vec![(NODE.into(), INSTANCE_TYPE.into(), vec![DriverKind::Neuron])],
            bin_dir: Some(options.bin_dir.clone()),
            kubernetes_version: options.kubernetes_version.clone(),
            rescan_interval: Some(dra_core::DEFAULT_RESCAN_INTERVAL),
            driver_env: vec![("NEURON_PARTITIONS".into(), partitions.into())],
            ..LocalOptions::default()
        })
        .await?;
        let result = run_mode(&testbed, options, partitions).await;
        let teardown = testbed.shutdown();
        if !teardown.is_clean() {
            eprintln!("bench neuron: teardown left {teardown:?}");
        }
        runs.push(result?);
    }
    Ok(NeuronBenchReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        steady_secs: options.steady.as_secs(),
        runs,
    })
}

async fn run_mode(
    testbed: &LocalTestbed,
    options: &NeuronBenchOptions,
    partitions: &str,
) -> Result<NeuronRun> {
    let client = testbed.client();
    let kind = DriverKind::Neuron;
    rounds::create_namespace(&client).await?;
    // The testbed is up once the pool is complete; what it holds in this mode.
    let devices = e2e::scenarios::kit::slices(testbed, NODE, kind)
        .await
        .map_err(|e| Error::Testbed(format!("reading the Neuron slices: {e:#}")))?
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let pid = testbed
        .driver_pid(NODE, kind)
        .ok_or_else(|| Error::Testbed("neuron-driver has no pid".into()))?;
    let reference = start_reference(testbed, options, partitions, devices).await?;
    eprintln!(
        "bench neuron: partitions {partitions}: {devices} devices, published by both drivers; idle for {} s",
        options.steady.as_secs()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let meters = [
        IdleMeter::start(pid, "neuron"),
        IdleMeter::start(reference.pid(), "ref"),
    ];
    tokio::time::sleep(options.steady).await;
    let [idle_cost, reference_idle_cost] = [meters[0].cost(), meters[1].cost()];
    drop(meters);
    let node_dir = testbed
        .local_node(NODE)
        .await
        .ok_or_else(|| Error::Testbed(format!("no local node {NODE}")))?
        .run_dir;
    let kubelet_log = node_dir.join("kubelet.log");
    let target = burst::Target {
        node: NODE,
        kubelet_log: &kubelet_log,
        driver: kind.driver_name(),
        class: kind.driver_name(),
        short: "neuron",
        selector: Some(CHIPS),
        pid: None,
    };
    let mut bursts = Vec::new();
    for &pods in &options.bursts {
        for i in 0..options.burst_rounds {
            let b = burst::run_burst(&client, &target, pods, i).await?;
            let st = b.prepare_stats();
            eprintln!(
                "bench neuron: partitions {partitions} burst {pods} #{} prepare p50 {:.2} ms max {:.2} ms span {:.1} ms; created -> last Running {:.0} ms",
                i + 1,
                st.p50,
                st.max,
                b.prepare_span_ms,
                b.created_to_last_running_ms
            );
            bursts.push(b);
        }
    }
    Ok(NeuronRun {
        partitions: partitions.into(),
        devices,
        idle_cost,
        reference_idle_cost,
        bursts,
    })
}

/// Starts the Go reference on the node with the devices `neuron-driver
/// discover` lists in this mode, and waits for its pool.
async fn start_reference(
    testbed: &LocalTestbed,
    options: &NeuronBenchOptions,
    partitions: &str,
    devices: usize,
) -> Result<local_cluster::HostProcess> {
    let client = testbed.client();
    refdriver::install(&client).await?;
    let node = testbed
        .nodes()
        .into_iter()
        .find(|n| n.name == NODE)
        .ok_or_else(|| Error::Testbed(format!("no node {NODE}")))?;
    let (slices, listed) = refdriver::discover_devices(
        &options.bin_dir.join(DriverKind::Neuron.binary()),
        &[("NEURON_PARTITIONS", partitions)],
        &node.fixture.sys,
        &node.fixture.dev,
        NODE,
        &testbed
            .run_dir()
            .join(format!("refdriver-slices-{partitions}.json")),
    )?;
    if listed != devices {
        return Err(Error::Testbed(format!(
            "neuron-driver discover listed {listed} devices, the driver published {devices}"
        )));
    }
    let kubeconfig = testbed
        .bound_token_kubeconfig_as(
            NODE,
            e2e::charts::NAMESPACE,
            refdriver::SERVICE_ACCOUNT,
            refdriver::BINARY,
        )
        .await?;
    let mut timer = pool_timer::PoolTimer::start(&client, refdriver::DRIVER_NAME).await?;
    let command = refdriver::command(
        &options.refdriver,
        &slices,
        &node.fixture.sys,
        &node.fixture.dev,
        &kubeconfig,
    );
    let t = Instant::now();
    let process = testbed
        .spawn_on_node(NODE, refdriver::BINARY, command)
        .await?;
    timer.wait(1, devices, t, super::START_TIMEOUT).await?;
    Ok(process)
}
