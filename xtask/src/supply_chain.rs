//! `cargo xtask supply-chain`: licence, ban and source checks of the whole
//! dependency graph (the main workspace and `fuzz/`) against the policy in
//! `supply-chain.yaml`. It needs no service beyond the crate registry the
//! build uses anyway: `cargo metadata` fetches any crate source not yet in
//! cargo's cache (on a fresh machine, before the first build, criterion's
//! dev-dependencies are not there yet; `--offline` failed on exactly that).
//!
//! Why our own checker and not cargo-deny: the three checks are a pure
//! function of `cargo metadata --locked` (every package with its
//! SPDX `license`, its `source` and its manifest path), which cargo already
//! has; cargo-deny is not on the build machines, installing it means
//! building a few hundred crates from the network, and its advisory check
//! needs the network anyway. The policy file uses cargo-deny's section names
//! (`licenses`, `bans`, `sources`) so that moving to it later is a rename.
//!
//! What is checked:
//! - licences: every package's `license` expression (SPDX: `AND`, `OR`,
//!   `WITH`, parentheses; the old `/` as `OR`) must be satisfiable with the
//!   allowed licences alone; a package without one needs an exception;
//! - bans: no package of a banned name, whatever pulls it in;
//! - sources: crates.io only (no git, no other registry), and path
//!   dependencies only inside this repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The policy file, at the repository root.
pub const POLICY_FILE: &str = "supply-chain.yaml";

