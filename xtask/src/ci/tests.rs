//! The order, lanes, priorities and limits of CI's steps, and how a failure
//! is reported.

use std::path::PathBuf;

use super::checks::CHECKS_LANE;
use super::*;

#[test]
fn e2e_legs_cover_every_ci_release_after_their_preparation() {
    let steps = steps(Path::new("/t/target"));
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    let legs: Vec<&Step> = steps
        .iter()
        .filter(|s| s.lane.is_some() && s.lane.as_deref() != Some(CHECKS_LANE))
        .collect();
    let main = format!("1.{MAIN_MINOR}");
    // Every CI release on the host-process testbed, the main one on the
    // charts' testbed too, right after its host leg.
    let mut expected = Vec::new();
    for minor in CI_RELEASES {
        expected.push(format!("e2e-1.{minor}-host"));
        if minor == MAIN_MINOR {
            expected.push(format!("e2e-{main}-charts"));
        }
    }
    let leg_names: Vec<&str> = legs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(leg_names, expected);
    assert_eq!(
        leg_names[..2],
        [format!("e2e-{main}-host"), format!("e2e-{main}-charts")]
    );
    // The legs are neighbours (one batch), after every preparation and
    // the image build, before the chart checks.
    let first_leg = names.iter().position(|n| *n == leg_names[0]).unwrap();
    let positions: Vec<usize> = leg_names
        .iter()
        .map(|l| names.iter().position(|n| n == l).unwrap())
        .collect();
    let contiguous: Vec<usize> = (first_leg..first_leg + legs.len()).collect();
    assert_eq!(positions, contiguous);
    let mut before = vec!["image-build".to_string()];
    before.extend(CI_RELEASES.iter().map(|m| format!("e2e-prepare-1.{m}")));
    for before in before {
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
            "docs",
            "clippy",
            "fmt-fuzz",
            "clippy-fuzz",
            "clippy-sdk",
            "doc",
            "test",
            "e2e-unit",
            "kubectl-dra-release",
            "chart-scan"
        ]
    );
    let batch_end = first_leg + legs.len() + checks.len();
    assert!(steps[first_leg..batch_end].iter().all(|s| s.lane.is_some()));
    assert_eq!(names[batch_end], "charts");
    assert!(steps[..first_leg].iter().all(|s| s.lane.is_none()));
    assert_eq!(names[..2], ["doctor", "fmt"]);
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
    // The fuzz smoke run is the one background step: right after doctor and fmt,
    // so it runs beside the Kubernetes and image builds.
    let background: Vec<&str> = steps
        .iter()
        .filter(|s| s.background)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(background, ["fuzz-smoke"]);
    assert_eq!(names[2], "fuzz-smoke");
    assert!(steps[2].lane.is_none());
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

#[test]
fn every_step_has_a_limit_and_the_cold_builds_generous_ones() {
    let steps = steps(Path::new("/t/target"));
    for s in &steps {
        assert!(
            s.limit >= Duration::from_secs(300),
            "{}: {:?} leaves no room for a loaded machine",
            s.name,
            s.limit
        );
        assert!(
            s.limit <= Duration::from_secs(2 * 3600),
            "{}: {:?} is no limit",
            s.name,
            s.limit
        );
    }
    let limit_of = |name: &str| steps.iter().find(|s| s.name == name).unwrap().limit;
    // Each release of Kubernetes takes up to ~1,700 s to build cold.
    let releases = u32::try_from(CI_RELEASES.len()).unwrap();
    assert!(limit_of("k8s-build") >= Duration::from_secs(1700) * releases);
    // The cold figures of docs/e2e.md, with room to spare.
    for (name, cold_s) in [
        ("fuzz-smoke", 1432),
        ("image-build", 521),
        ("clippy", 337),
        ("test", 253),
    ] {
        assert!(
            limit_of(name) >= Duration::from_secs(2 * cold_s),
            "{name}: {:?}",
            limit_of(name)
        );
    }
}

#[test]
fn a_failure_names_each_step_and_the_limit_it_ran_out_of() {
    let outcome = |name: &str, ok, ran_out: Option<u64>| Outcome {
        name: name.into(),
        ok,
        took: Duration::from_secs(1),
        ran_out: ran_out.map(Duration::from_secs),
    };
    let results = [
        outcome("fmt", true, None),
        outcome("clippy", false, None),
        outcome("e2e-1.37-host", false, Some(1800)),
    ];
    assert_eq!(
        failure_reasons(&results),
        "clippy, e2e-1.37-host (ran out of its 1800s limit)"
    );
    assert_eq!(
        results[2].summary(),
        "e2e-1.37-host RAN OUT of its 1800s limit (1s)"
    );
    assert_eq!(results[1].summary(), "clippy FAILED (1s)");
}

