//! The metrics reference, from the registry a driver process builds
//! (`dra_core::testing::reference::register_every_metric` plus the
//! driver's own metrics): name, type, labels and the help text Prometheus
//! serves. A metric constructed in the source but missing from that
//! registry fails the check ([`constructor_sites`]).

use std::path::Path;

use anyhow::{Context, Result};
use prometheus::proto::{MetricFamily, MetricType};

use super::blocks::cell;

/// A table of `families` whose names `keep` accepts.
pub fn render(families: &[MetricFamily], keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::from("| metric | type | labels | what |\n|---|---|---|---|\n");
    for f in families.iter().filter(|f| keep(f.name())) {
        let kind = match f.get_field_type() {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        let labels: Vec<String> = f
            .get_metric()
            .first()
            .map(|m| {
                m.get_label()
                    .iter()
                    .map(|l| format!("`{}`", l.name()))
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {kind} | {} | {} |\n",
            f.name(),
            labels.join(", "),
            cell(f.help())
        ));
    }
    out
}

/// Where a metric is constructed: `Opts::new(`, `HistogramOpts::new(`,
/// `IntGauge::new(`, `IntCounter::new(`, `Gauge::new(`, `Counter::new(`
/// in the non-test Rust source under `src`. Test code is skipped: files
/// named `tests.rs`, `*_tests.rs` or `fuzz.rs`, directories named `tests`
/// or `testing`, and everything after a file's first `#[cfg(test)]` or
/// `#[test]`.
pub fn constructor_sites(src: &Path) -> Result<Vec<String>> {
    const CONSTRUCTORS: [&str; 6] = [
        "Opts::new(",
        "HistogramOpts::new(",
        "IntGauge::new(",
        "IntCounter::new(",
        "Gauge::new(",
        "Counter::new(",
    ];
    let mut sites = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if path.is_dir() {
                if name != "tests" && name != "testing" {
                    stack.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs")
                || name == "tests.rs"
                || name.ends_with("_tests.rs")
                || name == "fuzz.rs"
            {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let code = text
                .split("#[cfg(test)]")
                .next()
                .and_then(|t| t.split("#[test]").next())
                .unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                let trimmed = line.trim_start();
                if trimmed.starts_with("//") {
                    continue;
                }
                for c in CONSTRUCTORS {
                    for (at, _) in line.match_indices(c) {
                        let before = line[..at].chars().next_back();
                        if before.is_none_or(|b| !b.is_alphanumeric() && b != '_') {
                            sites.push(format!("{}:{}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
    }
    sites.sort();
    Ok(sites)
}
