//! `cargo xtask ci`: the one command that says whether a change is good.
//!
//! Each step runs as its own process so its output streams as it comes; the
//! summary at the end names every step with its result and duration.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct CiArgs {
    /// Keep going after a failed step, to see every failure in one run.
    #[arg(long)]
    keep_going: bool,
}

struct Step {
    name: &'static str,
    program: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const STEPS: &[Step] = &[
    Step {
        name: "fmt",
        program: "cargo",
        args: &["fmt", "--all", "--check"],
        env: &[],
    },
    Step {
        name: "clippy",
        program: "cargo",
        args: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    Step {
        name: "doc",
        program: "cargo",
        args: &["doc", "--workspace", "--no-deps", "--locked"],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
    Step {
        name: "test",
        program: "cargo",
        args: &["test", "--workspace", "--exclude", "e2e", "--locked"],
        env: &[],
    },
    // Kubernetes, etcd and containerd from their Go modules (cached under
    // ~/.cache/aws-dra; seconds when warm, ~15 minutes cold on 2 cores).
    Step {
        name: "k8s-build",
        program: "cargo",
        args: &["xtask", "k8s", "build"],
        env: &[],
    },
    // The container image's compile step (same command as the Dockerfile).
    Step {
        name: "image-build",
        program: "cargo",
        args: crate::image::BUILD_ARGS,
        env: &[],
    },
    // The end-to-end suite on a local cluster of real components, with the
    // drivers just built for the image (so it tests what ships): builds helm
    // and the GPU test driver, runs `cargo test -p e2e` (cluster proof test +
    // the scenarios), prints the figures.
    Step {
        name: "e2e",
        program: "cargo",
        args: &["xtask", "e2e", "--cluster", "local", "--release"],
        env: &[],
    },
    Step {
        name: "charts",
        program: "cargo",
        args: &["xtask", "charts", "check"],
        env: &[],
    },
];

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
    let mut results: Vec<(&str, bool, Duration)> = Vec::new();
    let scratch = tmpfs_scratch();
    for step in STEPS {
        eprintln!(
            "==> ci: {} ({} {})",
            step.name,
            step.program,
            step.args.join(" ")
        );
        let t = Instant::now();
        let mut command = Command::new(step.program);
        command.args(step.args).envs(step.env.iter().copied());
        if let Some(dir) = &scratch {
            command.env("TMPDIR", dir);
        }
        let ok = command.status().map(|s| s.success())?;
        results.push((step.name, ok, t.elapsed()));
        if !ok && !args.keep_going {
            break;
        }
    }
    let failed: Vec<&str> = results.iter().filter(|r| !r.1).map(|r| r.0).collect();
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
    if !failed.is_empty() {
        bail!("ci failed: {}", failed.join(", "));
    }
    Ok(())
}