/// Workspaces whose graphs are checked (manifests relative to the root).
const MANIFESTS: &[&str] = &["Cargo.toml", "fuzz/Cargo.toml"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    licenses: Licenses,
    bans: Bans,
    sources: Sources,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Licenses {
    /// SPDX identifiers.
    allow: BTreeSet<String>,
    /// Packages accepted whatever their licence field says, with why.
    #[serde(default)]
    exceptions: Vec<Exception>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Exception {
    name: String,
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bans {
    #[serde(default)]
    deny: Vec<Ban>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ban {
    name: String,
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Sources {
    allow_registry: BTreeSet<String>,
    #[serde(default)]
    allow_git: BTreeSet<String>,
}

/// The part of `cargo metadata` the checks read.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    packages: Vec<Package>,
}

#[derive(Debug, Deserialize)]
struct Package {
    name: String,
    version: String,
    license: Option<String>,
    source: Option<String>,
    manifest_path: String,
}

/// What one check of one graph found.
#[derive(Debug, Default)]
pub struct Report {
    pub packages: usize,
    pub licenses: BTreeMap<String, usize>,
    pub problems: Vec<String>,
}

pub fn run() -> Result<()> {
    let root = crate::paths::repo_root();
    let policy_path = root.join(POLICY_FILE);
    let text = std::fs::read_to_string(&policy_path)
        .with_context(|| format!("reading {}", policy_path.display()))?;
    let policy: Policy = serde_saphyr::from_str(&text)
        .with_context(|| format!("parsing {}", policy_path.display()))?;
    let mut failed = false;
    for manifest in MANIFESTS {
        let metadata = metadata(&root.join(manifest))?;
        let report = check(&policy, &metadata, &root);
        println!(
            "supply-chain {manifest}: {} packages, {} distinct licence expressions, {} problems",
            report.packages,
            report.licenses.len(),
            report.problems.len()
        );
        for p in &report.problems {
            println!("  {p}");
        }
        failed |= !report.problems.is_empty();
    }
    if failed {
        bail!("supply-chain: the dependency graph breaks {POLICY_FILE} (see above)");
    }
    println!("supply-chain: licences, bans and sources as {POLICY_FILE} allows");
    Ok(())
}

fn metadata(manifest: &Path) -> Result<Metadata> {
    let out = crate::cargo_command::cargo()
        .args(["metadata", "--format-version", "1", "--locked"])
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata for {} failed: {}",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("decoding cargo metadata")
}

/// Every problem of `metadata` under `policy`; `root` bounds path deps.
pub fn check(policy: &Policy, metadata: &Metadata, root: &Path) -> Report {
    let mut report = Report {
        packages: metadata.packages.len(),
        ..Report::default()
    };
    let excepted: BTreeSet<&str> = policy
        .licenses
        .exceptions
        .iter()
        .filter(|e| !e.reason.trim().is_empty())
        .map(|e| e.name.as_str())
        .collect();
    let bans: BTreeMap<&str, &str> = policy
        .bans
        .deny
        .iter()
        .map(|b| (b.name.as_str(), b.reason.as_str()))
        .collect();
    for p in &metadata.packages {
        let id = format!("{} {}", p.name, p.version);
        let license = p.license.as_deref().unwrap_or("");
        *report
            .licenses
            .entry(
                if license.is_empty() {
                    "(none)"
                } else {
                    license
                }
                .to_string(),
            )
            .or_default() += 1;
        if !excepted.contains(p.name.as_str()) {
            match license_allowed(license, &policy.licenses.allow) {
                Ok(true) => {}
                Ok(false) => report.problems.push(format!(
                    "licence: {id} is `{license}`, not satisfiable with the allowed licences"
                )),
                Err(e) => report
                    .problems
                    .push(format!("licence: {id}: `{license}`: {e}")),
            }
        }
        if let Some(reason) = bans.get(p.name.as_str()) {
            report
                .problems
                .push(format!("ban: {id} is banned ({reason})"));
        }
        match p.source.as_deref() {
            None => {
                if !Path::new(&p.manifest_path).starts_with(root) {
                    report.problems.push(format!(
                        "source: {id} is a path dependency outside the repository ({})",
                        p.manifest_path
                    ));
                }
            }
            Some(source) => {
                let allowed = match source.split_once('+') {
                    Some(("registry" | "sparse", url)) => {
                        policy.sources.allow_registry.contains(url)
                    }
                    Some(("git", url)) => {
                        let repo = url.split(['?', '#']).next().unwrap_or(url);
                        policy.sources.allow_git.contains(repo)
                    }
                    _ => false,
                };
                if !allowed {
                    report.problems.push(format!(
                        "source: {id} comes from {source}, not an allowed source"
                    ));
                }
            }
        }
    }
    report
}

/// Whether the SPDX expression can be satisfied with `allow` alone.
fn license_allowed(expression: &str, allow: &BTreeSet<String>) -> Result<bool, String> {
    let tokens = tokenize(expression);
    if tokens.is_empty() {
        return Err("no licence given".into());
    }
    let mut parser = Parser {
        tokens: &tokens,
        at: 0,
        allow,
    };
    let value = parser.or_expr()?;
    if parser.at != tokens.len() {
        return Err(format!("unexpected `{}`", tokens[parser.at]));
    }
    Ok(value)
}

fn tokenize(expression: &str) -> Vec<String> {
    expression
        .replace('(', " ( ")
        .replace(')', " ) ")
        // The pre-SPDX `MIT/Apache-2.0` means either.
        .replace('/', " OR ")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

struct Parser<'a> {
    tokens: &'a [String],
    at: usize,
    allow: &'a BTreeSet<String>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Option<&str> {
        let t = self.tokens.get(self.at).map(String::as_str);
        self.at += 1;
        t
    }

    fn or_expr(&mut self) -> Result<bool, String> {
        let mut value = self.and_expr()?;
        while self.peek() == Some("OR") {
            self.at += 1;
            // Evaluate both sides: a syntax error anywhere is an error.
            let right = self.and_expr()?;
            value = value || right;
        }
        Ok(value)
    }

    fn and_expr(&mut self) -> Result<bool, String> {
        let mut value = self.with_expr()?;
        while self.peek() == Some("AND") {
            self.at += 1;
            let right = self.with_expr()?;
            value = value && right;
        }
        Ok(value)
    }

    fn with_expr(&mut self) -> Result<bool, String> {
        let value = self.primary()?;
        if self.peek() == Some("WITH") {
            self.at += 1;
            // An exception only adds permissions to the licence before it.
            match self.next() {
                Some(t) if !matches!(t, "(" | ")" | "AND" | "OR" | "WITH") => {}
                other => return Err(format!("WITH needs an exception id, got {other:?}")),
            }
        }
        Ok(value)
    }

    fn primary(&mut self) -> Result<bool, String> {
        let allow = self.allow;
        match self.next() {
            Some("(") => {
                let value = self.or_expr()?;
                match self.next() {
                    Some(")") => Ok(value),
                    other => Err(format!("expected `)`, got {other:?}")),
                }
            }
            Some(t) if !matches!(t, ")" | "AND" | "OR" | "WITH") => {
                // `GPL-2.0+`: "this version or later"; judged by the base id.
                Ok(allow.contains(t.trim_end_matches('+')))
            }
            other => Err(format!("expected a licence id, got {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow() -> BTreeSet<String> {
        ["MIT", "Apache-2.0", "Unicode-3.0", "ISC"]
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn licence_expressions() {
        let cases: &[(&str, Result<bool, ()>)] = &[
            ("MIT", Ok(true)),
            ("MIT OR Apache-2.0", Ok(true)),
            ("MIT/Apache-2.0", Ok(true)),
            ("Apache-2.0 / MIT", Ok(true)),
            ("GPL-3.0", Ok(false)),
            ("GPL-3.0 OR MIT", Ok(true)),
            ("GPL-3.0 AND MIT", Ok(false)),
            ("(MIT OR Apache-2.0) AND Unicode-3.0", Ok(true)),
            ("(MIT OR GPL-3.0) AND (LGPL-2.1 OR ISC)", Ok(true)),
            ("(MIT OR GPL-3.0) AND LGPL-2.1", Ok(false)),
            ("Apache-2.0 WITH LLVM-exception", Ok(true)),
            ("GPL-2.0 WITH Classpath-exception-2.0", Ok(false)),
            ("Apache-2.0+", Ok(true)),
            ("", Err(())),
            ("MIT OR", Err(())),
            ("(MIT", Err(())),
            ("MIT Apache-2.0", Err(())),
            ("MIT WITH", Err(())),
        ];
        for (expression, want) in cases {
            let got = license_allowed(expression, &allow()).map_err(|_| ());
            assert_eq!(got, *want, "{expression:?}");
        }
    }

    fn policy() -> Policy {
        serde_saphyr::from_str(
            r#"
licenses:
  allow: [MIT, Apache-2.0]
  exceptions:
    - name: odd-licence
      reason: licence file only; read and accepted
bans:
  deny:
    - name: openssl-sys
      reason: rustls only
sources:
  allow-registry: ["https://github.com/rust-lang/crates.io-index"]
"#,
        )
        .unwrap()
    }

    fn package(name: &str, license: Option<&str>, source: Option<&str>, path: &str) -> Package {
        Package {
            name: name.into(),
            version: "1.0.0".into(),
            license: license.map(str::to_string),
            source: source.map(str::to_string),
            manifest_path: path.into(),
        }
    }

    const CRATES_IO: &str = "registry+https://github.com/rust-lang/crates.io-index";

    #[test]
    fn every_kind_of_problem_is_named() {
        let metadata = Metadata {
            packages: vec![
                package("fine", Some("MIT"), Some(CRATES_IO), "/reg/fine/Cargo.toml"),
                package(
                    "ours",
                    Some("Apache-2.0"),
                    None,
                    "/repo/crates/ours/Cargo.toml",
                ),
                package("odd-licence", None, Some(CRATES_IO), "/reg/odd/Cargo.toml"),
                package(
                    "gpl",
                    Some("GPL-3.0"),
                    Some(CRATES_IO),
                    "/reg/gpl/Cargo.toml",
                ),
                package("bare", None, Some(CRATES_IO), "/reg/bare/Cargo.toml"),
                package(
                    "openssl-sys",
                    Some("MIT"),
                    Some(CRATES_IO),
                    "/reg/o/Cargo.toml",
                ),
                package(
                    "forked",
                    Some("MIT"),
                    Some("git+https://github.com/x/forked?rev=abc#abc"),
                    "/git/forked/Cargo.toml",
                ),
                package(
                    "outside",
                    Some("MIT"),
                    None,
                    "/elsewhere/outside/Cargo.toml",
                ),
            ],
        };
        let report = check(&policy(), &metadata, Path::new("/repo"));
        assert_eq!(report.packages, 8);
        assert_eq!(
            report.problems,
            vec![
                "licence: gpl 1.0.0 is `GPL-3.0`, not satisfiable with the allowed licences",
                "licence: bare 1.0.0: ``: no licence given",
                "ban: openssl-sys 1.0.0 is banned (rustls only)",
                "source: forked 1.0.0 comes from git+https://github.com/x/forked?rev=abc#abc, not an allowed source",
                "source: outside 1.0.0 is a path dependency outside the repository (/elsewhere/outside/Cargo.toml)",
            ]
        );
    }

    #[test]
    fn the_repository_policy_parses() {
        let text = std::fs::read_to_string(crate::paths::repo_root().join(POLICY_FILE)).unwrap();
        let policy: Policy = serde_saphyr::from_str(&text).unwrap();
        assert!(policy.licenses.allow.contains("Apache-2.0"));
        assert!(!policy.bans.deny.is_empty());
    }
}
