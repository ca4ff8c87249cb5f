//! `cargo xtask ci`: the one command that says whether a change is good.
//!
//! Each step runs as its own process so its output streams as it comes; the
//! summary at the end names every step with its result and duration.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use e2e::versions::{CI_RELEASES, MAIN_MINOR};

#[derive(clap::Args)]
pub struct CiArgs {
    /// Keep going after a failed step, to see every failure in one run.
    #[arg(long)]
    keep_going: bool,
}

struct Step {
    name: String,
    program: &'static str,
    args: Vec<String>,
    env: &'static [(&'static str, &'static str)],
}

fn step(name: &str, args: &[&str]) -> Step {
    Step {
        name: name.to_string(),
        program: "cargo",
        args: args.iter().map(|a| a.to_string()).collect(),
        env: &[],
    }
}

/// Which local testbeds run on each release CI covers: both on the main
/// release (what users deploy next, and the chart path as shipped), the
/// host-process testbed on the oldest (every scenario once more, within the
/// CI budget of docs/e2e.md).
fn e2e_matrix() -> Vec<(u32, &'static str)> {
    CI_RELEASES
        .iter()
        .map(|&minor| (minor, if minor == MAIN_MINOR { "all" } else { "host" }))
        .collect()
}

/// Seconds of each fuzz target in CI (5 targets: under 2 minutes with the
/// build warm).
const FUZZ_SMOKE_SECONDS: u64 = 15;

fn steps() -> Vec<Step> {
    let mut steps = vec![
        step("fmt", &["fmt", "--all", "--check"]),
        // Licences, bans and sources of the dependency graph (policy:
        // supply-chain.yaml).
        step("supply-chain", &["xtask", "supply-chain"]),
        step(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step {
            env: &[("RUSTDOCFLAGS", "-D warnings")],
            ..step("doc", &["doc", "--workspace", "--no-deps", "--locked"])
        },
        step(
            "test",
            &["test", "--workspace", "--exclude", "e2e", "--locked"],
        ), // The e2e crate's own unit tests and the structure checks (import
        // cycles, file length) of crates/e2e and xtask: no cluster needed.
        step(
            "e2e-unit",
            &[
                "test",
                "-p",
                "e2e",
                "--locked",
                "--lib",
                "--test",
                "structure",
            ],
        ),
        // Every fuzz target built from scratch on a cold machine (needs a C++
        // compiler for libFuzzer) and run from its seeds for a few seconds:
        // catches a target that no longer builds and any crash its seeds
        // or a short search reach. The long runs are `cargo xtask fuzz`.
        step(
            "fuzz-smoke",
            &["xtask", "fuzz", "--time", &FUZZ_SMOKE_SECONDS.to_string()],
        ),
    ];
    // Kubernetes (every CI release), etcd and containerd from their Go
    // modules (cached under ~/.cache/aws-dra; seconds when warm, ~10 minutes
    // a release cold on 2 cores).
    let mut k8s = vec!["xtask", "k8s", "build"];
    let minors: Vec<String> = CI_RELEASES.iter().map(|m| format!("1.{m}")).collect();
    for m in &minors {
        k8s.extend(["--kubernetes", m.as_str()]);
    }
    steps.push(step("k8s-build", &k8s));
    // The container image's compile step (same command as the Dockerfile).
    steps.push(step("image-build", crate::image_build::BUILD_ARGS));
    // The end-to-end suite on a local cluster of real components, with the
    // drivers just built for the image (so it tests what ships), once per
    // release: builds helm and the GPU test driver, runs `cargo test -p e2e`
    // (cluster proof test + the scenarios), prints the figures and skips.
    for (minor, testbed) in e2e_matrix() {
        let version = format!("1.{minor}");
        steps.push(step(
            &format!("e2e-{version}"),
            &[
                "xtask",
                "e2e",
                "--cluster",
                "local",
                "--release",
                "--kubernetes",
                &version,
                "--testbed",
                testbed,
            ],
        ));
    }
    steps.push(step("charts", &["xtask", "charts", "check"]));
    steps
}

/// Tests write thousands of small sysfs fixture files; on some disks each
/// create costs most of a millisecond, on tmpfs microseconds. Use a directory
/// on `/dev/shm` for the tests' temp dirs when there is one and `TMPDIR` is
/// not set by the caller.
fn tmpfs_scratch() -> Option<std::path::PathBuf> {
    if std::env::var_os("TMPDIR").is_some() {
        return None;
    }
    let dir = std::path::Path::new("/dev/shm/aws-dra-ci");
    std::fs::create_dir_all(dir).ok()?;
    Some(dir.to_path_buf())
}

pub fn run(args: CiArgs) -> Result<()> {
    let started = Instant::now();
    let mut results: Vec<(String, bool, Duration)> = Vec::new();
    let scratch = tmpfs_scratch();
    let work = crate::paths::repo_root().join(".e2e");
    // The summary reads the e2e figures: none may be left from an earlier run.
    if let Ok(entries) = std::fs::read_dir(&work) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("figures-") && name.ends_with(".json") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    for step in steps() {
        eprintln!(
            "==> ci: {} ({} {})",
            step.name,
            step.program,
            step.args.join(" ")
        );
        let t = Instant::now();
        let mut command = Command::new(step.program);
        command.args(&step.args).envs(step.env.iter().copied());
        if let Some(dir) = &scratch {
            command.env("TMPDIR", dir);
        }
        let ok = command.status().map(|s| s.success())?;
        results.push((step.name, ok, t.elapsed()));
        if !ok && !args.keep_going {
            break;
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.1)
        .map(|r| r.0.as_str())
        .collect();
    let summary: Vec<String> = results
        .iter()
        .map(|(n, ok, d)| {
            format!(
                "{n} {} ({:.0}s)",
                if *ok { "ok" } else { "FAILED" },
                d.as_secs_f64()
            )
        })
        .collect();
    eprintln!(
        "ci: {} in {:.0}s: {}",
        if failed.is_empty() {
            "PASSED"
        } else {
            "FAILED"
        },
        started.elapsed().as_secs_f64(),
        summary.join(", ")
    );
    for line in e2e_summary(&work) {
        eprintln!("{line}");
    }
    if !failed.is_empty() {
        bail!("ci failed: {}", failed.join(", "));
    }
    Ok(())
}

/// One line per release and testbed that ran: outcome counts and every skip
/// with its reason.
fn e2e_summary(work: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for (minor, _) in e2e_matrix() {
        let Ok(release) = e2e::Release::for_minor(minor) else {
            continue;
        };
        let version = release.version();
        for suffix in ["host", "charts"] {
            let file = crate::e2e::figures_file(work, &version, suffix);
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let Ok(f) = serde_json::from_str::<e2e::Figures>(&text) else {
                out.push(format!(
                    "ci: e2e {version} ({suffix}): {} unreadable",
                    file.display()
                ));
                continue;
            };
            out.push(format!(
                "ci: e2e Kubernetes {version} ({suffix} testbed): {} passed, {} failed, {} skipped",
                f.passed,
                f.failed,
                f.skipped.len()
            ));
            for (name, why) in &f.skipped {
                out.push(format!("ci:     skipped {name}: {why}"));
            }
        }
    }
    out
}
