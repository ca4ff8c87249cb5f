//! `cargo xtask bench slowloris`: what slow connections to the ops port
//! cost the driver's memory, kubelet's probes and prepare.
//!
//! The driver, the cluster and the bursts are those of
//! [`super::probes`]: one `efa-driver` (release build) on node p5, bursts
//! of [`SlowlorisOptions::claims`] `NodePrepareResources` calls at once
//! over its DRA socket as kubelet makes them, each timed. Two conditions,
//! each a window of [`SlowlorisOptions::bursts`] bursts, over rounds in an
//! order that rotates with the round:
//! - `quiet`: nothing else;
//! - `slowloris`: [`SlowlorisOptions::rate`] new TCP connections a second
//!   to the driver's ops port, each sending one byte of a request head and
//!   then holding until the server closes it (the client keeps at most
//!   [`MAX_HELD`] open, its own file limit). The attack runs for
//!   [`SlowlorisOptions::settle`] before the first burst, so that the
//!   bursts meet the steady state (the old server's 10 s header timeout
//!   included);
//! - `sink`: the same attack against a listener of the bench's own
//!   (`Sink`) that holds the newest [`SINK_HOLDS`] connections and closes
//!   the oldest, as the driver's server does at its cap, without the
//!   driver. On a 2-core machine the attacking client and the kernel's
//!   connection handling take CPU from everything, the driver and the API
//!   server included; `slowloris / sink` is what the driver's own handling
//!   of the attack adds to that.
//!
//! In both, a prober asks `/healthz` every [`PROBE_EVERY`] on a new
//! connection, as kubelet's liveness probe does (failed: no answer within
//! [`PROBE_TIMEOUT`]), and the driver's RSS and open file descriptors are
//! sampled every [`SAMPLE_EVERY`]; the window's peak of each is reported.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dra_core::testing::dra_v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::idle::CostSample;
use super::measure::proc_memory_kib;
use super::probe_storm::get_status;
use super::probes::{BETWEEN_BURSTS, BurstSetup, DraSocket, load_average, on_p5};
pub use super::slowloris_report::{
    AttackFigures, Condition, SlowlorisOptions, SlowlorisReport, Window,
};
use e2e::local::LocalTestbed;
use e2e::testbed::{DriverKind, ManagedTestbed};
use local_cluster::error::{Error, Result};

/// The most connections the attacking client holds open at once.
pub const MAX_HELD: i64 = 15_000;
/// How often the prober asks `/healthz`.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);
/// A probe without an answer in this long failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the driver's RSS and descriptors are read.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Connections the bench's `Sink` holds (the driver's server's cap).
pub const SINK_HOLDS: usize = 256;
/// How often the attack's pacer wakes up.
const TICK: Duration = Duration::from_millis(10);

/// Runs the bench on a fresh local cluster (root and the cluster's built
/// components, like the end-to-end suite).
pub async fn run(options: &SlowlorisOptions) -> Result<SlowlorisReport> {
    // The attack's own runtime, so that its thousands of tasks do not
    // queue the bench's timing tasks.
    on_p5(
        &options.bin_dir,
        &options.kubernetes_version,
        "slowloris",
        "slowloris",
        async |testbed, attack_runtime| run_on(testbed, options, attack_runtime).await,
    )
    .await
}

async fn run_on(
    testbed: &LocalTestbed,
    options: &SlowlorisOptions,
    attack_runtime: &tokio::runtime::Handle,
) -> Result<SlowlorisReport> {
    let BurstSetup {
        pid,
        ops,
        claims,
        dra,
    } = BurstSetup::start(testbed, options.claims, "slowloris").await?;
    let binary = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();

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
                attack_runtime,
            )
            .await?;
            eprintln!("bench slowloris: {}", w.summary());
            windows.push(w);
        }
    }
    Ok(SlowlorisReport::new(
        options,
        DriverKind::Efa.driver_name(),
        &binary,
        windows,
        proc_memory_kib(pid).map(|(_, hwm)| hwm),
        testbed.run_dir(),
    ))
}

