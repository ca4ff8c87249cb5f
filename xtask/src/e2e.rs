//! `cargo xtask e2e [--cluster kind|local] [--keep]`: the end-to-end suite.
//!
//! Only cluster bring-up differs between the two modes; the scenarios are
//! shared (`crates/e2e/src/scenarios`, written against its `Testbed` seam).
//! `local` builds what is missing (Kubernetes components, helm, the driver
//! binaries and the test GPU driver), then runs `cargo test -p e2e`: the
//! cluster proof test and the scenarios on one local cluster of real
//! components (docs/e2e.md). It prints, without asserting, the figures we
//! track: build times, driver start → slices visible, prepare latency and
//! driver RSS. `--keep` runs only the scenarios (host-process testbed) and
//! leaves their cluster up until Ctrl-C. The local run has two testbeds: the
//! drivers as host processes (`tests/scenarios.rs`) and the drivers installed
//! by `helm upgrade --install` of the charts, as DaemonSet pods
//! (`tests/scenarios_chart.rs`).
//!
//! `kind` (the default) needs Docker and kind and stops at once without
//! them, naming `--cluster local`: it builds the same prerequisites, brings
//! up the kind cluster of `xtask/src/kind.rs`, and runs the same scenarios
//! there with the chart-installed testbed (`tests/scenarios_kind.rs`);
//! `--keep` leaves the cluster, else it is deleted. This machine has no
//! Docker engine: the kind path has not run here (see `kind.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClusterKind {
    /// A kind cluster in Docker, drivers installed from the Helm charts.
    Kind,
    /// Kubernetes components as local processes (no Docker).
    Local,
}

#[derive(clap::Args)]
pub struct E2eArgs {
    /// Where the cluster comes from.
    #[arg(long, value_enum, default_value_t = ClusterKind::Kind)]
    pub cluster: ClusterKind,
    /// Scratch directory (fixtures, kubeconfig, generated configs).
    #[arg(long, default_value = ".e2e")]
    pub work_dir: PathBuf,
    /// Leave the scenarios' cluster running (until Ctrl-C) after they ran.
    #[arg(long)]
    pub keep: bool,
    /// Run the drivers as the container image builds them (release profile,
    /// the Dockerfile's cargo command), so the suite tests what ships and the
    /// RSS figure is the production one. The GPU test driver stays a debug build.
    #[arg(long)]
    pub release: bool,
    /// Kubernetes release of the local cluster (a compatibility run; any
    /// version the Go module proxy serves, built and cached on first use).
    #[arg(long, default_value = e2e::toolchain::DEFAULT_KUBERNETES_VERSION)]
    pub k8s_version: String,
}

pub fn run(args: E2eArgs) -> Result<()> {
    let root = crate::charts::repo_root();
    let work = root.join(&args.work_dir);
    match args.cluster {
        ClusterKind::Kind => run_kind(&root, &work, &args),
        ClusterKind::Local => run_local(&root, &work, &args),
    }
}

