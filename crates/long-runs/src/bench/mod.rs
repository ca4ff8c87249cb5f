//! `cargo xtask bench`: our EFA driver and a reference Go driver side by side
//! on one node of the local cluster, and a fleet of simulated nodes'
//! publishers against one API server ([`fleet`]). Figures are reported,
//! never asserted (docs/performance.md).
//!
//! The driver benchmark, on node `p5` (p5.48xlarge fixture):
//! - both drivers start cold (no slices of theirs in the API); start →
//!   complete pool is timed with a watch ([`pool_timer`]);
//! - idle RSS once both pools are in; API requests of each driver's identity
//!   over a steady window, from the API server's audit log;
//! - rounds alternate between the drivers (the order flips every round, so
//!   machine noise hits both alike): one pod with one one-device claim of the
//!   driver's class ([`rounds`]); kubelet's own DRA gRPC histogram gives the
//!   exact duration of each prepare and unprepare call; the pod watch gives
//!   scheduled → running; the audit log gives the API server's time for
//!   each claim GET the prepares made; each driver's own timing line splits
//!   kubelet's prepare figure ([`breakdown`]);
//! - CPU time and wake-ups (voluntary context switches of all threads) of
//!   each driver process over the steady window, per minute;
//! - RSS and peak RSS (`VmHWM`) after the rounds, binary sizes.
//!
//! [`probes`]: what a storm of health probes costs prepare, against the
//! same storm on a path that does nothing.
//!
//! [`slowloris`]: what thousands of slow connections to the ops port cost
//! the driver's memory, kubelet's probes and prepare.

pub mod breakdown;
pub mod burst;
pub mod fleet;
mod fleet_report;
pub mod idle;
pub mod measure;
pub mod neuron;
pub mod pool_timer;
pub mod probe_storm;
pub mod probes;
mod probes_report;
pub mod process_cpu;
pub mod refdriver;
mod report;
pub mod rounds;
pub mod scheduler;
pub mod slowloris;
mod slowloris_report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use e2e::local::LocalTestbed;
use e2e::testbed::{DriverKind, LocalOptions, ManagedTestbed, Testbed};
use idle::{IdleCost, IdleMeter};
use local_cluster::error::{Error, Result};
use local_cluster::versions::KubernetesVersion;
use measure::{
    Stats, claim_get_server_ms, count_requests, parse_audit_log, proc_memory_kib, unix_now,
};
pub use report::{BenchReport, DriverFigures};

/// The node both drivers run on.
pub const NODE: &str = "p5";
const INSTANCE_TYPE: &str = "p5.48xlarge";
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(90);

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Rounds per driver.
    pub rounds: usize,
    /// The steady-state window in which API requests are counted.
    pub steady: Duration,
    pub kubernetes_version: KubernetesVersion,
    /// Where `efa-driver` (release build) is.
    pub bin_dir: PathBuf,
    /// The reference driver's binary ([`refdriver::build`]).
    pub refdriver: PathBuf,
    /// Burst sizes ([`burst`]), run after the single-pod rounds.
    pub bursts: Vec<usize>,
    /// Bursts of each size per driver.
    pub burst_rounds: usize,
    /// Bursts of each size per driver run before those, and not counted:
    /// the first burst after a quiet spell is slow for whichever driver
    /// runs it (docs/performance.md), and the order gave it to ours.
    pub warm_up_bursts: usize,
}

/// The pieces of one driver under test.
struct Subject {
    label: &'static str,
    driver: &'static str,
    class: &'static str,
    short: &'static str,
    binary: PathBuf,
    user: String,
    pid: i32,
    start: Duration,
    /// The driver's log and the marker of its per-prepare timing line
    /// ([`breakdown`]).
    log: PathBuf,
    timing_marker: &'static str,
}

/// Runs the driver benchmark on a fresh local cluster (needs root and the
/// built components, like the end-to-end suite).
pub async fn run(options: &BenchOptions) -> Result<BenchReport> {
    let testbed = LocalTestbed::start(LocalOptions {
        nodes: vec![(NODE.into(), INSTANCE_TYPE.into(), vec![DriverKind::Efa])],
        bin_dir: Some(options.bin_dir.clone()),
        kubernetes_version: options.kubernetes_version.clone(),
        audit_log: true,
        // The driver's own default, not the testbeds' 1 s: the idle
        // figures must be what a node pays.
        rescan_interval: Some(dra_core::DEFAULT_RESCAN_INTERVAL),
        ..LocalOptions::default()
    })
    .await?;
    let result = run_on(&testbed, options).await;
    let teardown = testbed.shutdown();
    if !teardown.is_clean() {
        eprintln!("bench: teardown left {teardown:?}");
    }
    result
}

