//! `cargo xtask ci`: the one command that says whether a change is good.
//!
//! Each step runs as its own process so its output streams as it comes; the
//! summary at the end names every step with its result and duration.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use local_cluster::versions::{CI_RELEASES, MAIN_MINOR};

mod entry;
mod excerpt;
mod lanes;
use excerpt::failure_excerpt;

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
    /// Runs side by side with the neighbouring steps that have a lane: the
    /// steps of one lane one after another, the lanes at the same time, each
    /// step's output prefixed with its name ([`lanes`]).
    lane: Option<String>,
    /// Starts where it stands in the list and runs beside every step after
    /// it (prefixed and logged like a lane's step); joined at the end. Only
    /// for a step whose builds take no cargo build lock that the steps
    /// beside it take (cargo holds one per target directory and profile).
    background: bool,
    /// Runs at a lower CPU priority (`nice -n` [`NICE`]): for checks that
    /// only need to end before the e2e legs do, so that they take the cores
    /// the legs and the image build leave idle rather than the legs' share.
    nice: bool,
}

/// The niceness of [`Step::nice`] steps. Cargo's and rustc's processes
/// inherit it. A nice-0 process weighs about nine times as much as one at
/// 10. That matters most to the charts leg, whose drivers run as pods: the
/// e2e clusters put every pod under `/aws-dra-e2e` (`crates/local-cluster/
/// src/cgroups.rs`), and on this cgroup v1 host that group sits beside CI's own
/// processes at the root of the `cpu` hierarchy and weighs as much as one
/// nice-0 process there, however many pods it holds.
const NICE: u32 = 10;

fn step(name: &str, args: &[&str]) -> Step {
    Step {
        name: name.to_string(),
        program: "cargo",
        args: args.iter().map(|a| a.to_string()).collect(),
        env: &[],
        lane: None,
        background: false,
        nice: false,
    }
}

/// The e2e legs, `(minor, testbed)`: both testbeds on the main release
/// (what users deploy next, and the chart path as shipped), the
/// host-process testbed on the oldest (every scenario once more, within the
/// CI budget of docs/e2e.md). Each leg is its own cluster.
fn e2e_matrix() -> Vec<(u32, &'static str)> {
    let mut legs = Vec::new();
    for minor in CI_RELEASES {
        legs.push((minor, "host"));
        if minor == MAIN_MINOR {
            legs.push((minor, "charts"));
        }
    }
    legs
}

/// Seconds of each fuzz target in CI, one at a time in the background
/// (5 targets: 50 s of fuzzing, plus the build).
const FUZZ_SMOKE_SECONDS: u64 = 10;

/// The lane of the checks that need no cluster, beside the e2e legs.
const CHECKS_LANE: &str = "checks";

/// The checks that need no cluster, run in one lane beside the e2e legs.
fn checks() -> Vec<Step> {
    let steps = vec![
        // Licences, bans and sources of the dependency graph (policy:
        // supply-chain.yaml).
        step("supply-chain", &["xtask", "supply-chain"]),
        // Every page under docs/ reachable from docs/README.md, no broken
        // relative link (a second or two).
        step("docs-links", &["xtask", "docs-links"]),
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
        // dra-core as a driver binary builds it, without the `testing`
        // feature the workspace build turns on through the e2e crate: no
        // unreachable `pub`, no code only the test helpers use.
        step(
            "clippy-sdk",
            &[
                "clippy", "-p", "dra-core", "--lib", "--locked", "--", "-D", "warnings",
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
        // cycles and file length in the test crates and xtask, import circles
        // between top-level modules in every crate, dra-core's public
        // surface): no cluster needed.
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
                // dra-core's public items, counted from the source.
                "--test",
                "public_surface",
                // The stand-in GPU driver's tests, dra-core's conformance
                // suite among them.
                "--bin",
                "gpu-test-driver",
            ],
        ),
        // checkov (pinned, from PyPI; installed into the cache on first
        // use) on the default renderings of the charts: only the failures
        // docs/install.md explains, at most 4 per chart.
        // Warm: ~40 s on this 2-core machine (one checkov run, 4 renderings).
        step("chart-scan", &["xtask", "charts", "scan"]),
    ];
    steps
        .into_iter()
        .map(|s| Step {
            lane: Some(CHECKS_LANE.to_string()),
            nice: true,
            ..s
        })
        .collect()
}

