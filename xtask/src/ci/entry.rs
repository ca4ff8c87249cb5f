//! Tests of `.ci/run`, CI's entry point: it runs the commit in CI's own
//! checkout and target directory under `~/.cache/aws-dra/ci/`, so that a
//! warm run rebuilds only the crates whose files the commit changed (see the
//! script's header). What cargo does with the result is cargo's; these tests
//! check what the script promises: where it runs, which files keep their
//! times, that a dirty tree runs in place, and that the exit status is the
//! run's. The `cargo` on PATH here is a stand-in that reports what it saw.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::SystemTime;

    /// Reports the directory, the target directory and the modification
    /// times of two files, then exits with `$FAKE_RC`.
    const FAKE_CARGO: &str = r#"#!/usr/bin/env bash
{
  echo "args=$*"
  echo "pwd=$PWD"
  echo "target=$CARGO_TARGET_DIR"
  echo "lock_fd_open=$([[ -e /proc/self/fd/9 ]] && echo yes || echo no)"
  echo "kept=$(stat -c %Y.%y kept.txt)"
  echo "changed=$(stat -c %Y.%y changed.txt)"
} > "$REPORT"
exit "${FAKE_RC:-0}"
"#;

    struct Fixture {
        _dir: tempfile::TempDir,
        repo: PathBuf,
        home: PathBuf,
        bin: PathBuf,
        report: PathBuf,
    }

    fn git(repo: &Path, args: &[&str]) {
        let status = Command::new("git")
            .current_dir(repo)
            .args([
                "-c",
                "user.name=ci-test",
                "-c",
                "user.email=ci-test@example.invalid",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("clone");
        let home = dir.path().join("home");
        let bin = dir.path().join("bin");
        for d in [&repo, &home, &bin, &repo.join(".ci")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let script =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/run")).unwrap();
        write_exec(&repo.join(".ci/run"), &script);
        write_exec(&bin.join("cargo"), FAKE_CARGO);
        std::fs::write(repo.join("kept.txt"), "kept\n").unwrap();
        std::fs::write(repo.join("changed.txt"), "one\n").unwrap();
        std::fs::write(repo.join(".gitignore"), "/ignored\n").unwrap();
        git(&repo, &["init", "--quiet"]);
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "--quiet", "-m", "one"]);
        let report = dir.path().join("report");
        Fixture {
            _dir: dir,
            repo,
            home,
            bin,
            report,
        }
    }

    fn write_exec(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Runs `.ci/run` of the fixture; its exit code and the stand-in's report.
    fn run(f: &Fixture, rc: i32) -> (i32, std::collections::BTreeMap<String, String>) {
        run_with(f, rc, &[])
    }

    /// [`run`] with more variables in the script's environment.
    fn run_with(
        f: &Fixture,
        rc: i32,
        env: &[(&str, &str)],
    ) -> (i32, std::collections::BTreeMap<String, String>) {
        let _ = std::fs::remove_file(&f.report);
        let path = format!(
            "{}:{}",
            f.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new(f.repo.join(".ci/run"))
            .current_dir(&f.repo)
            .env("HOME", &f.home)
            .env("PATH", path)
            .env("REPORT", &f.report)
            .env("FAKE_RC", rc.to_string())
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("AWS_DRA_CI_TARGET_CAP_MIB")
            .env_remove("AWS_DRA_CI_MIN_FREE_MIB")
            .envs(env.iter().copied())
            .status()
            .unwrap();
        let report = std::fs::read_to_string(&f.report).unwrap_or_default();
        let fields = report
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (status.code().unwrap_or(-1), fields)
    }

    #[test]
    fn a_commit_runs_in_cis_checkout_and_only_changed_files_get_new_times() {
        let f = fixture();
        let ci = f.home.join(".cache/aws-dra/ci");
        let (rc, first) = run(&f, 0);
        assert_eq!(rc, 0);
        assert_eq!(first["args"], "xtask ci");
        assert_eq!(first["pwd"], ci.join("checkout").display().to_string());
        assert_eq!(first["target"], ci.join("target").display().to_string());
        // The run's processes do not hold CI's lock (a daemon left behind
        // would block every later run).
        assert_eq!(first["lock_fd_open"], "no");

        // Something a run leaves in the checkout is gone by the next one.
        std::fs::write(ci.join("checkout/ignored"), "left by a run").unwrap();
        std::fs::write(ci.join("checkout/untracked"), "left by a run").unwrap();
        // A new commit changes one file; the other keeps its time.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before = SystemTime::now();
        std::fs::write(f.repo.join("changed.txt"), "two\n").unwrap();
        git(&f.repo, &["commit", "--quiet", "-am", "two"]);
        let (rc, second) = run(&f, 0);
        assert_eq!(rc, 0);
        assert_eq!(
            second["kept"], first["kept"],
            "an unchanged file was touched"
        );
        assert_ne!(second["changed"], first["changed"]);
        let changed_secs: u64 = second["changed"]
            .split('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let before_secs = before
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(
            changed_secs >= before_secs,
            "a changed file must be newer than anything built before the run"
        );
        assert_eq!(
            std::fs::read_to_string(ci.join("checkout/changed.txt")).unwrap(),
            "two\n"
        );
        assert!(!ci.join("checkout/ignored").exists());
        assert!(!ci.join("checkout/untracked").exists());
    }

    #[test]
    fn a_target_directory_over_its_cap_or_on_a_full_disk_is_started_cold() {
        let f = fixture();
        let target = f.home.join(".cache/aws-dra/ci/target");
        let fill = |target: &Path| {
            std::fs::create_dir_all(target.join("debug/deps")).unwrap();
            std::fs::write(target.join("debug/deps/old-build"), vec![7u8; 3 << 20]).unwrap();
        };
        fill(&target);
        // Under the cap and with room on the disk: kept for a warm build.
        let (rc, report) = run_with(&f, 0, &[("AWS_DRA_CI_TARGET_CAP_MIB", "64")]);
        assert_eq!(rc, 0);
        assert_eq!(report["target"], target.display().to_string());
        assert!(target.join("debug/deps/old-build").exists());
        // Over the cap: gone before cargo starts.
        let (rc, _) = run_with(&f, 0, &[("AWS_DRA_CI_TARGET_CAP_MIB", "1")]);
        assert_eq!(rc, 0);
        assert!(!target.exists(), "a target directory over its cap was kept");
        // Under the cap, but less room on the disk than asked for.
        fill(&target);
        let (rc, _) = run_with(&f, 0, &[("AWS_DRA_CI_MIN_FREE_MIB", "999999999999")]);
        assert_eq!(rc, 0);
        assert!(
            !target.exists(),
            "a target directory on a full disk was kept"
        );
        // No target directory at all is no error.
        assert_eq!(run(&f, 0).0, 0);
    }

    #[test]
    fn the_exit_status_is_the_runs() {
        let f = fixture();
        assert_eq!(run(&f, 3).0, 3);
        assert_eq!(run(&f, 0).0, 0);
    }

    #[test]
    fn uncommitted_changes_run_in_place_with_the_shared_target() {
        let f = fixture();
        std::fs::write(f.repo.join("changed.txt"), "not committed\n").unwrap();
        let (rc, report) = run(&f, 0);
        assert_eq!(rc, 0);
        assert_eq!(report["pwd"], f.repo.display().to_string());
        assert_eq!(
            report["target"],
            f.home
                .join(".cache/aws-dra/cargo-target")
                .display()
                .to_string()
        );
        assert!(!f.home.join(".cache/aws-dra/ci/checkout").exists());
    }
}
