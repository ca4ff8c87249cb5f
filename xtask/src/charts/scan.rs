//! `cargo xtask charts scan`: a third-party scanner's verdict on the charts.
//!
//! Runs checkov (Prisma Cloud's policy scanner, from PyPI, pinned to
//! [`CHECKOV_VERSION`]) on each driver chart rendered twice: with its
//! default values, and pinned by digest (`image.digest` set, the one value
//! docs/install.md asks production installs to add). It fails when a check
//! fails that [`ACCEPTED`] does not list with its reason, or when either
//! rendering fails more than [`MAX_FAILED`] checks (the namespace check
//! aside: it judges the namespace the user installs into, not the chart).
//! The defaults fail the two digest checks ([`DIGEST_CHECKS`]) that the
//! pinned rendering passes: the chart cannot know the digest of the image
//! you will run. The same
//! list, with the same reasons, is in docs/install.md, because a user's own
//! scanner reports these.
//!
//! checkov is installed by this module, once, into a virtual environment
//! under the project cache (`~/.cache/aws-dra/checkov/<version>/`), with the
//! machine's `python3` and `pip`; nothing else on the machine changes. A
//! cached environment that reports another version is rebuilt. Limits:
//! needs `python3` with the `venv` module and PyPI on first use; only the
//! top-level package is pinned (pip resolves its dependencies).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::charts::expect::{NAMESPACE, RELEASE};
use crate::charts::render::render;
use crate::charts::specs::CHARTS;
use crate::helm::Helm;

/// The checkov release the scan is pinned to.
pub const CHECKOV_VERSION: &str = "3.3.30";

/// Most failed checks a chart may have (the namespace check aside).
pub const MAX_FAILED: usize = 4;

/// checkov's "default namespace" check: it judges where the user installs
/// the release, which the chart does not choose.
const NAMESPACE_CHECK: &str = "CKV_K8S_21";

/// The checks that pass once `image.digest` is set.
pub const DIGEST_CHECKS: &[&str] = &["CKV_K8S_43", "CKV_K8S_15"];

/// Checks the charts fail on purpose, each with the reason (kept in step
/// with docs/install.md, "What a scanner reports", by a test).
pub const ACCEPTED: &[(&str, &str)] = &[
    (
        "CKV_K8S_43",
        "image by digest: the chart cannot know the digest of the image you run; set image.digest",
    ),
    (
        "CKV_K8S_15",
        "pull policy Always: with a tag, IfNotPresent lets a node-critical daemon restart while the registry is unreachable; passes with image.digest",
    ),
    (
        "CKV_K8S_23",
        "root: the driver writes root-owned host directories (kubelet plugin and registry dirs, CDI dir); as their owner it needs no capability, a non-root UID would need CAP_DAC_OVERRIDE",
    ),
    (
        "CKV_K8S_40",
        "high UID: same reason as the root check; the process runs as UID 0 with every capability dropped",
    ),
];

/// A digest for the pinned rendering (any well-formed one does).
const SCAN_DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