/// The target directory cargo reports for this working tree with
/// `CARGO_TARGET_DIR` unset, read here without [`target_dir`]'s code.
fn metadata_target_without_env() -> PathBuf {
    let out = crate::cargo_command::cargo()
        .current_dir(crate::paths::repo_root())
        .env_remove("CARGO_TARGET_DIR")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    PathBuf::from(v["target_directory"].as_str().unwrap())
}

/// The steps as `cargo xtask ci` builds them in this working tree run as
/// the README gives it: from the workspace root, no `CARGO_TARGET_DIR`.
fn steps_as_the_readme_runs_them() -> (PathBuf, Vec<Step>) {
    let root = crate::paths::repo_root();
    let mut cargo = crate::cargo_command::cargo();
    cargo.current_dir(&root).env_remove("CARGO_TARGET_DIR");
    let target = target_dir::resolve_with(cargo, None, &root);
    let steps = steps(&target);
    (target, steps)
}

/// The words of `text` that could be paths.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '=' | ';'))
        .filter(|w| !w.is_empty())
}

#[test]
fn every_path_a_step_hands_on_under_the_target_directory_is_absolute() {
    let (target, steps) = steps_as_the_readme_runs_them();
    let cargos = metadata_target_without_env();
    assert_eq!(target, cargos);
    assert!(target.is_absolute(), "{}", target.display());
    let mut named = Vec::new();
    for s in &steps {
        let env = s
            .env
            .iter()
            .map(|(k, v)| (format!("env {k}"), v.to_string_lossy().into_owned()));
        let args = s
            .args
            .iter()
            .map(|a| ("an argument".to_string(), a.clone()));
        for (what, text) in env.chain(args) {
            // A shell expanding it leaves the path relative where it is unset.
            assert!(
                !text.contains("CARGO_TARGET_DIR"),
                "{}: {what} {text:?} leaves the target directory to a shell",
                s.name
            );
            for word in words(&text) {
                let path = Path::new(word);
                if path.starts_with(&target) || path.components().any(|c| c.as_os_str() == "target")
                {
                    assert!(
                        path.is_absolute() && path.starts_with(&target),
                        "{}: {what} names {word}, not an absolute path under {}",
                        s.name,
                        target.display()
                    );
                    named.push((s.name.as_str(), path.to_path_buf()));
                }
            }
        }
    }
    // Not a vacuous check: the release binary of kubectl-dra is one such
    // path, where cargo's release build of this tree puts it.
    let binary = cargos.join("release").join("kubectl-dra");
    assert!(
        named.contains(&("kubectl-dra-release", binary.clone())),
        "{named:?}"
    );
    // The target directory exists, or will with the first build.
    assert!(
        cargos.exists() || cargos.parent().is_some_and(Path::exists),
        "{}",
        cargos.display()
    );
}

#[test]
fn the_release_cli_step_hands_its_tests_a_binary_they_find_from_their_directory() {
    let (target, steps) = steps_as_the_readme_runs_them();
    let step = steps
        .iter()
        .find(|s| s.name == "kubectl-dra-release")
        .unwrap();
    // A stand-in cargo, as `$CARGO` and on PATH, writes down each call.
    let scratch = tempfile::tempdir().unwrap();
    let bin = scratch.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("cargo");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"$KUBECTL_DRA_BIN|$CARGO_PKG_NAME|$*\" >> \"$REPORT\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let report = scratch.path().join("report");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let package = crate::paths::repo_root().join("crates/kubectl-dra");
    let status = command_of(step, None)
        .current_dir(&package)
        .env("CARGO", &fake)
        .env("PATH", path)
        .env("REPORT", &report)
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .unwrap();
    assert!(status.success());
    let calls = std::fs::read_to_string(&report).unwrap();
    let calls: Vec<Vec<&str>> = calls.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0][2].starts_with("build --release"), "{calls:?}");
    assert!(calls[1][2].starts_with("test "), "{calls:?}");
    // `cargo test` runs the test in the package's directory: from there the
    // path must still name the release binary.
    let given = Path::new(calls[1][0]);
    assert_eq!(
        package.join(given),
        target.join("release").join("kubectl-dra"),
        "{calls:?}"
    );
    // And the shell's cargo does not see what `cargo run` set for xtask
    // (`cargo test` sets the same for this test).
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    assert_eq!(calls[1][1], "", "{calls:?}");
}