#[allow(clippy::too_many_arguments)]
async fn run_window(
    dra: &DraSocket,
    claims: &[dra_v1::Claim],
    condition: Condition,
    round: usize,
    pid: i32,
    ops: SocketAddr,
    options: &SlowlorisOptions,
    attack_runtime: &tokio::runtime::Handle,
) -> Result<Window> {
    let before = CostSample::take(pid);
    let sampler = Sampler::start(pid);
    let prober = Prober::start(ops);
    let sink = match condition {
        Condition::Sink => Some(Sink::start(attack_runtime).await?),
        _ => None,
    };
    let target = match condition {
        Condition::Quiet => None,
        Condition::Slowloris => Some(ops),
        Condition::Sink => sink.as_ref().map(|s| s.address),
    };
    let attack = target.map(|target| Attack::start(attack_runtime, target, options.rate));
    if attack.is_some() {
        tokio::time::sleep(options.settle).await;
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
    let attack = match attack {
        Some(a) => Some(a.stop().await),
        None => None,
    };
    if let Some(sink) = sink {
        sink.task.abort();
    }
    let driver_cpu_ms_per_s = match (before, after) {
        (Some(b), Some(a)) => b.until(&a).cpu_ms_per_min / 60.0,
        _ => f64::NAN,
    };
    let (probes_ok, probes_failed, probe_ms) = prober.stop().await;
    let (peak_rss_kib, peak_fds) = sampler.stop().await;
    Ok(Window {
        round,
        condition,
        prepare_ms,
        spans_ms,
        peak_rss_kib,
        peak_fds,
        driver_cpu_ms_per_s,
        probes_ok,
        probes_failed,
        probe_ms,
        load_1m: load_average().unwrap_or(f64::NAN),
        attack,
    })
}

/// A listener that holds the newest [`SINK_HOLDS`] connections, closing
/// the oldest when a new one comes (see the module doc).
struct Sink {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    async fn start(runtime: &tokio::runtime::Handle) -> Result<Sink> {
        let listener = runtime
            .spawn(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .await
            .map_err(|e| Error::Testbed(format!("binding the sink: {e}")))?
            .map_err(|e| Error::Testbed(format!("binding the sink: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| Error::Testbed(format!("the sink's address: {e}")))?;
        let task = runtime.spawn(async move {
            let mut held = std::collections::VecDeque::with_capacity(SINK_HOLDS);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                if held.len() >= SINK_HOLDS {
                    held.pop_front();
                }
                held.push_back(stream);
            }
        });
        Ok(Sink { address, task })
    }
}

/// The driver's peak RSS and open descriptors while it runs.
struct Sampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl Sampler {
    fn start(pid: i32) -> Sampler {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let (mut rss, mut fds) = (0, 0);
            loop {
                if let Some((now, _)) = proc_memory_kib(pid) {
                    rss = rss.max(now);
                }
                if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                    fds = fds.max(dir.count() as u64);
                }
                tokio::select! {
                    () = tokio::time::sleep(SAMPLE_EVERY) => {}
                    _ = stopped.changed() => return (rss, fds),
                }
            }
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> (u64, u64) {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// `/healthz` every [`PROBE_EVERY`] on a new connection: answered 200 in
/// time, or failed; each answer's time.
struct Prober {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<(u64, u64, Vec<f64>)>,
}

impl Prober {
    fn start(ops: SocketAddr) -> Prober {
        let (stop, mut stopped) = watch::channel(false);
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {ops}\r\nConnection: close\r\n\r\n");
        let task = tokio::spawn(async move {
            let (mut ok, mut failed, mut times) = (0, 0, Vec::new());
            loop {
                let t = Instant::now();
                let status =
                    tokio::time::timeout(PROBE_TIMEOUT, get_status(ops, request.as_bytes())).await;
                if let Ok(Some(200)) = status {
                    ok += 1;
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                } else {
                    failed += 1;
                }
                tokio::select! {
                    () = tokio::time::sleep(PROBE_EVERY.saturating_sub(t.elapsed())) => {}
                    _ = stopped.changed() => return (ok, failed, times),
                }
            }
        });
        Prober { stop, task }
    }

    async fn stop(self) -> (u64, u64, Vec<f64>) {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

#[derive(Default)]
struct AttackCounters {
    opened: AtomicU64,
    connect_failed: AtomicU64,
    closed_by_server: AtomicU64,
    skipped: AtomicU64,
    held: AtomicI64,
    peak_held: AtomicI64,
}

/// Slow connections at a fixed rate (see the module doc).
pub struct Attack {
    stop: watch::Sender<bool>,
    pacer: tokio::task::JoinHandle<f64>,
    counters: Arc<AttackCounters>,
    rate: f64,
}

impl Attack {
    /// Starts `rate` slow connections a second to `address`, on `runtime`.
    pub fn start(runtime: &tokio::runtime::Handle, address: SocketAddr, rate: f64) -> Attack {
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(AttackCounters::default());
        let pacer = {
            let counters = counters.clone();
            let mut pacer_stopped = stopped.clone();
            runtime.spawn(async move {
                let start = Instant::now();
                let mut sent: u64 = 0;
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = ticks.tick() => {}
                        _ = pacer_stopped.changed() => break,
                    }
                    let owed = (start.elapsed().as_secs_f64() * rate) as u64;
                    while sent < owed {
                        sent += 1;
                        if counters.held.load(Ordering::Relaxed) >= MAX_HELD {
                            counters.skipped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        tokio::spawn(hold(address, counters.clone(), stopped.clone()));
                    }
                }
                start.elapsed().as_secs_f64()
            })
        };
        Attack {
            stop,
            pacer,
            counters,
            rate,
        }
    }

    /// Stops the attack, closes what it holds, and gives its figures.
    pub async fn stop(self) -> AttackFigures {
        let _ = self.stop.send(true);
        let window_s = self.pacer.await.unwrap_or_default();
        let t = Instant::now();
        while self.counters.held.load(Ordering::Relaxed) > 0
            && t.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let c = &self.counters;
        let opened = c.opened.load(Ordering::Relaxed);
        AttackFigures {
            target_per_s: self.rate,
            opened_per_s: if window_s > 0.0 {
                opened as f64 / window_s
            } else {
                0.0
            },
            window_s,
            opened,
            connect_failed: c.connect_failed.load(Ordering::Relaxed),
            closed_by_server: c.closed_by_server.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
            peak_held: c.peak_held.load(Ordering::Relaxed).max(0) as u64,
        }
    }
}

/// One slow connection: connect, one byte, hold until the server closes
/// it or the attack stops (then reset, leaving no TIME_WAIT behind).
async fn hold(address: SocketAddr, c: Arc<AttackCounters>, mut stopped: watch::Receiver<bool>) {
    let held = c.held.fetch_add(1, Ordering::Relaxed) + 1;
    c.peak_held.fetch_max(held, Ordering::Relaxed);
    let connected = tokio::select! {
        s = TcpStream::connect(address) => s.ok(),
        _ = stopped.changed() => None,
    };
    match connected {
        None => {
            c.connect_failed.fetch_add(1, Ordering::Relaxed);
        }
        Some(mut s) => {
            c.opened.fetch_add(1, Ordering::Relaxed);
            let _ = s.write_all(b"G").await;
            let mut buf = [0u8; 512];
            loop {
                tokio::select! {
                    read = s.read(&mut buf) => match read {
                        Ok(0) | Err(_) => {
                            c.closed_by_server.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(_) => {}
                    },
                    _ = stopped.changed() => {
                        #[allow(deprecated)]
                        let _ = s.set_linger(Some(Duration::ZERO));
                        break;
                    }
                }
            }
        }
    }
    c.held.fetch_sub(1, Ordering::Relaxed);
}
