//! `cargo xtask lws`: AWS's documented way of running a job on a Trn2
//! UltraServer, a LeaderWorkerSet with `exclusive-topology` on the
//! UltraServer label and a whole-node `UltraServerConfig` claim per pod, on
//! four real trn2u kubelets of the local cluster (`long_runs::lws`).
//! Prints the figures (Markdown, for docs/multi-node.md) and writes
//! `<work-dir>/lws-<version>.json`.
//!
//! It starts a local cluster: run it under `flock /tmp/aws-dra-e2e.lock` on
//! a shared machine, as the end-to-end suite. The LWS controller is built
//! from the module proxy (`e2e/go/lws`) into `~/.cache/aws-dra/bin` on first
//! use. The drivers are the binaries next to xtask (`cargo build -p
//! efa-driver -p neuron-driver -p e2e --bins` first), or those in
//! `AWS_DRA_BIN_DIR`.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct LwsArgs {
    /// The `examples/` file with the LeaderWorkerSet (repository-relative).
    #[arg(long, default_value = long_runs::lws::EXAMPLE)]
    example: String,
    /// How long the group may take to run, seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    #[command(flatten)]
    target: crate::long_run::RunTarget,
    /// Build the LWS controller (minutes, the first time) and stop: no
    /// cluster, so no need for the e2e lock.
    #[arg(long)]
    build_only: bool,
}

pub fn run(args: LwsArgs) -> Result<()> {
    use long_runs::lws;
    let root = crate::paths::repo_root();
    let version = args.target.version()?;
    let t = Instant::now();
    let mut progress: local_cluster::go_build::Progress = Box::new(move |line: &str| {
        eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
    });
    let tool = lws::controller::build(&mut progress)?;
    if args.build_only {
        eprintln!("==> lws: built {}", tool.binary.display());
        return Ok(());
    }
    crate::e2e::build_cluster_and_helm(&root, &version)?;
    eprintln!(
        "==> lws: Kubernetes {version}, LeaderWorkerSet {}, {}",
        tool.version, args.example
    );
    let options = lws::LwsOptions {
        kubernetes_version: version.clone(),
        tool,
        example: args.example,
        timeout: Duration::from_secs(args.timeout),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(lws::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    let work = root.join(&args.target.work_dir);
    std::fs::create_dir_all(&work)?;
    let path = work.join(format!("lws-{version}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    eprintln!("==> lws: wrote {}", path.display());
    if !report.failures.is_empty() {
        for f in &report.failures {
            eprintln!("==> lws: FAILED: {f}");
        }
        bail!("lws: {} check(s) failed (above)", report.failures.len());
    }
    eprintln!("==> lws: every check passed");
    Ok(())
}