/// Every fuzz target built from scratch on a cold machine (needs a C++
/// compiler for libFuzzer) and run from its seeds for a few seconds: catches
/// a target that no longer builds and any crash its seeds or a short search
/// reach. The long runs are `cargo xtask fuzz`. It runs in the background
/// from the start, at a lower priority: its build has a target directory of
/// its own (`<target>/fuzz`: it never waits for another step's build, nor
/// makes one wait), so it fills the core that the Kubernetes build and the
/// image build's last, serial crates leave idle, and ends early in the e2e
/// legs (docs/e2e.md has the figures).
fn fuzz_smoke() -> Step {
    Step {
        background: true,
        nice: true,
        ..step(
            "fuzz-smoke",
            &[
                "xtask",
                "fuzz",
                "--time",
                &FUZZ_SMOKE_SECONDS.to_string(),
                // One target at a time: one core for the fuzzer, the other
                // for the steps beside it.
                "--parallel",
                "1",
            ],
        )
    }
}

fn steps() -> Vec<Step> {
    let mut steps = vec![step("fmt", &["fmt", "--all", "--check"]), fuzz_smoke()];
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
    // The end-to-end suite on local clusters of real components, with the
    // drivers just built for the image (so it tests what ships). First,
    // one release at a time, everything the legs build (helm, the GPU test
    // driver, the test binaries), so that the legs only run; then the legs
    // side by side, each its own cluster (own ports, state directories and
    // cgroups), each running `cargo test -p e2e` (the cluster proof test
    // with the host-process testbed, the scenarios) and printing its
    // figures and skips. Most of a leg is waiting (for the kubelet, the
    // scheduler, timeouts; one leg alone keeps about a fifth of 2 cores
    // busy), so side by side they take little more than the longest one,
    // and the checks that need no cluster ([`checks`]) run in a lane beside
    // them, on the cores the legs leave idle, instead of before them.
    let e2e_args = |version: &str, testbed: &str| -> Vec<String> {
        [
            "xtask",
            "e2e",
            "--cluster",
            "local",
            "--release",
            "--kubernetes",
            version,
            "--testbed",
            testbed,
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    for minor in CI_RELEASES {
        let version = format!("1.{minor}");
        let testbed = if minor == MAIN_MINOR { "all" } else { "host" };
        let mut args = e2e_args(&version, testbed);
        args.push("--prepare-only".into());
        steps.push(Step {
            args,
            ..step(&format!("e2e-prepare-{version}"), &[])
        });
    }
    for (minor, testbed) in e2e_matrix() {
        let version = format!("1.{minor}");
        let name = format!("e2e-{version}-{testbed}");
        steps.push(Step {
            args: e2e_args(&version, testbed),
            lane: Some(name.clone()),
            ..step(&name, &[])
        });
    }
    steps.extend(checks());
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
    let mut side_by_side_wall = Vec::new();
    let mut background = Vec::new();
    let mut pending = steps().into_iter().peekable();
    while let Some(first) = pending.next() {
        if first.background {
            background.push(lanes::spawn_background(
                first,
                scratch.clone(),
                work.clone(),
                started,
            ));
            continue;
        }
        let mut batch = vec![first];
        while batch[0].lane.is_some()
            && pending
                .peek()
                .is_some_and(|s| s.lane.is_some() && !s.background)
        {
            batch.extend(pending.next());
        }
        let t = Instant::now();
        let outcomes = if batch.len() == 1 {
            let step = batch.remove(0);
            let ok = run_step(&step, scratch.as_deref())?;
            vec![(step.name, ok, t.elapsed())]
        } else {
            let (lanes, outcomes) = lanes::run(batch, scratch.as_deref(), &work, args.keep_going)?;
            side_by_side_wall.push((lanes, t.elapsed()));
            outcomes
        };
        let ok = outcomes.iter().all(|o| o.1);
        results.extend(outcomes);
        // A background step that has already failed stops the run as a
        // failed step would (its outcome is collected below).
        let background_failed = background.iter().any(lanes::Background::failed);
        if (!ok || background_failed) && !args.keep_going {
            break;
        }
    }
    let mut background_ends = Vec::new();
    for b in background {
        let (outcome, ended) = b.join()?;
        background_ends.push((outcome.0.clone(), ended));
        results.push(outcome);
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
    for (lanes, wall) in side_by_side_wall {
        eprintln!(
            "ci: {lanes} lanes (the e2e legs, the checks) side by side in {:.0}s of wall time",
            wall.as_secs_f64()
        );
    }
    for (name, ended) in background_ends {
        eprintln!(
            "ci: {name} ran in the background, beside the steps after it, and ended {:.0}s into the run",
            ended.as_secs_f64()
        );
    }
    for line in e2e_summary(&work) {
        eprintln!("{line}");
    }
    // A side-by-side leg's output is interleaved with the others' and long:
    // what failed is repeated here, at the end, where a CI log's tail shows it.
    for name in &failed {
        let log = work.join(format!("ci-{name}.log"));
        if let Ok(text) = std::fs::read_to_string(&log) {
            eprintln!("ci: why {name} failed (from {}):", log.display());
            for line in failure_excerpt(&text) {
                eprintln!("ci: [{name}] {line}");
            }
        }
    }
    if !failed.is_empty() {
        bail!("ci failed: {}", failed.join(", "));
    }
    Ok(())
}

fn command_of(step: &Step, scratch: Option<&Path>) -> Command {
    let mut command = if step.program == "cargo" {
        crate::cargo_command::cargo()
    } else {
        Command::new(step.program)
    };
    command.args(&step.args).envs(step.env.iter().copied());
    if let Some(dir) = scratch {
        command.env("TMPDIR", dir);
    }
    if step.nice {
        command = niced(&command);
    }
    command
}

/// `command` run through `nice -n` [`NICE`], with the same environment
/// changes.
fn niced(command: &Command) -> Command {
    let mut niced = Command::new("nice");
    niced
        .arg("-n")
        .arg(NICE.to_string())
        .arg(command.get_program())
        .args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => niced.env(name, value),
            None => niced.env_remove(name),
        };
    }
    niced
}

fn announce(step: &Step) {
    eprintln!(
        "==> ci: {} ({} {})",
        step.name,
        step.program,
        step.args.join(" ")
    );
}

/// One step, its output streaming through.
fn run_step(step: &Step, scratch: Option<&Path>) -> Result<bool> {
    announce(step);
    let status = command_of(step, scratch)
        .status()
        .with_context(|| format!("starting step {}", step.name))?;
    Ok(status.success())
}

/// One line per release and testbed that ran: outcome counts and every skip
/// with its reason.
fn e2e_summary(work: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for (minor, testbed) in e2e_matrix() {
        let Ok(release) = e2e::Release::for_minor(minor) else {
            continue;
        };
        let version = release.version();
        // The testbed names are the figures files' suffixes.
        for suffix in [testbed] {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2e_legs_cover_both_releases_after_their_preparation() {
        let steps = steps();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        let legs: Vec<&Step> = steps
            .iter()
            .filter(|s| s.lane.is_some() && s.lane.as_deref() != Some(CHECKS_LANE))
            .collect();
        let main = format!("1.{MAIN_MINOR}");
        let oldest = format!("1.{}", CI_RELEASES[1]);
        let leg_names: Vec<&str> = legs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            leg_names,
            [
                format!("e2e-{main}-host"),
                format!("e2e-{main}-charts"),
                format!("e2e-{oldest}-host")
            ]
        );
        // The legs are neighbours (one batch), after every preparation and
        // the image build, before the chart checks.
        let first_leg = names.iter().position(|n| *n == leg_names[0]).unwrap();
        let positions: Vec<usize> = leg_names
            .iter()
            .map(|l| names.iter().position(|n| n == l).unwrap())
            .collect();
        assert_eq!(positions, [first_leg, first_leg + 1, first_leg + 2]);
        for before in [
            "image-build".to_string(),
            format!("e2e-prepare-{main}"),
            format!("e2e-prepare-{oldest}"),
        ] {
            let at = names.iter().position(|n| *n == before).unwrap();
            assert!(at < first_leg, "{before} must run before the legs");
        }
        // Each leg its own lane; the checks one lane after the legs, in the
        // same batch; the chart checks after the batch.
        for leg in &legs {
            assert_eq!(leg.lane.as_deref(), Some(leg.name.as_str()));
        }
        let checks: Vec<&str> = steps
            .iter()
            .filter(|s| s.lane.as_deref() == Some(CHECKS_LANE))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(
            checks,
            [
                "supply-chain",
                "docs-links",
                "clippy",
                "clippy-sdk",
                "doc",
                "test",
                "e2e-unit",
                "chart-scan"
            ]
        );
        let batch_end = first_leg + 3 + checks.len();
        assert!(steps[first_leg..batch_end].iter().all(|s| s.lane.is_some()));
        assert_eq!(names[batch_end], "charts");
        assert!(steps[..first_leg].iter().all(|s| s.lane.is_none()));
        assert_eq!(names[0], "fmt");
        // The checks give way to the legs; the legs and the steps on the
        // way to them run at normal priority.
        for s in &steps {
            assert_eq!(
                s.nice,
                s.lane.as_deref() == Some(CHECKS_LANE) || s.name == "fuzz-smoke",
                "{}",
                s.name
            );
        }
        // The fuzz smoke run is the one background step: right after fmt,
        // so it runs beside the Kubernetes and image builds.
        let background: Vec<&str> = steps
            .iter()
            .filter(|s| s.background)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(background, ["fuzz-smoke"]);
        assert_eq!(names[1], "fuzz-smoke");
        assert!(steps[1].lane.is_none());
        let prepare = steps
            .iter()
            .find(|s| s.name == format!("e2e-prepare-{main}"))
            .unwrap();
        assert!(prepare.args.iter().any(|a| a == "--prepare-only"));
        assert!(prepare.args.windows(2).any(|w| w == ["--testbed", "all"]));
        for leg in legs {
            assert!(!leg.args.iter().any(|a| a == "--prepare-only"));
        }
    }
}
