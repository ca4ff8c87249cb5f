//! `cargo xtask chaos`: the drivers under faults on the local cluster
//! (`long_runs::chaos`): create/delete cycles with random SIGKILLs, kubelet
//! restart, simulated reboot, API server and etcd outage, disk faults
//! (corrupt checkpoint, full CDI directory, read-only checkpoint directory).
//! Prints a figures table (Markdown, for docs/reliability.md) and writes
//! `<work-dir>/chaos-<version>.json`.
//!
//! It starts a local cluster: run it under `flock /tmp/aws-dra-e2e.lock` on
//! a shared machine, as the end-to-end suite. The drivers are the binaries
//! next to xtask (`cargo build -p efa-driver -p neuron-driver -p e2e
//! --bins` first), or those in `AWS_DRA_BIN_DIR`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct ChaosArgs {
    /// Create/delete cycles (5 pods with 4 claims each).
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// SIGKILLs per driver (EFA on p5, Neuron on trn2) spread over the cycles.
    #[arg(long, default_value_t = 100)]
    kills: u64,
    /// Stop starting cycles after this many minutes (0: no limit); the
    /// table says how many ran.
    #[arg(long, default_value_t = 0)]
    max_minutes: u64,
    /// How long a pod may take to run, seconds.
    #[arg(long, default_value_t = 300)]
    pod_timeout: u64,
    /// Seed of the kill plan (default: the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Skip the kubelet restart, reboot, outage and disk faults.
    #[arg(long)]
    no_faults: bool,
    /// Cycles at a time (each lane takes the next cycle when its own ends).
    #[arg(long, default_value_t = 4)]
    lanes: u64,
    /// The kubelets' `syncFrequency`, seconds (default: the kubelet's own,
    /// 60). The kubelet retries a prepare that failed while a driver was
    /// dead only at its next sync of the pod (kubernetes#139836), so with
    /// the default each such pod waits 60–90 s; the checks do not depend on
    /// it, the run's length does.
    #[arg(long)]
    kubelet_sync_frequency: Option<u64>,
    /// Kubernetes release (a minor such as `1.37`, or an exact version).
    #[arg(long, default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    kubernetes: String,
    /// Where the JSON report goes (relative to the repository root).
    #[arg(long, default_value = ".e2e")]
    work_dir: PathBuf,
}

pub fn run(args: ChaosArgs) -> Result<()> {
    let root = crate::paths::repo_root();
    let version = e2e::KubernetesVersion::resolve(&args.kubernetes)?;
    crate::e2e::build_cluster_and_helm(&root, &version)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let options = long_runs::chaos::ChaosOptions {
        cycles: args.cycles,
        kills: args.kills,
        max_duration: (args.max_minutes > 0).then(|| Duration::from_secs(args.max_minutes * 60)),
        pod_timeout: Duration::from_secs(args.pod_timeout),
        seed,
        faults: !args.no_faults,
        lanes: args.lanes.max(1),
        kubelet_sync_frequency: args.kubelet_sync_frequency.map(Duration::from_secs),
        kubernetes_version: version.clone(),
    };
    eprintln!(
        "==> chaos: Kubernetes {version}, {} cycles {} at a time, {} kills per driver, kubelet syncFrequency {}, seed {seed}",
        args.cycles,
        args.lanes.max(1),
        args.kills,
        args.kubelet_sync_frequency
            .map_or("default".to_string(), |s| format!("{s}s"))
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::chaos::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    let work = root.join(&args.work_dir);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let path = work.join(format!("chaos-{version}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("==> chaos: wrote {}", path.display());
    let failures = report.failures();
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("==> chaos: FAILED: {f}");
        }
        anyhow::bail!("chaos: {} check(s) failed (above)", failures.len());
    }
    eprintln!("==> chaos: every check passed");
    Ok(())
}
