//! `cargo xtask k8s`: build the Kubernetes components and run the local cluster.
//!
//! - `build`: builds (or finds in `~/.cache/aws-dra/`) kube-apiserver,
//!   kube-controller-manager, kube-scheduler, kubelet, etcd, containerd, ctr,
//!   the runc shim and the pause/probe images; installs runc and the CNI
//!   plugins from Debian when missing. Prints the measured time.
//! - `up`: builds what is missing, starts a local cluster (default nodes `p5`
//!   and `trn2`) and prints the admin kubeconfig; `--keep` leaves it running
//!   until Ctrl-C, otherwise it is torn down once all nodes registered.
//! - `gen-module`: regenerates the Kubernetes wrapper module for a version.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use e2e::KubernetesVersion;
use e2e::{ClusterConfig, LocalCluster, NodeSpec};
use local_cluster::toolchain::{self, BuildOptions};
use local_cluster::versions::MAIN_MINOR;

#[derive(clap::Args)]
pub struct K8sArgs {
    #[command(subcommand)]
    command: K8sCommand,
}

#[derive(clap::Subcommand)]
enum K8sCommand {
    /// Build every binary and image the local cluster needs (cached by version).
    Build(BuildArgs),
    /// Start a local cluster and print its kubeconfig.
    Up(UpArgs),
    /// Regenerate the k8s.io/kubernetes wrapper go.mod of a release (needs
    /// the Go proxy); written to the release's committed module directory
    /// (`e2e/go/kubernetes/v1.MINOR`) unless `--out` says otherwise.
    GenModule {
        /// A minor (`1.37`, its pinned patch) or an exact version.
        #[arg(long, alias = "k8s-version", default_value_t = format!("1.{MAIN_MINOR}"))]
        kubernetes: String,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Kubernetes release to build: a minor (`1.37`, `1.34`: the patch
    /// `crates/local-cluster/src/versions.rs` pins) or an exact version of a known minor.
    /// Repeat it to build several (`up` uses the first).
    #[arg(long, alias = "k8s-version", default_values_t = [format!("1.{MAIN_MINOR}")])]
    kubernetes: Vec<String>,
    /// Do not apt-get install runc / containernetworking-plugins when missing.
    #[arg(long)]
    no_host_packages: bool,
}

#[derive(clap::Args)]
struct UpArgs {
    #[command(flatten)]
    build: BuildArgs,
    /// Node names to start.
    #[arg(long, value_delimiter = ',', default_value = "p5,trn2")]
    nodes: Vec<String>,
    /// Leave the cluster running until Ctrl-C.
    #[arg(long)]
    keep: bool,
}

pub fn run(args: K8sArgs) -> Result<()> {
    match args.command {
        K8sCommand::Build(build) => {
            build_all(&build)?;
            Ok(())
        }
        K8sCommand::Up(up) => up_cluster(up),
        K8sCommand::GenModule { kubernetes, out } => {
            let version = KubernetesVersion::resolve(&kubernetes)?;
            let out = match out {
                Some(dir) => dir,
                None => toolchain::repo_root().join(version.release()?.module_dir()),
            };
            local_cluster::go_build::generate_kubernetes_module(&version, &out)?;
            eprintln!("wrote {}/go.mod and go.sum for {version}", out.display());
            Ok(())
        }
    }
}

fn build_all(args: &BuildArgs) -> Result<e2e::Binaries> {
    let mut first = None;
    for text in &args.kubernetes {
        let binaries = build_one(args, &KubernetesVersion::resolve(text)?)?;
        first.get_or_insert(binaries);
    }
    first.context("no --kubernetes version given")
}

fn build_one(args: &BuildArgs, version: &KubernetesVersion) -> Result<e2e::Binaries> {
    let version = version.clone();
    let started = Instant::now();
    eprintln!(
        "==> k8s build: Kubernetes {version}, etcd {}, containerd {} (cache {})",
        toolchain::ETCD_VERSION,
        toolchain::CONTAINERD_VERSION,
        toolchain::cache_root().display()
    );
    let binaries = toolchain::ensure_built(BuildOptions {
        kubernetes_version: version,
        install_host_packages: !args.no_host_packages,
        prune_go_build_cache: true,
        progress: Box::new(move |line| {
            eprintln!("[{:>5.0}s] {line}", started.elapsed().as_secs_f64());
        }),
    })
    .context("building the local cluster's components")?;
    eprintln!(
        "==> k8s build: done in {:.1}s; kubelet at {}",
        started.elapsed().as_secs_f64(),
        binaries.kubelet.display()
    );
    Ok(binaries)
}

fn up_cluster(args: UpArgs) -> Result<()> {
    let binaries = build_all(&args.build)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let mut config = ClusterConfig::with_nodes(&[]);
        config.kubernetes_version = binaries.kubernetes_version.clone();
        config.nodes = args.nodes.iter().map(|n| NodeSpec::new(n)).collect();
        let started = Instant::now();
        let cluster = LocalCluster::start(config).await?;
        eprintln!(
            "==> cluster up in {:.1}s with nodes {}",
            started.elapsed().as_secs_f64(),
            args.nodes.join(", ")
        );
        println!("export KUBECONFIG={}", cluster.admin_kubeconfig().display());
        for node in cluster.nodes() {
            eprintln!(
                "    node {}: kubelet root {} | CDI {} | logs {}",
                node.name,
                node.kubelet_root_dir.display(),
                node.cdi_dir.display(),
                node.run_dir.display()
            );
        }
        if args.keep {
            eprintln!(
                "==> running; Ctrl-C tears it down (logs in {})",
                cluster.run_dir().display()
            );
            // The library's SIGINT handler tears down and exits; this just parks.
            std::future::pending::<()>().await;
        }
        let report = cluster.shutdown();
        anyhow::ensure!(report.is_clean(), "teardown left {report:?}");
        eprintln!("==> torn down cleanly");
        Ok(())
    })
}