async fn run_on(testbed: &LocalTestbed, options: &BenchOptions) -> Result<BenchReport> {
    let client = testbed.client();
    let run_dir = testbed.run_dir().to_path_buf();
    rounds::create_namespace(&client).await?;
    refdriver::install(&client).await?;
    let node = testbed
        .nodes()
        .into_iter()
        .find(|n| n.name == NODE)
        .ok_or_else(|| Error::Testbed(format!("no node {NODE}")))?;
    let efa = DriverKind::Efa;
    // Where the node's processes log (`<name>.log`), as the cluster names them.
    let node_dir = testbed
        .local_node(NODE)
        .await
        .ok_or_else(|| Error::Testbed(format!("no local node {NODE}")))?
        .run_dir;
    let expected = efa.expected_devices(&node.fixture);
    let efa_binary = options.bin_dir.join(efa.binary());
    let (slices_file, ref_devices) = refdriver::discover_devices(
        &efa_binary,
        &[],
        &node.fixture.sys,
        &node.fixture.dev,
        NODE,
        &run_dir.join("refdriver-slices.json"),
    )?;
    if ref_devices != expected {
        return Err(Error::Testbed(format!(
            "efa-driver discover listed {ref_devices} devices, the fixture has {expected}"
        )));
    }

    // Ours, cold: stopped, its slices deleted, started under a watch.
    testbed.stop_driver(NODE, efa).await?;
    delete_slices(&client, efa.driver_name()).await?;
    let mut timer = pool_timer::PoolTimer::start(&client, efa.driver_name()).await?;
    let t = Instant::now();
    // Together: the timer must see each event as it arrives, not after
    // start_driver's own (coarser) wait returns.
    let (started, ours_start) = tokio::join!(
        testbed.start_driver(NODE, efa),
        timer.wait(1, expected, t, START_TIMEOUT)
    );
    started?;
    let ours_start = ours_start?;
    let (ns_name, sa) = efa.service_account();
    let ours = Subject {
        label: "ours",
        driver: efa.driver_name(),
        class: efa.driver_name(),
        short: "ours",
        binary: efa_binary.clone(),
        user: format!("system:serviceaccount:{ns_name}:{sa}"),
        pid: testbed
            .driver_pid(NODE, efa)
            .ok_or_else(|| Error::Testbed("efa-driver has no pid".into()))?,
        start: ours_start,
        log: node_dir.join(format!("{}.log", efa.binary())),
        timing_marker: "prepare call timings",
    };

    // The reference driver, cold, the same way.
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
        &slices_file,
        &node.fixture.sys,
        &node.fixture.dev,
        &kubeconfig,
    );
    let t = Instant::now();
    let process = testbed
        .spawn_on_node(NODE, refdriver::BINARY, command)
        .await?;
    let ref_start = timer.wait(1, expected, t, START_TIMEOUT).await?;
    let reference = Subject {
        label: "Go reference",
        driver: refdriver::DRIVER_NAME,
        class: refdriver::DRIVER_NAME,
        short: "ref",
        binary: options.refdriver.clone(),
        user: format!(
            "system:serviceaccount:{}:{}",
            e2e::charts::NAMESPACE,
            refdriver::SERVICE_ACCOUNT
        ),
        pid: process.pid(),
        start: ref_start,
        log: node_dir.join(format!("{}.log", refdriver::BINARY)),
        timing_marker: "\"prepare timings\"",
    };
    eprintln!(
        "bench: pools complete (ours {} ms, reference {} ms); idle for 2 s",
        ours_start.as_millis(),
        ref_start.as_millis()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle: Vec<(u64, u64)> = [&ours, &reference]
        .iter()
        .map(|s| proc_memory_kib(s.pid).unwrap_or_default())
        .collect();

    eprintln!(
        "bench: steady window of {} s (API requests per driver)",
        options.steady.as_secs()
    );
    let from = unix_now();
    let meters: Vec<IdleMeter> = [&ours, &reference]
        .iter()
        .map(|s| IdleMeter::start(s.pid, s.short))
        .collect();
    tokio::time::sleep(options.steady).await;
    let to = unix_now();
    let idle_cost: Vec<Option<IdleCost>> = meters.iter().map(IdleMeter::cost).collect();
    drop(meters);
    // The audit log is written in batches of at most a second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = read_audit(&run_dir)?;
    let steady: Vec<_> = [&ours, &reference]
        .iter()
        .map(|s| count_requests(&audit, |u| u == s.user, from, to))
        .collect();

    let rounds_from = unix_now();
    let mut all_rounds = Vec::new();
    for i in 0..options.rounds {
        let order = if i % 2 == 0 {
            [&ours, &reference]
        } else {
            [&reference, &ours]
        };
        for s in order {
            let r = rounds::run_round(&client, NODE, s.driver, s.class, s.short, i).await?;
            eprintln!(
                "bench: round {:>3} {:<12} prepare {:>7.2} ms ({} call) unprepare {:>7.2} ms ({} call) scheduled->running {:>6.0} ms",
                i + 1,
                s.label,
                r.prepare_s * 1e3,
                r.prepare_calls,
                r.unprepare_s * 1e3,
                r.unprepare_calls,
                r.scheduled_to_running_s * 1e3
            );
            all_rounds.push(r);
        }
    }
    let after: Vec<(u64, u64)> = [&ours, &reference]
        .iter()
        .map(|s| proc_memory_kib(s.pid).unwrap_or_default())
        .collect();
    // The rounds' claim GETs are read from the audit log after the bursts.
    let rounds_to = unix_now();
    // The drivers' timing lines pair with the single-pod rounds' calls
    // only: split them before the bursts add lines of their own.
    let breakdowns: Vec<Option<breakdown::Breakdown>> = [&ours, &reference]
        .iter()
        .map(|s| {
            let mine: Vec<&rounds::Round> =
                all_rounds.iter().filter(|r| r.driver == s.driver).collect();
            prepare_breakdown(s, &mine)
        })
        .collect();
    let kubelet_log = node_dir.join("kubelet.log");
    let mut bursts = Vec::new();
    for &pods in &options.bursts {
        // Warm-ups only before bursts that are counted.
        let warm_up = if options.burst_rounds == 0 {
            0
        } else {
            options.warm_up_bursts
        };
        for i in 0..warm_up + options.burst_rounds {
            // Each pair alternates who goes first; the measured ones start
            // with ours.
            let order = if (i + warm_up).is_multiple_of(2) {
                [&ours, &reference]
            } else {
                [&reference, &ours]
            };
            for s in order {
                let target = burst::Target {
                    node: NODE,
                    kubelet_log: &kubelet_log,
                    driver: s.driver,
                    class: s.class,
                    short: s.short,
                    selector: None,
                    pid: Some(s.pid),
                };
                // Warm-up bursts take the indexes after the measured ones
                // (the objects' names carry the index).
                let (index, name) = if i < warm_up {
                    (options.burst_rounds + i, format!("warm-up {}", i + 1))
                } else {
                    (i - warm_up, format!("#{}", i - warm_up + 1))
                };
                let b = burst::run_burst(&client, &target, pods, index).await?;
                let st = b.prepare_stats();
                eprintln!(
                    "bench: burst {pods:>2} {name} {:<12} prepare calls {} p50 {:>7.2} ms max {:>7.2} ms span {:>7.1} ms; created -> last Running {:>6.0} ms (node CPUs {} busy, driver {} ms CPU); unprepare span {:>7.1} ms",
                    s.label,
                    st.n,
                    st.p50,
                    st.max,
                    b.prepare_span_ms,
                    b.created_to_last_running_ms,
                    b.node_busy_ms.map_or("?".into(), |ms| format!(
                        "{:.0}%",
                        100.0 * ms / (b.created_to_last_running_ms * b.node_cpus.max(1) as f64)
                    )),
                    b.driver_cpu_ms.map_or("?".into(), |ms| format!("{ms:.0}")),
                    b.unprepare_span_ms
                );
                if i >= warm_up {
                    bursts.push(b);
                }
            }
        }
    }
    // The claim GETs of the rounds and of each burst as the API server timed
    // them (its audit log is written a moment after each request ends): the
    // part of a prepare no driver can make faster by its own code.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audit = read_audit(&run_dir)?;
    let claim_gets: Vec<Stats> = [&ours, &reference]
        .iter()
        .map(|s| claim_get_server_ms(&audit, &s.user, rounds_from, rounds_to))
        .collect();
    for b in &mut bursts {
        let user = [&ours, &reference]
            .into_iter()
            .find(|s| s.driver == b.driver)
            .map(|s| s.user.as_str());
        if let (Some(user), Some(from)) = (user, b.created_unix) {
            let to = from + b.created_to_last_running_ms / 1e3;
            b.claim_get_server_ms = measure::claim_gets_server_ms(&audit, user, from, to);
        }
    }
    let figures = |i: usize, s: &Subject| {
        let mine: Vec<&rounds::Round> =
            all_rounds.iter().filter(|r| r.driver == s.driver).collect();
        // Only single-call rounds give a per-call duration.
        let per_call = |calls: fn(&rounds::Round) -> (u64, f64)| {
            Stats::of(
                &mine
                    .iter()
                    .map(|r| calls(r))
                    .filter(|(n, _)| *n == 1)
                    .map(|(_, s)| s * 1e3)
                    .collect::<Vec<_>>(),
            )
        };
        DriverFigures {
            label: s.label.to_string(),
            driver: s.driver.to_string(),
            binary_bytes: file_size(&s.binary),
            start_to_pool_ms: s.start.as_secs_f64() * 1e3,
            prepare_ms: per_call(|r| (r.prepare_calls, r.prepare_s)),
            unprepare_ms: per_call(|r| (r.unprepare_calls, r.unprepare_s)),
            rounds_with_retries: mine
                .iter()
                .filter(|r| r.prepare_calls != 1 || r.unprepare_calls != 1)
                .count(),
            scheduled_to_running_ms: Stats::of(
                &mine
                    .iter()
                    .map(|r| r.scheduled_to_running_s * 1e3)
                    .collect::<Vec<_>>(),
            ),
            rss_idle_kib: idle[i].0,
            rss_after_kib: after[i].0,
            rss_peak_kib: after[i].1,
            steady_requests: steady[i].clone(),
            idle_cost: idle_cost[i],
            claim_get_server_ms: claim_gets[i],
            breakdown: breakdowns[i].clone(),
        }
    };
    Ok(BenchReport {
        kubernetes_version: options.kubernetes_version.to_string(),
        node: NODE.into(),
        instance_type: INSTANCE_TYPE.into(),
        rounds: options.rounds,
        steady_secs: options.steady.as_secs(),
        finished_unix: unix_now(),
        ours: figures(0, &ours),
        reference: figures(1, &reference),
        rounds_detail: all_rounds,
        bursts,
        run_dir: run_dir.display().to_string(),
    })
}