pub fn scan(helm: &Helm, root: &Path) -> Result<()> {
    let started = Instant::now();
    let checkov = ensure_checkov()?;
    // Not tempfile's default `.tmp…`: checkov skips hidden directories.
    let tmp = tempfile::Builder::new().prefix("aws-dra-scan-").tempdir()?;
    let pinned_values = tmp.path().join("pinned-values.yaml");
    std::fs::write(&pinned_values, format!("image:\n  digest: {SCAN_DIGEST}\n"))?;
    // Every rendering in one directory, scanned by one checkov run (its
    // start-up is most of the time); the report names each finding's file.
    let scanned = tmp.path().join("rendered");
    std::fs::create_dir(&scanned)?;
    let mut renderings = Vec::new();
    for spec in CHARTS {
        for (label, values, pinned) in [
            ("defaults", vec![], false),
            ("pinned by digest", vec![pinned_values.clone()], true),
        ] {
            let yaml = render(helm, root, spec, RELEASE, NAMESPACE, &values, None)?;
            let file = format!(
                "{}-{}.yaml",
                spec.name,
                if pinned { "pinned" } else { "defaults" }
            );
            std::fs::write(scanned.join(&file), &yaml)?;
            renderings.push((spec.name, label, pinned, file));
        }
    }
    let report = run_checkov(&checkov, &scanned)?;
    let mut failures = Vec::new();
    for (chart, label, pinned, file) in renderings {
        let failed = failed_checks(&report, &file)?;
        let passed = passed_count(&report, &file);
        let ids: Vec<&str> = failed.keys().map(String::as_str).collect();
        eprintln!(
            "==> charts scan: {chart} ({label}), checkov {CHECKOV_VERSION}: {passed} passed, {} failed: {ids:?}",
            ids.len()
        );
        if let Err(e) = judge(&failed, pinned) {
            failures.push(format!("{chart} ({label}): {e:#}"));
        }
    }
    ensure!(failures.is_empty(), "charts scan: {}", failures.join("; "));
    eprintln!(
        "==> charts scan: every failed check accepted and explained, at most {MAX_FAILED} per chart, in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// checkov's JSON report on the rendered files of `dir`.
fn run_checkov(checkov: &Path, dir: &Path) -> Result<Value> {
    let out = Command::new(checkov)
        .args(["--framework", "kubernetes", "--output", "json"])
        .args(["--skip-download", "--directory"])
        .arg(dir)
        // No calls to the vendor's platform: the scan runs offline.
        .env("BC_SKIP_MAPPING", "TRUE")
        .output()
        .with_context(|| format!("running {}", checkov.display()))?;
    // checkov exits 1 when a check fails: the JSON says which.
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "checkov printed no JSON report ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Whether a finding is about `file` (checkov gives `/<file>` relative to
/// the scanned directory).
fn in_file(check: &Value, file: &str) -> bool {
    check["file_path"]
        .as_str()
        .is_some_and(|p| p.trim_start_matches('/') == file)
}

/// Checks that passed on `file`.
fn passed_count(report: &Value, file: &str) -> usize {
    report["results"]["passed_checks"]
        .as_array()
        .map_or(0, |c| c.iter().filter(|c| in_file(c, file)).count())
}

/// Failed check id -> the resources of `file` it failed on.
fn failed_checks(report: &Value, file: &str) -> Result<BTreeMap<String, Vec<String>>> {
    let checks = report["results"]["failed_checks"]
        .as_array()
        .context("checkov report without results.failed_checks")?;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in checks.iter().filter(|c| in_file(c, file)) {
        let id = c["check_id"]
            .as_str()
            .context("failed check without check_id")?;
        let resource = c["resource"].as_str().unwrap_or("?");
        out.entry(id.to_owned())
            .or_default()
            .push(resource.to_owned());
    }
    Ok(out)
}

/// The namespace check aside: every failure accepted; pinned by digest,
/// neither digest check failing and at most [`MAX_FAILED`] in all.
fn judge(failed: &BTreeMap<String, Vec<String>>, pinned: bool) -> Result<()> {
    let counted: Vec<&String> = failed.keys().filter(|k| *k != NAMESPACE_CHECK).collect();
    let unexplained: Vec<String> = counted
        .iter()
        .filter(|id| {
            !ACCEPTED.iter().any(|(a, _)| *a == id.as_str())
                || (pinned && DIGEST_CHECKS.contains(&id.as_str()))
        })
        .map(|id| format!("{id} on {:?}", failed[*id]))
        .collect();
    ensure!(
        unexplained.is_empty(),
        "checks failed that the chart does not fail on purpose (fix the chart, or add the check with its reason to charts::scan::ACCEPTED and docs/install.md): {unexplained:?}"
    );
    ensure!(
        counted.len() <= MAX_FAILED,
        "{} checks failed, at most {MAX_FAILED} allowed: {counted:?}",
        counted.len()
    );
    Ok(())
}

/// The checkov executable of the pinned version, installed on first use.
fn ensure_checkov() -> Result<PathBuf> {
    let dir = crate::helm::cache_root()?
        .join("checkov")
        .join(CHECKOV_VERSION);
    let venv = dir.join("venv");
    let bin = venv.join("bin").join("checkov");
    // Written last: an interrupted install lacks it and is redone. (The
    // venv is built in place: its scripts name their interpreter by
    // absolute path, so it cannot be built elsewhere and renamed.)
    let done = dir.join("installed");
    if done.is_file() && reports_version(&bin) {
        return Ok(bin);
    }
    let _ = std::fs::remove_file(&done);
    let _ = std::fs::remove_dir_all(&venv);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "==> charts scan: installing checkov {CHECKOV_VERSION} from PyPI into {} (first time only; a few minutes)",
        dir.display()
    );
    let started = Instant::now();
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .context("creating a Python virtual environment (needs python3 with venv)")?;
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("checkov=={CHECKOV_VERSION}")))
    .context("installing checkov from PyPI")?;
    ensure!(
        reports_version(&bin),
        "freshly installed {} does not report {CHECKOV_VERSION}",
        bin.display()
    );
    std::fs::write(&done, CHECKOV_VERSION)?;
    eprintln!(
        "==> charts scan: installed checkov in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(bin)
}

fn reports_version(bin: &Path) -> bool {
    Command::new(bin).arg("--version").output().is_ok_and(|o| {
        o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == CHECKOV_VERSION
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed ({status})", cmd.get_program());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(ids: &[&str]) -> BTreeMap<String, Vec<String>> {
        ids.iter()
            .map(|i| ((*i).to_owned(), vec!["DaemonSet.aws-dra.dra".to_owned()]))
            .collect()
    }

    #[test]
    fn only_accepted_checks_may_fail_and_few_of_them() {
        let inherent = ["CKV_K8S_23", "CKV_K8S_40", NAMESPACE_CHECK];
        let mut defaults = inherent.to_vec();
        defaults.extend(DIGEST_CHECKS);
        judge(&failed(&[]), true).unwrap();
        judge(&failed(&inherent), true).unwrap();
        judge(&failed(&defaults), false).unwrap();
        // A digest check failing though a digest was given.
        let e = format!("{:#}", judge(&failed(&defaults), true).unwrap_err());
        assert!(e.contains("CKV_K8S_43 on"), "{e}");
        // A check nobody explained, with or without a digest.
        for pinned in [false, true] {
            let e = format!("{:#}", judge(&failed(&["CKV_K8S_11"]), pinned).unwrap_err());
            assert!(e.contains("CKV_K8S_11 on"), "{e}");
        }
        assert!(ACCEPTED.len() <= MAX_FAILED);
        // The token check is passed by mounting the token explicitly.
        let e = format!("{:#}", judge(&failed(&["CKV_K8S_38"]), false).unwrap_err());
        assert!(e.contains("CKV_K8S_38 on"), "{e}");
        for d in DIGEST_CHECKS {
            assert!(ACCEPTED.iter().any(|(a, _)| a == d), "{d}");
        }
    }

    #[test]
    fn a_report_is_read_by_file_and_check_id() {
        let report = serde_json::json!({
            "results": {
                "failed_checks": [
                    {"check_id": "CKV_K8S_43", "file_path": "/a.yaml", "resource": "DaemonSet.ns.a"},
                    {"check_id": "CKV_K8S_43", "file_path": "/b.yaml", "resource": "DaemonSet.ns.b"},
                    {"check_id": "CKV_K8S_23", "file_path": "/a.yaml", "resource": "DaemonSet.ns.a"}
                ],
                "passed_checks": [
                    {"check_id": "CKV_K8S_11", "file_path": "/a.yaml"},
                    {"check_id": "CKV_K8S_11", "file_path": "/b.yaml"}
                ]
            }
        });
        let a = failed_checks(&report, "a.yaml").unwrap();
        assert_eq!(a.keys().collect::<Vec<_>>(), ["CKV_K8S_23", "CKV_K8S_43"]);
        assert_eq!(a["CKV_K8S_43"], ["DaemonSet.ns.a"]);
        assert_eq!(failed_checks(&report, "b.yaml").unwrap().len(), 1);
        assert_eq!(passed_count(&report, "a.yaml"), 1);
        assert!(failed_checks(&serde_json::json!({}), "a.yaml").is_err());
    }

    /// docs/install.md names every accepted check, so users know why each
    /// stays.
    #[test]
    fn install_docs_list_every_accepted_check() {
        let docs = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/install.md"),
        )
        .unwrap();
        for (id, _) in ACCEPTED {
            assert!(
                docs.contains(id),
                "{id} is not explained in docs/install.md"
            );
        }
        assert!(docs.contains(CHECKOV_VERSION));
    }
}
