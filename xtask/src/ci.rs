//! `cargo xtask ci`: the one command that says whether a change is good.
//!
//! Each step runs as its own process so its output streams as it comes; the
//! summary at the end names every step with its result and duration. Each
//! step has a time limit ([`limit`]): one that runs out fails the step, and
//! CI says which step and which limit.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use local_cluster::versions::{CI_RELEASES, MAIN_MINOR};

mod checks;
mod entry;
mod excerpt;
mod lanes;
mod limit;
pub(crate) mod target_dir;
use checks::checks;
use excerpt::failure_excerpt;
use lanes::Outcome;

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
    /// Set for the step's process. A path in it is absolute (the
    /// process may run elsewhere: [`target_dir`]).
    env: Vec<(&'static str, OsString)>,
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
    /// Past this the step is stopped and fails ([`limit`]).
    limit: Duration,
}

/// The niceness of [`Step::nice`] steps. Cargo's and rustc's processes
/// inherit it. A nice-0 process weighs about nine times as much as one at
/// 10. That matters most to the charts leg, whose drivers run as pods: the
/// e2e clusters put every pod under `/aws-dra-e2e` (`crates/local-cluster/
/// src/cgroups.rs`), and on this cgroup v1 host that group sits beside CI's own
/// processes at the root of the `cpu` hierarchy and weighs as much as one
/// nice-0 process there, however many pods it holds.
const NICE: u32 = 10;

/// A cargo step with at most `limit_s` seconds to run. Each limit is a few
/// times the step's slowest measured run (docs/e2e.md: cold runs on this
/// 2-core machine, and warm ones with another build beside them), so only a
/// step that hangs or has outgrown its budget meets it.
fn step(name: &str, limit_s: u64, args: &[&str]) -> Step {
    Step {
        name: name.to_string(),
        program: "cargo",
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        lane: None,
        background: false,
        nice: false,
        limit: Duration::from_secs(limit_s),
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
/// (10 targets: 100 s of fuzzing, plus the build).
const FUZZ_SMOKE_SECONDS: u64 = 10;

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
        // Cold: 1,432 s in the background (a build of its own).
        ..step(
            "fuzz-smoke",
            3600,
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

/// Every step in its order; `target` is the absolute target directory the
/// steps' cargos build into ([`target_dir::resolve`]).
fn steps(target: &Path) -> Vec<Step> {
    let mut steps = vec![
        // What the machine needs that the project does not install (a few
        // seconds): every missing tool named at once, before any build.
        step("doctor", 300, &["xtask", "doctor"]),
        step("fmt", 300, &["fmt", "--all", "--check"]),
        fuzz_smoke(),
    ];
    // Kubernetes (every CI release), etcd and containerd from their Go
    // modules (cached under ~/.cache/aws-dra; seconds when warm, ~10 minutes
    // a release cold on 2 cores, up to ~1,700 s each with other work beside
    // it; the limit leaves room for every CI release built cold).
    let mut k8s = vec!["xtask", "k8s", "build"];
    let minors: Vec<String> = CI_RELEASES.iter().map(|m| format!("1.{m}")).collect();
    for m in &minors {
        k8s.extend(["--kubernetes", m.as_str()]);
    }
    steps.push(step("k8s-build", 7200, &k8s));
    // The container image's compile step (same command as the Dockerfile).
    // Cold: 521 s.
    steps.push(step("image-build", 1800, crate::image_build::BUILD_ARGS));
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
        // Cold: 193 s; 640 s behind another session's build.
        steps.push(Step {
            args,
            ..step(&format!("e2e-prepare-{version}"), 1800, &[])
        });
    }
    for (minor, testbed) in e2e_matrix() {
        let version = format!("1.{minor}");
        let name = format!("e2e-{version}-{testbed}");
        // The main release's host leg starts kind's whole node list at
        // bring-up (`AWS_DRA_E2E_NODES=kind`): a scenario that assumes which
        // nodes a testbed has beyond those it asks for fails here, as it
        // would on kind, without Docker (docs/e2e.md).
        let env = if minor == MAIN_MINOR && testbed == "host" {
            vec![(e2e::kind_host::NODES_ENV, OsString::from("kind"))]
        } else {
            Vec::new()
        };
        // Cold: 508 s (the charts leg); warm up to 575 s.
        steps.push(Step {
            args: e2e_args(&version, testbed),
            env,
            lane: Some(name.clone()),
            ..step(&name, 1800, &[])
        });
    }
    steps.extend(checks(target));
    steps.push(step("charts", 600, &["xtask", "charts", "check"]));
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
    let mut results: Vec<Outcome> = Vec::new();
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
    let target = target_dir::resolve();
    eprintln!("ci: target directory {}", target.display());
    let mut pending = steps(&target).into_iter().peekable();
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
            vec![run_step(&step, scratch.as_deref())?]
        } else {
            let (lanes, outcomes) = lanes::run(batch, scratch.as_deref(), &work, args.keep_going)?;
            side_by_side_wall.push((lanes, t.elapsed()));
            outcomes
        };
        let ok = outcomes.iter().all(|o| o.ok);
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
        background_ends.push((outcome.name.clone(), ended));
        results.push(outcome);
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.name.as_str())
        .collect();
    let summary: Vec<String> = results.iter().map(Outcome::summary).collect();
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
    let ran_out: Vec<String> = results
        .iter()
        .filter_map(|r| Some(limit::ran_out_message(&r.name, r.ran_out?)))
        .collect();
    for line in &ran_out {
        eprintln!("ci: {line}");
    }
    if !failed.is_empty() {
        bail!("ci failed: {}", failure_reasons(&results));
    }
    Ok(())
}

