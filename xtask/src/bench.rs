//! `cargo xtask bench`: performance figures on the local cluster, reported
//! and written as JSON for the history, never asserted (docs/performance.md).
//!
//! - `cargo xtask bench [--rounds N] [--steady-secs S] [--bursts 8,16,32]`: our EFA driver
//!   (release build, as the image ships it) against the reference Go driver
//!   of `e2e/go/refdriver`, side by side on node p5, alternating rounds
//!   (`long_runs::bench`). Writes `<work-dir>/bench-<version>.json`.
//! - `cargo xtask bench fleet [--nodes 50,200,500]`: simulated nodes'
//!   publishers against one API server (`long_runs::bench::fleet`). Writes
//!   `<work-dir>/bench-fleet-<version>.json`.
//! - `cargo xtask bench scheduler [--nodes 100,500,1000]`: our slices on shadow nodes against
//!   the real kube-scheduler (`long_runs::bench::scheduler`, `crate::bench_scheduler`).
//!   Writes `<work-dir>/bench-scheduler-<version>.json`.
//! - `cargo xtask bench neuron [--steady-secs 180] [--bursts 16]`: the
//!   Neuron driver alone on trn2, NeuronCore partitions on and off
//!   (`long_runs::bench::neuron`). Writes `<work-dir>/bench-neuron-<version>.json`.
//! - `cargo xtask bench probes [--rounds 5] [--rate 800]`: prepare bursts of 16 claims over the
//!   EFA driver's DRA socket with no storm, a storm to `/healthz` + `/readyz`, and the same storm
//!   to a path that does nothing (`long_runs::bench::probes`). Writes
//!   `<work-dir>/bench-probes-<version>.json`.
//! - `cargo xtask bench slowloris [--rounds 3] [--rate 1000] [--driver-dir DIR]`: prepare bursts
//!   over the EFA driver's DRA socket: quiet, while a client opens slow connections (one
//!   byte, then held) to its ops port, and the same attack on a listener of the bench's own;
//!   the driver's peak RSS, fds and CPU, `/healthz` answers (`long_runs::bench::slowloris`). Writes `<work-dir>/bench-slowloris-<version>.json`.
//!
//! All start a local cluster: run them under `flock /tmp/aws-dra-e2e.lock`
//! on a shared machine, as the end-to-end suite.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    drivers: DriverArgs,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Simulated nodes' slice publishers against one API server.
    Fleet(FleetArgs),
    /// The Neuron driver on trn2, with NeuronCore partitions and without:
    /// idle cost and bursts of single-chip pods.
    Neuron(NeuronArgs),
    /// Shadow nodes with our slices against the real kube-scheduler:
    /// pods/s, scheduling latency, control-plane cost, a CPU profile.
    Scheduler(crate::bench_scheduler::SchedulerArgs),
    /// Prepare bursts under a storm of health probes, against the same
    /// storm on a path that does nothing, and without a storm.
    Probes(ProbesArgs),
    /// Prepare bursts and /healthz probes while a client holds slow
    /// connections to the ops port, quiet, and with the same attack on
    /// a listener of the bench's own.
    Slowloris(SlowlorisArgs),
}