/// What `e2e` and `demo` need before a local cluster can start; returns the
/// directory of the driver binaries. Prints each step's time.
pub fn build_prerequisites(root: &Path, release: bool, k8s_version: &str) -> Result<PathBuf> {
    let started = Instant::now();
    eprintln!("==> e2e: Kubernetes components (cached under ~/.cache/aws-dra)");
    let version = e2e::KubernetesVersion::parse(k8s_version)?;
    let t = Instant::now();
    e2e::toolchain::ensure_built(e2e::toolchain::BuildOptions {
        kubernetes_version: version,
        install_host_packages: true,
        progress: Box::new(move |line| {
            eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
        }),
    })
    .context("building the local cluster's components")?;
    eprintln!("    k8s build: {:.1}s", started.elapsed().as_secs_f64());
    let t = Instant::now();
    crate::helm::ensure(root)?;
    eprintln!("    helm: {:.1}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let packages: &[&str] = if release {
        &["-p", "e2e", "--bins"]
    } else {
        &[
            "-p",
            "efa-driver",
            "-p",
            "neuron-driver",
            "-p",
            "e2e",
            "--bins",
        ]
    };
    cargo(root, &[&["build", "--locked"], packages].concat())?;
    // `cargo xtask` runs target/<profile>/xtask: the debug binaries are its siblings.
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let debug_dir = exe
        .parent()
        .map(Path::to_path_buf)
        .context("xtask binary has no directory")?;
    let bin_dir = if release {
        // Exactly the image's build command, so no feature set differs from
        // what ships (and CI's image-build step has already done the work).
        cargo(root, crate::image::BUILD_ARGS)?;
        let release_dir = debug_dir.with_file_name("release");
        let dir = debug_dir.with_file_name("e2e-release-bin");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, from) in [
            ("efa-driver", &release_dir),
            ("neuron-driver", &release_dir),
            ("gpu-test-driver", &debug_dir),
        ] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(from.join(name), &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
        dir
    } else {
        debug_dir
    };
    eprintln!(
        "    driver binaries ({}): {:.1}s",
        if release { "release" } else { "debug" },
        t.elapsed().as_secs_f64()
    );
    Ok(bin_dir)
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(root)
        .args(args)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn run_local(root: &Path, work: &Path, args: &E2eArgs) -> Result<()> {
    let started = Instant::now();
    let bin_dir = build_prerequisites(root, args.release, &args.k8s_version)?;
    let build_s = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let figures = work.join("figures.json");
    let _ = std::fs::remove_file(&figures);
    let chart_figures = work.join("figures-chart.json");
    let _ = std::fs::remove_file(&chart_figures);
    let mut test = Command::new("cargo");
    test.current_dir(root)
        .args(["test", "--locked", "-p", "e2e"])
        .env("AWS_DRA_BIN_DIR", &bin_dir)
        .env("AWS_DRA_E2E_FIGURES", &figures)
        .env("AWS_DRA_E2E_CHART_FIGURES", &chart_figures)
        .env("AWS_DRA_K8S_VERSION", &args.k8s_version);
    if args.keep {
        test.args(["--test", "scenarios"])
            .env("AWS_DRA_E2E_KEEP", "1");
    }
    eprintln!("==> e2e: cargo test -p e2e (scenarios on a local cluster; logs under target/e2e/)");
    let t = Instant::now();
    let status = test.status().context("running cargo test -p e2e")?;
    let test_s = t.elapsed().as_secs_f64();
    eprintln!("==> e2e figures (measured, not asserted)");
    eprintln!("    prerequisites (build; warm when cached): {build_s:.1}s");
    eprintln!("    cargo test -p e2e: {test_s:.1}s");
    for (label, file) in [
        ("drivers as host processes", &figures),
        ("drivers from the charts, as DaemonSet pods", &chart_figures),
    ] {
        eprintln!("  {label}:");
        match std::fs::read_to_string(file) {
            Ok(text) => match serde_json::from_str::<e2e::Figures>(&text) {
                Ok(f) => print_figures(&f),
                Err(e) => eprintln!("    {} unreadable: {e}", file.display()),
            },
            Err(_) => eprintln!("    (no figures: the scenarios did not run)"),
        }
    }
    if !status.success() {
        bail!("end-to-end tests failed ({status}); component logs are under target/e2e/<run>/");
    }
    Ok(())
}

pub fn print_figures(f: &e2e::Figures) {
    for line in f.lines() {
        eprintln!("{line}");
    }
}

/// The shared scenarios on kind (see the module docs).
fn run_kind(root: &Path, work: &Path, args: &E2eArgs) -> Result<()> {
    // Before any build: a machine without Docker learns it at once.
    crate::kind::check_tools()?;
    let bin_dir = build_prerequisites(root, true, &args.k8s_version)?;
    let version = e2e::KubernetesVersion::parse(&args.k8s_version)?;
    let probe = e2e::Binaries::locate(&version)?.probe_image;
    let kubeconfig = crate::kind::bring_up(root, work, &bin_dir, &probe)?;
    let figures = work.join("figures-kind.json");
    let _ = std::fs::remove_file(&figures);
    let result = crate::kind::run_scenarios(root, &kubeconfig, work, &figures);
    if let Ok(text) = std::fs::read_to_string(&figures)
        && let Ok(f) = serde_json::from_str::<e2e::Figures>(&text)
    {
        eprintln!("==> e2e(kind) figures (measured, not asserted)");
        print_figures(&f);
    }
    if args.keep {
        eprintln!(
            "==> e2e(kind): cluster {} left running; KUBECONFIG={}",
            crate::kind::CLUSTER_NAME,
            kubeconfig.display()
        );
    } else {
        crate::kind::delete()?;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        e2e: E2eArgs,
    }

    #[test]
    fn cluster_defaults_to_kind_and_accepts_local() {
        let table = [
            (vec!["x"], ClusterKind::Kind),
            (vec!["x", "--cluster", "kind"], ClusterKind::Kind),
            (vec!["x", "--cluster", "local"], ClusterKind::Local),
        ];
        for (argv, want) in table {
            assert_eq!(
                Cli::try_parse_from(&argv).unwrap().e2e.cluster,
                want,
                "{argv:?}"
            );
        }
        assert!(Cli::try_parse_from(["x", "--cluster", "eks"]).is_err());
        assert!(!Cli::try_parse_from(["x"]).unwrap().e2e.keep);
        assert!(
            Cli::try_parse_from(["x", "--cluster", "local", "--keep"])
                .unwrap()
                .e2e
                .keep
        );
    }
}
