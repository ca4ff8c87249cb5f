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
//! `kind` (the default) installs and starts Docker when it is missing and
//! builds kind from its Go module (it stops at once, naming `--cluster
//! local`, where Docker cannot be had), builds the same prerequisites and,
//! with `--kind-images offline` (the default), every image the cluster needs,
//! brings up the kind cluster of `xtask/src/kind.rs`, and runs the same
//! scenarios there with the chart-installed testbed
//! (`tests/scenarios_kind.rs`); `--keep` leaves the cluster, else it is
//! deleted.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClusterKind {
    /// A kind cluster in Docker, drivers installed from the Helm charts.
    Kind,
    /// Kubernetes components as local processes (no Docker).
    Local,
}

/// Which local testbeds run the scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TestbedChoice {
    /// The drivers as host processes (`tests/scenarios.rs`) and the cluster proof test.
    Host,
    /// The drivers installed from the Helm charts, as DaemonSet pods (`tests/scenarios_chart.rs`).
    Charts,
    /// Both, each on its own cluster.
    All,
}

impl TestbedChoice {
    /// `(label, cargo test target, figures file name suffix)` of each testbed it runs.
    fn targets(self) -> Vec<(&'static str, &'static str, &'static str)> {
        let host = ("drivers as host processes", "scenarios", "host");
        let charts = (
            "drivers from the charts, as DaemonSet pods",
            "scenarios_chart",
            "charts",
        );
        match self {
            Self::Host => vec![host],
            Self::Charts => vec![charts],
            Self::All => vec![host, charts],
        }
    }
}

#[derive(clap::Args)]
pub struct E2eArgs {
    /// Where the cluster comes from.
    #[arg(long, value_enum, default_value_t = ClusterKind::Kind)]
    pub cluster: ClusterKind,
    /// Scratch directory (fixtures, kubeconfig, generated configs).
    #[arg(long, default_value = ".e2e")]
    pub work_dir: PathBuf,
    /// Leave the cluster running after the run. `--cluster local`: only the
    /// scenarios run (host-process testbed), their cluster up until Ctrl-C.
    /// `--cluster kind`: the kind cluster stays, also when its bring-up or
    /// the scenarios fail; without `--keep` it is deleted, failed run or not.
    #[arg(long)]
    pub keep: bool,
    /// Run the drivers as the container image builds them (release profile,
    /// the Dockerfile's cargo command), so the suite tests what ships and the
    /// RSS figure is the production one. The GPU test driver stays a debug build.
    #[arg(long)]
    pub release: bool,
    /// Kubernetes release: a minor (`1.37`, `1.34`: the patch
    /// `crates/local-cluster/src/versions.rs` pins) or an exact version of a known
    /// minor; built from the Go modules and cached on first use.
    #[arg(long, alias = "k8s-version", default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    pub kubernetes: String,
    /// Where the kind run's images come from (`--cluster kind`): all built
    /// here (`offline`), or kind's published node image and the Dockerfile's
    /// public bases (`registry`).
    #[arg(long, value_enum, default_value_t = crate::kind::KindImages::Offline)]
    pub kind_images: crate::kind::KindImages,
    /// Build everything the run needs, then stop before creating a cluster
    /// (to warm the caches outside a cluster run): `--cluster kind` the
    /// tools, binaries and images; `--cluster local` the components, helm,
    /// the drivers and the test binaries of the chosen testbeds (what
    /// `cargo xtask ci` does once before its e2e legs run side by side).
    #[arg(long)]
    pub prepare_only: bool,
    /// Which local testbeds run the scenarios (`--cluster local`).
    #[arg(long, value_enum, default_value_t = TestbedChoice::All)]
    pub testbed: TestbedChoice,
}

pub fn run(args: E2eArgs) -> Result<()> {
    let root = crate::paths::repo_root();
    let work = root.join(&args.work_dir);
    match args.cluster {
        ClusterKind::Kind => run_kind(&root, &work, &args),
        ClusterKind::Local => run_local(&root, &work, &args),
    }
}

