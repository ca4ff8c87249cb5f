//! `cargo xtask fuzz [TARGET] [--time S]`: builds the libFuzzer targets of
//! `fuzz/` on the stable toolchain and runs each for a while.
//!
//! Why no cargo-fuzz: the coverage instrumentation libFuzzer needs is
//! stable rustc (`-Cpasses=sancov-module` and LLVM's sanitizer-coverage
//! options); only the sanitizers cargo-fuzz turns on by default need
//! nightly. So this builds the `fuzz/` workspace with those flags, links
//! libFuzzer through `libfuzzer-sys`, and needs nothing but cargo and a C++
//! compiler. Integer overflow checks and debug assertions stay on: without
//! AddressSanitizer (safe Rust does not need it) a panic is the crash.
//!
//! Each run starts from the committed seeds in `fuzz/corpus/<target>`;
//! what the fuzzer learns goes to a corpus under the target directory, and
//! a crashing input to `fuzz/artifacts/<target>/`. The summary gives the
//! executions and crashes per target, the figures `docs/reliability.md`
//! quotes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Every target in `fuzz/Cargo.toml`, in the order `cargo xtask fuzz` runs them.
const TARGETS: &[&str] = &[
    "authority",
    "uevent",
    "topology",
    "opaque_config",
    "checkpoint",
    "neuron_sysfs",
    "claim_resolution",
    "relay_connection",
    "efa_counters",
    "ops_http",
];

/// What turns on libFuzzer's coverage feedback on stable rustc.
const INSTRUMENTATION: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg=fuzzing",
];

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// One target (default: all of them, `--parallel` at a time).
    target: Option<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// Parallel builds (`cargo build -j`).
    #[arg(long, default_value_t = 2)]
    jobs: u32,
    /// Targets fuzzed at once (each is one process on one core).
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Only build the targets.
    #[arg(long)]
    build_only: bool,
}

struct Outcome {
    target: String,
    executions: u64,
    seconds: u64,
    crashed: bool,
}

pub fn run(args: FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = match &args.target {
        Some(t) if TARGETS.contains(&t.as_str()) => vec![t.as_str()],
        Some(t) => bail!(
            "unknown fuzz target {t}; the targets are {}",
            TARGETS.join(", ")
        ),
        None => TARGETS.to_vec(),
    };
    let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| PathBuf::from(d).join("fuzz"))
        .unwrap_or_else(|| fuzz_dir.join("target"));
    let host = host_triple()?;
    check_cxx()?;
    build(&fuzz_dir, &target_dir, &host, &targets, args.jobs)?;
    if args.build_only {
        return Ok(());
    }
    let mut outcomes = Vec::new();
    for chunk in targets.chunks(args.parallel.max(1)) {
        let results: Vec<Result<Outcome>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|target| {
                    let binary = target_dir.join(&host).join("release").join(target);
                    let (fuzz_dir, target_dir) = (&fuzz_dir, &target_dir);
                    scope.spawn(move || fuzz_one(fuzz_dir, target_dir, &binary, target, args.time))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| bail!("a fuzz runner thread panicked"))
                })
                .collect()
        });
        for r in results {
            outcomes.push(r?);
        }
    }
    println!(
        "\n{:<14} {:>8} {:>14} {:>10}  crashes",
        "target", "seconds", "executions", "exec/s"
    );
    for o in &outcomes {
        println!(
            "{:<14} {:>8} {:>14} {:>10}  {}",
            o.target,
            o.seconds,
            o.executions,
            o.executions / o.seconds.max(1),
            u8::from(o.crashed)
        );
    }
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.crashed)
        .map(|o| o.target.as_str())
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {} (inputs in fuzz/artifacts/)",
            crashed.join(", ")
        );
    }
    Ok(())
}

/// The host's target triple. Building for it explicitly keeps RUSTFLAGS
/// (the instrumentation) off build scripts and proc macros, which would
/// otherwise fail to link without libFuzzer.
fn host_triple() -> Result<String> {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no host triple")
}

/// libfuzzer-sys compiles LLVM's libFuzzer (C++) with the `cc` crate, which
/// takes `$CXX` or else `c++`: say so before cargo fails deep in a build
/// script on a machine without one.
fn check_cxx() -> Result<()> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    match Command::new(&cxx).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => bail!(
            "the fuzz targets need a C++ compiler for libFuzzer: `{cxx} --version` failed; \
             install one (e.g. g++ or clang) or point CXX at it"
        ),
    }
}

fn build(
    fuzz_dir: &Path,
    target_dir: &Path,
    host: &str,
    targets: &[&str],
    jobs: u32,
) -> Result<()> {
    let mut cmd = crate::cargo_command::cargo();
    cmd.current_dir(fuzz_dir)
        .args(["build", "--release", "--locked", "-j", &jobs.to_string()])
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--target", host])
        .env("RUSTFLAGS", INSTRUMENTATION.join(" "));
    for target in targets {
        cmd.args(["--bin", target]);
    }
    let status = cmd.status().context("running cargo build for fuzz/")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    Ok(())
}

fn fuzz_one(
    fuzz_dir: &Path,
    target_dir: &Path,
    binary: &Path,
    target: &str,
    seconds: u64,
) -> Result<Outcome> {
    let seeds = fuzz_dir.join("corpus").join(target);
    let corpus = target_dir.join("corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    println!("fuzzing {target} for {seconds} s");
    let output = Command::new(binary)
        .arg(&corpus)
        .arg(&seeds)
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        // A run must not outgrow a small machine, nor one input hang it.
        .arg("-rss_limit_mb=2048")
        .arg("-timeout=10")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let log = String::from_utf8_lossy(&output.stderr);
    let executions = stat(&log, "stat::number_of_executed_units")
        .with_context(|| format!("{target}: no execution count in libFuzzer's output:\n{log}"))?;
    let crashed = !output.status.success();
    if crashed {
        eprintln!("{log}");
    }
    Ok(Outcome {
        target: target.to_string(),
        executions,
        seconds,
        crashed,
    })
}

/// A `stat::name: value` line of libFuzzer's final stats.
fn stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .find_map(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_seeds_and_a_bin() {
        let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let manifest = std::fs::read_to_string(fuzz_dir.join("Cargo.toml")).unwrap();
        for target in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{target}\"")),
                "{target} missing from fuzz/Cargo.toml"
            );
            let seeds = std::fs::read_dir(fuzz_dir.join("corpus").join(target))
                .unwrap_or_else(|e| panic!("seed corpus of {target}: {e}"))
                .count();
            assert!(seeds > 0, "{target} has no seeds");
        }
    }

    #[test]
    fn reads_the_execution_count() {
        let log = "Done 1234 runs in 2 second(s)\nstat::number_of_executed_units: 1234\nstat::average_exec_per_sec:     617\n";
        assert_eq!(stat(log, "stat::number_of_executed_units"), Some(1234));
        assert_eq!(stat(log, "stat::missing"), None);
    }
}