#[derive(clap::Args)]
struct SlowlorisArgs {
    /// Rounds; each runs the three conditions once, in a rotating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Bursts per condition per round.
    #[arg(long, default_value_t = 3)]
    bursts: usize,
    /// Claims per burst (one NodePrepareResources call each, all at once).
    #[arg(long, default_value_t = 16)]
    claims: usize,
    /// New slow connections per second (each sends one byte and holds).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Seconds the attack runs before the first burst of its window (above
    /// the old 10 s header timeout, so that the bursts meet its steady state).
    #[arg(long, default_value_t = 11)]
    settle_secs: u64,
    /// Run the `efa-driver` of this directory instead of the release build
    /// (e.g. one built at an earlier commit, for a before/after figure).
    #[arg(long)]
    driver_dir: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct ProbesArgs {
    /// Rounds; each runs the three conditions once, in a rotating order.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Bursts per condition per round.
    #[arg(long, default_value_t = 3)]
    bursts: usize,
    /// Claims per burst (one NodePrepareResources call each, all at once).
    #[arg(long, default_value_t = 16)]
    claims: usize,
    /// Storm requests per second (each on a new connection).
    #[arg(long, default_value_t = 800.0)]
    rate: f64,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct NeuronArgs {
    /// The idle window in which the driver's CPU time and wake-ups are taken.
    #[arg(long, default_value_t = 180)]
    steady_secs: u64,
    /// Burst sizes, comma-separated (16: every chip of the node at once).
    #[arg(long, value_delimiter = ',', default_values_t = [16usize])]
    bursts: Vec<usize>,
    /// Bursts of each size per mode.
    #[arg(long, default_value_t = 3)]
    burst_rounds: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct Common {
    /// Kubernetes release (a minor such as `1.37` or `1.34`, or an exact version).
    #[arg(long, default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    kubernetes: String,
    /// Where the JSON report goes (relative to the repository root).
    #[arg(long, default_value = ".e2e")]
    work_dir: PathBuf,
    /// Use the release `efa-driver` already built next to xtask (no cargo
    /// build), as it is.
    #[arg(long)]
    no_build: bool,
}

#[derive(clap::Args)]
struct DriverArgs {
    /// Rounds per driver (one pod with one one-device claim each).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// The idle window in which each driver's API requests are counted.
    #[arg(long, default_value_t = 600)]
    steady_secs: u64,
    /// Burst sizes, comma-separated: N pods with a one-device claim each,
    /// created at once (`long_runs::bench::burst`); `--burst-rounds 0` runs none.
    #[arg(long, value_delimiter = ',', default_values_t = [8usize, 16, 32])]
    bursts: Vec<usize>,
    /// Bursts of each size per driver.
    #[arg(long, default_value_t = 5)]
    burst_rounds: usize,
    /// Bursts of each size per driver run first and not counted (the first
    /// burst after a quiet spell is slow for whichever driver runs it).
    #[arg(long, default_value_t = 1)]
    warm_up_bursts: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct FleetArgs {
    /// Node shapes, comma-separated, each run at every size: `p5` (32 EFAs),
    /// `trn2-cores` (NeuronCore partitions and 16 EFAs), `trn2-chips`
    /// (whole chips and 16 EFAs).
    #[arg(long, value_delimiter = ',', default_values = ["p5", "trn2-cores"])]
    shapes: Vec<long_runs::bench::fleet::shape::FleetShape>,
    /// Fleet sizes, comma-separated, run one after the other.
    #[arg(long, value_delimiter = ',', default_values_t = [50usize, 200, 500])]
    nodes: Vec<usize>,
    /// The steady window per size in which the fleet's requests are counted.
    #[arg(long, default_value_t = 60)]
    steady_secs: u64,
    /// How long after the API server restart the storm is recorded.
    #[arg(long, default_value_t = 60)]
    storm_secs: u64,
    #[command(flatten)]
    common: Common,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        Some(BenchCommand::Fleet(fleet)) => run_fleet(fleet),
        Some(BenchCommand::Neuron(neuron)) => run_neuron(neuron),
        Some(BenchCommand::Scheduler(scheduler)) => crate::bench_scheduler::run(scheduler),
        Some(BenchCommand::Probes(probes)) => run_probes(probes),
        Some(BenchCommand::Slowloris(args)) => run_slowloris(args),
        None => run_drivers(args.drivers),
    }
}

/// The cluster's components and helm (as `cargo xtask e2e` builds them),
/// and the two drivers with the image's release profile and flags (only
/// those packages: the benchmarks run nothing else). Returns the release
/// directory.
fn prepare(common: &Common) -> Result<(PathBuf, e2e::KubernetesVersion, PathBuf)> {
    let root = crate::paths::repo_root();
    let version = e2e::KubernetesVersion::resolve(&common.kubernetes)?;
    crate::e2e::build_cluster_and_helm(&root, &version)?;
    if !common.no_build {
        let status = crate::cargo_command::cargo()
            .current_dir(&root)
            .args(crate::image_build::BUILD_ARGS)
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("cargo build --release -p efa-driver -p neuron-driver failed ({status})");
        }
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let bin_dir = exe
        .parent()
        .map(|d| d.with_file_name("release"))
        .context("xtask binary has no directory")?;
    for driver in ["efa-driver", "neuron-driver"] {
        if !bin_dir.join(driver).is_file() {
            bail!("no release {driver} in {}", bin_dir.display());
        }
    }
    let work = root.join(&common.work_dir);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    Ok((bin_dir, version, work))
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("==> bench: wrote {}", path.display());
    Ok(())
}

fn run_drivers(args: DriverArgs) -> Result<()> {
    let (bin_dir, version, work) = prepare(&args.common)?;
    let t = Instant::now();
    let mut progress: local_cluster::go_build::Progress = Box::new(move |line: &str| {
        eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
    });
    let refdriver = long_runs::bench::refdriver::build(&mut progress)
        .context("building the reference Go driver (e2e/go/refdriver)")?;
    let options = long_runs::bench::BenchOptions {
        rounds: args.rounds,
        steady: Duration::from_secs(args.steady_secs),
        kubernetes_version: version.clone(),
        bin_dir,
        refdriver,
        bursts: args.bursts,
        burst_rounds: args.burst_rounds,
        warm_up_bursts: args.warm_up_bursts,
    };
    eprintln!(
        "==> bench: Kubernetes {version}, {} rounds per driver, {} s steady window",
        args.rounds, args.steady_secs
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::run(&options))?;
    for line in report.table().into_iter().chain(report.burst_table()) {
        println!("{line}");
    }
    write_json(&work.join(format!("bench-{version}.json")), &report)
}

fn run_fleet(args: FleetArgs) -> Result<()> {
    let (bin_dir, version, work) = prepare(&args.common)?;
    let options = long_runs::bench::fleet::FleetOptions {
        shapes: args.shapes,
        nodes: args.nodes,
        steady: Duration::from_secs(args.steady_secs),
        storm_window: Duration::from_secs(args.storm_secs),
        kubernetes_version: version.clone(),
        efa_driver: bin_dir.join("efa-driver"),
        neuron_driver: bin_dir.join("neuron-driver"),
    };
    let shapes: Vec<String> = options.shapes.iter().map(ToString::to_string).collect();
    eprintln!(
        "==> bench fleet: Kubernetes {version}, shapes {}, sizes {:?}",
        shapes.join(","),
        options.nodes
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::fleet::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    write_json(&work.join(format!("bench-fleet-{version}.json")), &report)
}

fn run_neuron(args: NeuronArgs) -> Result<()> {
    let (bin_dir, version, work) = prepare(&args.common)?;
    let t = Instant::now();
    let mut progress: local_cluster::go_build::Progress = Box::new(move |line: &str| {
        eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
    });
    let refdriver = long_runs::bench::refdriver::build(&mut progress)
        .context("building the reference Go driver (e2e/go/refdriver)")?;
    let options = long_runs::bench::neuron::NeuronBenchOptions {
        refdriver,
        steady: Duration::from_secs(args.steady_secs),
        bursts: args.bursts,
        burst_rounds: args.burst_rounds,
        kubernetes_version: version.clone(),
        bin_dir,
    };
    eprintln!("==> bench neuron: Kubernetes {version}, partitions on and off");
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::neuron::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    write_json(&work.join(format!("bench-neuron-{version}.json")), &report)
}

fn run_probes(args: ProbesArgs) -> Result<()> {
    let (bin_dir, version, work) = prepare(&args.common)?;
    let options = long_runs::bench::probes::ProbesOptions {
        rounds: args.rounds,
        bursts: args.bursts,
        claims: args.claims,
        rate: args.rate,
        kubernetes_version: version.clone(),
        bin_dir,
    };
    eprintln!(
        "==> bench probes: Kubernetes {version}, {} rounds of 3 conditions x {} bursts of {} claims, storm {} requests/s",
        args.rounds, args.bursts, args.claims, args.rate
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::probes::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    write_json(&work.join(format!("bench-probes-{version}.json")), &report)
}

fn run_slowloris(args: SlowlorisArgs) -> Result<()> {
    let (release_dir, version, work) = prepare(&args.common)?;
    let bin_dir = match args.driver_dir {
        Some(dir) => {
            let dir = std::path::absolute(&dir)
                .with_context(|| format!("resolving {}", dir.display()))?;
            if !dir.join("efa-driver").is_file() {
                bail!("no efa-driver in {}", dir.display());
            }
            dir
        }
        None => release_dir,
    };
    let options = long_runs::bench::slowloris::SlowlorisOptions {
        rounds: args.rounds,
        bursts: args.bursts,
        claims: args.claims,
        rate: args.rate,
        settle: Duration::from_secs(args.settle_secs),
        kubernetes_version: version.clone(),
        bin_dir,
    };
    eprintln!(
        "==> bench slowloris: Kubernetes {version}, {} rounds of 3 conditions x {} bursts of {} claims, {} slow connections/s",
        args.rounds, args.bursts, args.claims, args.rate
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::slowloris::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    write_json(
        &work.join(format!("bench-slowloris-{version}.json")),
        &report,
    )
}
