//! `cargo xtask autoscale karpenter`: Karpenter provisions a node for a
//! pod's claim on the local control plane (`long_runs::autoscale`), from
//! the templates our drivers print (`discover --instance-type`); the
//! drivers then publish on the new node's fixture and the pod is bound.
//! Prints the figures (Markdown, for docs/autoscaling.md) and writes
//! `<work-dir>/autoscale-karpenter-<version>.json`.
//!
//! It starts a local cluster: run it under `flock /tmp/aws-dra-e2e.lock` on
//! a shared machine, as the end-to-end suite. Karpenter and the KWOK
//! controller are built from the module proxy (`e2e/go/karpenter`,
//! `e2e/go/kwok`) into `~/.cache/aws-dra/bin` on first use. The drivers
//! are the binaries next to xtask (`cargo build -p efa-driver -p
//! neuron-driver` first), or those in `AWS_DRA_BIN_DIR`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct AutoscaleArgs {
    #[command(subcommand)]
    which: Autoscaler,
}

#[derive(clap::Subcommand)]
enum Autoscaler {
    /// Karpenter (kwok cloud provider) provisions for AWS's "4 chips and
    /// their 4 EFAs" claim; claims no offered type satisfies get no node.
    Karpenter(KarpenterArgs),
}

#[derive(clap::Args)]
struct KarpenterArgs {
    /// Instance types offered to Karpenter, comma-separated (each needs a
    /// driver model and a fixture).
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = ["trn1.32xlarge", "trn2.48xlarge", "inf2.48xlarge", "p5.48xlarge"].map(String::from)
    )]
    instance_types: Vec<String>,
    /// The `examples/` file whose pod Karpenter provisions for (applied as
    /// written; repository-relative).
    #[arg(long, default_value = long_runs::autoscale::karpenter::EXAMPLE)]
    example: String,
    /// How long the provisioned pod may take to run, seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// How long the unsatisfiable pods are watched before the provisioned
    /// one is created, seconds.
    #[arg(long, default_value_t = 30)]
    unsatisfiable_window: u64,
    #[command(flatten)]
    target: crate::long_run::RunTarget,
    /// Build Karpenter and the KWOK controller (minutes, the first time)
    /// and stop: no cluster, so no need for the e2e lock.
    #[arg(long)]
    build_only: bool,
}

pub fn run(args: AutoscaleArgs) -> Result<()> {
    match args.which {
        Autoscaler::Karpenter(a) => karpenter(a),
    }
}

fn karpenter(args: KarpenterArgs) -> Result<()> {
    use long_runs::autoscale::{karpenter, objects, tools};
    let root = crate::paths::repo_root();
    let version = args.target.version()?;
    let offers = objects::offers(&args.instance_types).map_err(anyhow::Error::msg)?;
    let t = Instant::now();
    let mut progress: local_cluster::go_build::Progress = Box::new(move |line: &str| {
        eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
    });
    let tools = tools::build(&mut progress)?;
    if args.build_only {
        eprintln!(
            "==> autoscale karpenter: built {} and {}",
            tools.karpenter.display(),
            tools.kwok.display()
        );
        return Ok(());
    }
    crate::e2e::build_cluster_and_helm(&root, &version)?;
    let bin_dir = match std::env::var_os("AWS_DRA_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()
            .context("locating the xtask binary")?
            .parent()
            .map(std::path::Path::to_path_buf)
            .context("xtask binary has no directory")?,
    };
    let (efa_driver, neuron_driver) = (bin_dir.join("efa-driver"), bin_dir.join("neuron-driver"));
    for b in [&efa_driver, &neuron_driver] {
        if !b.is_file() {
            bail!(
                "no {} (cargo build -p efa-driver -p neuron-driver, or set AWS_DRA_BIN_DIR)",
                b.display()
            );
        }
    }
    let helm = e2e::charts::Helm::locate()?;
    let kube_version = version.to_string();
    let mut classes = Vec::new();
    for chart in [e2e::charts::EFA_CHART, e2e::charts::NEURON_CHART] {
        classes.extend(
            helm.render_for(chart, &[], Some(&kube_version))?
                .into_iter()
                .filter(|o| o["kind"] == "DeviceClass"),
        );
    }
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let options = karpenter::KarpenterOptions {
        kubernetes_version: version.clone(),
        tools,
        efa_driver,
        neuron_driver,
        offers,
        example: args.example.clone(),
        classes,
        scratch: scratch.path().to_path_buf(),
        timeout: Duration::from_secs(args.timeout),
        unsatisfiable_window: Duration::from_secs(args.unsatisfiable_window),
    };
    eprintln!(
        "==> autoscale karpenter: Kubernetes {version}, Karpenter {}, KWOK {}, offering {}; {}",
        options.tools.karpenter_version,
        options.tools.kwok_version,
        args.instance_types.join(", "),
        args.example
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(karpenter::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    let work = root.join(&args.target.work_dir);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let stem = std::path::Path::new(&args.example)
        .file_stem()
        .map_or_else(|| "example".into(), |s| s.to_string_lossy().into_owned());
    let path = work.join(format!("autoscale-karpenter-{version}-{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("==> autoscale karpenter: wrote {}", path.display());
    let failures = report.failures();
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("==> autoscale karpenter: FAILED: {f}");
        }
        bail!(
            "autoscale karpenter: {} check(s) failed (above)",
            failures.len()
        );
    }
    eprintln!("==> autoscale karpenter: every check passed");
    Ok(())
}