/// The driver's prepares split with its own timing lines; `None` when a
/// round retried a call (calls and lines no longer pair) or the log lacks
/// the lines (ours logs them at debug level only).
fn prepare_breakdown(s: &Subject, rounds: &[&rounds::Round]) -> Option<breakdown::Breakdown> {
    if rounds.iter().any(|r| r.prepare_calls != 1) {
        return None;
    }
    let log = std::fs::read_to_string(&s.log).ok()?;
    let kubelet: Vec<f64> = rounds.iter().map(|r| r.prepare_s).collect();
    breakdown::split(&kubelet, &breakdown::timing_lines(&log, s.timing_marker))
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The audit log of the run so far.
pub(crate) fn read_audit(run_dir: &Path) -> Result<Vec<measure::AuditRequest>> {
    let path = run_dir.join("audit.log");
    let text =
        std::fs::read_to_string(&path).map_err(local_cluster::error::io("reading", &path))?;
    Ok(parse_audit_log(&text))
}

/// Deletes every slice of `driver` (admin), so that the next start is cold.
async fn delete_slices(client: &kube::Client, driver: &str) -> Result<()> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields(&format!("spec.driver={driver}")),
    )
    .await
    .map_err(|source| Error::Kube {
        action: format!("deleting the slices of {driver}"),
        source,
    })?;
    Ok(())
}