/// The local cluster's components for `version` and helm, built or found
/// in the cache, with the build's progress on stderr (what the long runs
/// need before they start a cluster).
pub fn build_cluster_and_helm(root: &Path, version: &e2e::KubernetesVersion) -> Result<()> {
    let t = Instant::now();
    local_cluster::toolchain::ensure_built(local_cluster::toolchain::BuildOptions {
        kubernetes_version: version.clone(),
        install_host_packages: true,
        prune_go_build_cache: true,
        progress: Box::new(move |line| {
            eprintln!("[{:>5.0}s] {line}", t.elapsed().as_secs_f64());
        }),
    })
    .context("building the local cluster's components")?;
    crate::helm::ensure(root).map(drop)
}

/// What `e2e` and `demo` need before a local cluster can start; returns the
/// directory of the driver binaries. Prints each step's time.
/// `prune_go_build_cache`: empty the Go build cache after the Kubernetes
/// build (`false` for kind, whose node binaries are built from the same
/// module next and empty it themselves).
pub fn build_prerequisites(
    root: &Path,
    release: bool,
    version: &e2e::KubernetesVersion,
    prune_go_build_cache: bool,
) -> Result<PathBuf> {
    let started = Instant::now();
    eprintln!("==> e2e: Kubernetes {version} components (cached under ~/.cache/aws-dra)");
    let version = version.clone();
    let t = Instant::now();
    local_cluster::toolchain::ensure_built(local_cluster::toolchain::BuildOptions {
        kubernetes_version: version,
        install_host_packages: true,
        prune_go_build_cache,
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
        cargo(root, crate::image_build::BUILD_ARGS)?;
        let release_dir = debug_dir.with_file_name("release");
        let dir = debug_dir.with_file_name("e2e-release-bin");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, from) in [
            ("efa-driver", &release_dir),
            ("neuron-driver", &release_dir),
            ("gpu-test-driver", &debug_dir),
        ] {
            // Replaced by a rename, never removed: another e2e run (CI runs
            // its legs side by side) may be starting a driver from it now.
            let link = dir.join(name);
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(from.join(name), &tmp)
                .with_context(|| format!("linking {}", tmp.display()))?;
            std::fs::rename(&tmp, &link)
                .with_context(|| format!("renaming {} to {}", tmp.display(), link.display()))?;
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

/// The figures file of one testbed run on one Kubernetes version.
pub fn figures_file(work: &Path, version: &e2e::KubernetesVersion, suffix: &str) -> PathBuf {
    work.join(format!("figures-{version}-{suffix}.json"))
}

fn run_local(root: &Path, work: &Path, args: &E2eArgs) -> Result<()> {
    let started = Instant::now();
    let version = e2e::KubernetesVersion::resolve(&args.kubernetes)?;
    let bin_dir = build_prerequisites(root, args.release, &version, true)?;
    let build_s = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let testbeds = if args.keep {
        TestbedChoice::Host.targets()
    } else {
        args.testbed.targets()
    };
    let mut test = crate::cargo_command::cargo();
    // Every test target runs even when one fails (the cluster proof test
    // after a failed scenario target, say); cargo then names each target
    // that failed in its last lines.
    test.current_dir(root)
        .args(["test", "--locked", "--no-fail-fast", "-p", "e2e"])
        .env("AWS_DRA_BIN_DIR", &bin_dir)
        .env("AWS_DRA_K8S_VERSION", version.to_string());
    if testbeds.iter().any(|t| t.1 == "scenarios") && !args.keep {
        // The cluster proof test goes with the host-process testbed.
        test.args(["--test", "two_nodes"]);
    }
    for (_, target, suffix) in &testbeds {
        let file = figures_file(work, &version, suffix);
        if !args.prepare_only {
            let _ = std::fs::remove_file(&file);
        }
        test.args(["--test", target]);
        let var = match *target {
            "scenarios" => "AWS_DRA_E2E_FIGURES",
            _ => "AWS_DRA_E2E_CHART_FIGURES",
        };
        test.env(var, &file);
    }
    if args.keep {
        test.env("AWS_DRA_E2E_KEEP", "1");
    }
    if args.prepare_only {
        let status = test
            .arg("--no-run")
            .status()
            .context("building the e2e tests")?;
        if !status.success() {
            bail!("building the e2e tests failed ({status})");
        }
        eprintln!(
            "==> e2e: Kubernetes {version}, binaries and tests ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    eprintln!("==> e2e: cargo test -p e2e on Kubernetes {version} (logs under target/e2e/)");
    let t = Instant::now();
    let status = test.status().context("running cargo test -p e2e")?;
    let test_s = t.elapsed().as_secs_f64();
    eprintln!("==> e2e figures on Kubernetes {version} (measured, not asserted)");
    eprintln!("    prerequisites (build; warm when cached): {build_s:.1}s");
    eprintln!("    cargo test -p e2e: {test_s:.1}s");
    for (label, _, suffix) in &testbeds {
        eprintln!("  {label}:");
        let file = figures_file(work, &version, suffix);
        match std::fs::read_to_string(&file) {
            Ok(text) => match serde_json::from_str::<e2e::Figures>(&text) {
                Ok(f) => print_figures(&f),
                Err(e) => eprintln!("    {} unreadable: {e}", file.display()),
            },
            Err(_) => eprintln!("    (no figures: the scenarios did not run)"),
        }
    }
    if !status.success() {
        bail!(
            "end-to-end tests on Kubernetes {version} failed ({status}); component logs are under target/e2e/<run>/"
        );
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
    let started = Instant::now();
    // Before any build: a machine that cannot have Docker learns it at once.
    let kind = crate::kind::prepare_tools(root)?;
    let version = e2e::KubernetesVersion::resolve(&args.kubernetes)?;
    // The driver image first: it needs no Kubernetes build.
    let build_args = crate::kind::base_image_args(args.kind_images)?;
    crate::kind::build_driver_image(root, &build_args)?;
    // Debug builds: the charts run the drivers of the Dockerfile's image;
    // only the GPU stand-in's image is packed from these binaries.
    let bin_dir = build_prerequisites(root, false, &version, false)?;
    let setup = crate::kind::prepare_images(root, kind, args.kind_images, &version)?;
    let probe = e2e::Binaries::locate(&version)?.probe_image;
    let prepared_s = started.elapsed().as_secs_f64();
    if args.prepare_only {
        eprintln!("==> e2e(kind): tools, binaries and images ready in {prepared_s:.1}s");
        return Ok(());
    }
    let t = Instant::now();
    let kubeconfig = crate::kind::bring_up(work, &bin_dir, &probe, &setup, args.keep)?;
    let bring_up_s = t.elapsed().as_secs_f64();
    let figures = work.join("figures-kind.json");
    let _ = std::fs::remove_file(&figures);
    let result = crate::kind::run_scenarios(root, &version, &kubeconfig, work, &figures);
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
        crate::kind::delete(&setup.kind)?;
    }
    eprintln!(
        "==> e2e(kind) times: tools, binaries and images {prepared_s:.1}s; \
         cluster and image loads {bring_up_s:.1}s; total {:.1}s",
        started.elapsed().as_secs_f64()
    );
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
        let parsed =
            Cli::try_parse_from(["x", "--kubernetes", "1.34", "--testbed", "host"]).unwrap();
        assert_eq!(parsed.e2e.kubernetes, "1.34");
        assert_eq!(parsed.e2e.testbed, TestbedChoice::Host);
        let old_flag = Cli::try_parse_from(["x", "--k8s-version", "v1.37.2"]).unwrap();
        assert_eq!(old_flag.e2e.kubernetes, "v1.37.2");
        assert_eq!(
            Cli::try_parse_from(["x"]).unwrap().e2e.kubernetes,
            format!("1.{}", local_cluster::versions::MAIN_MINOR)
        );
        assert!(
            Cli::try_parse_from(["x", "--cluster", "local", "--keep"])
                .unwrap()
                .e2e
                .keep
        );
    }
}