/// The failed steps, each that ran out with its limit.
fn failure_reasons(results: &[Outcome]) -> String {
    results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| match r.ran_out {
            Some(l) => format!("{} (ran out of its {}s limit)", r.name, l.as_secs()),
            None => r.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn command_of(step: &Step, scratch: Option<&Path>) -> Command {
    let mut command = if step.program == "cargo" {
        crate::cargo_command::cargo()
    } else {
        // A shell step's cargo sees what the cargo steps' cargos see: none
        // of the variables `cargo run` set for xtask, which would make it
        // rebuild ring and all above it (`crate::cargo_command`).
        let mut command = Command::new(step.program);
        for (name, value) in crate::cargo_command::cargo().get_envs() {
            if value.is_none() {
                command.env_remove(name);
            }
        }
        command
    };
    command
        .args(&step.args)
        .envs(step.env.iter().map(|(k, v)| (k, v)));
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
        "==> ci: {} ({} {}; limit {}s)",
        step.name,
        step.program,
        step.args.join(" "),
        step.limit.as_secs()
    );
}

/// One step, its output streaming through, within its limit.
fn run_step(step: &Step, scratch: Option<&Path>) -> Result<Outcome> {
    let started = Instant::now();
    announce(step);
    let mut child = command_of(step, scratch)
        .spawn()
        .with_context(|| format!("starting step {}", step.name))?;
    let (ok, ran_out) = wait_within_limit(step, &mut child)?;
    Ok(Outcome {
        name: step.name.clone(),
        ok,
        took: started.elapsed(),
        ran_out,
    })
}

/// Waits for `child`, the process of `step`, for at most the step's limit:
/// whether it succeeded, and the limit when it ran out (then it failed, and
/// it and everything it started were stopped).
fn wait_within_limit(
    step: &Step,
    child: &mut std::process::Child,
) -> Result<(bool, Option<Duration>)> {
    let ended = limit::watch(
        &mut limit::StepProcess(child),
        step.limit,
        &mut limit::WallClock::start(),
    )
    .with_context(|| format!("waiting for step {}", step.name))?;
    Ok(match ended {
        limit::Ended::Exited(ok) => (ok, None),
        limit::Ended::RanOut => {
            eprintln!("==> ci: {}", limit::ran_out_message(&step.name, step.limit));
            (false, Some(step.limit))
        }
    })
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
            if !f.enabled.is_empty() {
                out.push(format!("ci:     turned on at bring-up: {}", f.enabled));
            }
            for (name, why) in &f.skipped {
                out.push(format!("ci:     skipped {name}: {why}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
