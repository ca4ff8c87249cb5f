//! `cargo xtask bench scheduler [--nodes 100,500,1000] [--shapes ...] [--gang]`:
//! what our slices cost the real kube-scheduler, on shadow nodes of a local
//! control plane (`long_runs::bench::scheduler`); `--gang`: a PodGroup of
//! whole-node pods against the same pods one by one. Writes
//! `<work-dir>/bench-scheduler-<version>.json` (`bench-scheduler-gang-...`
//! with `--gang`) and the scheduler's CPU
//! profiles next to it. Starts local clusters: run it under
//! `flock /tmp/aws-dra-e2e.lock` on a shared machine.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use long_runs::bench::scheduler::shapes::{ChartClasses, DriverBinaries, Shape};

#[derive(clap::Args)]
pub struct SchedulerArgs {
    /// Fleet sizes, comma-separated; every shape runs at every size on a
    /// control plane of its own.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize])]
    nodes: Vec<usize>,
    /// Node shapes, comma-separated: p5, trn2-cores, trn2-chips, trn2-aws, trn2u.
    #[arg(long, value_delimiter = ',', default_values_t = Shape::ALL.map(|s| s.name().to_string()))]
    shapes: Vec<String>,
    /// Length of the scheduler's CPU profile (trn2 with cores and with
    /// chips, at the largest size), from the first pod on.
    #[arg(long, default_value_t = 30)]
    profile_secs: u64,
    /// How long one phase's pods may take to bind.
    #[arg(long, default_value_t = 600)]
    phase_timeout_secs: u64,
    /// Kubernetes release (a minor such as `1.37`, or an exact version).
    #[arg(long, default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    kubernetes: String,
    /// Where the JSON report and the profiles go (relative to the repository root).
    #[arg(long, default_value = ".e2e")]
    work_dir: PathBuf,
    /// Use the driver binaries already built (no cargo build).
    #[arg(long)]
    no_build: bool,
    /// Instead of one pod per node per claim: a PodGroup (gang, minCount
    /// `--gang-pods`) of pods each holding a whole node's devices, against
    /// the same pods without the PodGroup, `--gang-reps` times each. Turns
    /// on GenericWorkload and scheduling.k8s.io/v1beta1 (1.37 or later).
    #[arg(long)]
    gang: bool,
    /// Pods of the gang, and of the independent set.
    #[arg(long, default_value_t = 16)]
    gang_pods: usize,
    /// Repetitions of the gang and of the independent set.
    #[arg(long, default_value_t = 3)]
    gang_reps: usize,
}

fn cargo_build(root: &std::path::Path, args: &[&str]) -> Result<()> {
    let status = crate::cargo_command::cargo()
        .current_dir(root)
        .args(args)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn device_classes(objects: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    objects
        .into_iter()
        .filter(|o| o["kind"] == "DeviceClass")
        .collect()
}

pub fn run(args: SchedulerArgs) -> Result<()> {
    let shapes = args
        .shapes
        .iter()
        .map(|s| Shape::parse(s).with_context(|| format!("unknown shape {s}")))
        .collect::<Result<Vec<_>>>()?;
    if args.nodes.is_empty() || args.nodes.contains(&0) {
        bail!("--nodes needs sizes of at least 1");
    }
    let gang = args
        .gang
        .then_some(long_runs::bench::scheduler::gang::GangOptions {
            pods: args.gang_pods,
            repetitions: args.gang_reps,
        });
    if let Some(g) = gang {
        if g.pods == 0 || g.repetitions == 0 {
            bail!("--gang-pods and --gang-reps need at least 1");
        }
        if let Some(&n) = args.nodes.iter().find(|&&n| n < g.pods) {
            bail!("--gang: {} whole-node pods do not fit {n} nodes", g.pods);
        }
    }
    let root = crate::paths::repo_root();
    let version = e2e::KubernetesVersion::resolve(&args.kubernetes)?;
    let t = Instant::now();
    crate::e2e::build_cluster_and_helm(&root, &version)?;
    if !args.no_build {
        // The drivers as the image ships them; the GPU stand-in as e2e runs it.
        cargo_build(&root, crate::image_build::BUILD_ARGS)?;
        cargo_build(
            &root,
            &["build", "--locked", "-p", "e2e", "--bin", "gpu-test-driver"],
        )?;
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let debug_dir = exe
        .parent()
        .map(std::path::Path::to_path_buf)
        .context("xtask binary has no directory")?;
    let release_dir = debug_dir.with_file_name("release");
    let drivers = DriverBinaries {
        efa: release_dir.join("efa-driver"),
        neuron: release_dir.join("neuron-driver"),
        gpu: debug_dir.join("gpu-test-driver"),
    };
    for binary in [&drivers.efa, &drivers.neuron, &drivers.gpu] {
        if !binary.is_file() {
            bail!("no {}", binary.display());
        }
    }
    let helm = e2e::charts::Helm::locate()?;
    let kube_version = version.to_string();
    let classes = ChartClasses {
        efa: device_classes(helm.render_for(e2e::charts::EFA_CHART, &[], Some(&kube_version))?),
        neuron: device_classes(helm.render_for(
            e2e::charts::NEURON_CHART,
            &[],
            Some(&kube_version),
        )?),
        gpu: device_classes(e2e::manifests::parse(
            "gpu-test-driver.yaml",
            e2e::manifests::GPU_TEST_MANIFEST,
        )?),
    };
    let work = root.join(&args.work_dir);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let scratch = tempfile::tempdir().context("creating a directory for the fixtures")?;
    let go = std::env::var_os("AWS_DRA_GO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/go/bin/go"));
    let options = long_runs::bench::scheduler::SchedulerBenchOptions {
        nodes: args.nodes,
        shapes,
        kubernetes_version: version.clone(),
        drivers,
        classes,
        scratch: scratch.path().to_path_buf(),
        profile_dir: work.join(format!("bench-scheduler-{version}-profiles")),
        profile_secs: args.profile_secs,
        go,
        phase_timeout: Duration::from_secs(args.phase_timeout_secs),
        gang,
    };
    eprintln!(
        "==> bench scheduler: Kubernetes {version}, sizes {:?}, shapes {:?}",
        options.nodes,
        options.shapes.iter().map(|s| s.name()).collect::<Vec<_>>()
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(long_runs::bench::scheduler::run(&options))?;
    for line in report.table() {
        println!("{line}");
    }
    let suffix = if args.gang { "-gang" } else { "" };
    let path = work.join(format!("bench-scheduler{suffix}-{version}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "==> bench scheduler: wrote {} in {:.0} s",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
