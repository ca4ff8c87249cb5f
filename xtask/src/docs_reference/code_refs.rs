//! Names of code in prose, checked: a page that states an order or a rule
//! names the code it describes as `` `path/to/file.rs::item` `` (the path
//! from the repository root, or a unique-enough end of it such as
//! `daemon/runtime.rs`), and the item (a fn, struct, enum, trait, const,
//! static, type, mod or macro) must be defined in that file. Backticked
//! repository paths (`crates/dra-core/src/prepare/`, `prepare/metrics.rs`,
//! `health.rs`) must exist. A renamed step or a moved file then fails CI
//! instead of leaving the doc behind.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};

/// Files and directories of the repository, relative, `/`-separated.
pub struct Repo {
    root: std::path::PathBuf,
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Repo {
    /// The files git knows (tracked, and untracked ones it does not ignore).
    pub fn from_git(root: &Path) -> Result<Self> {
        let out = std::process::Command::new("git")
            .args(["ls-files", "--cached", "--others", "--exclude-standard"])
            .current_dir(root)
            .output()
            .context("running git ls-files")?;
        anyhow::ensure!(out.status.success(), "git ls-files failed");
        let list = String::from_utf8_lossy(&out.stdout);
        Ok(Self::from_list(
            root,
            list.lines().filter(|f| root.join(f).exists()),
        ))
    }

    pub fn from_list<'a>(root: &Path, files: impl Iterator<Item = &'a str>) -> Self {
        let mut repo = Repo {
            root: root.to_path_buf(),
            files: BTreeSet::new(),
            dirs: BTreeSet::new(),
        };
        for f in files {
            let mut dir = f;
            while let Some((parent, _)) = dir.rsplit_once('/') {
                repo.dirs.insert(parent.to_owned());
                dir = parent;
            }
            repo.files.insert(f.to_owned());
        }
        repo
    }

    /// Files whose path is `path` or ends with `/path`.
    fn files_matching(&self, path: &str) -> Vec<&String> {
        let tail = format!("/{path}");
        self.files
            .iter()
            .filter(|f| *f == path || f.ends_with(&tail))
            .collect()
    }

    fn exists(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        let tail = format!("/{path}");
        self.files.contains(path)
            || self.dirs.contains(path)
            || self.files.iter().any(|f| f.ends_with(&tail))
            || self.dirs.iter().any(|d| d.ends_with(&tail))
    }
}

/// Top-level entries a backticked path may start with to count as ours.
const TOP: [&str; 11] = [
    "crates/",
    "docs/",
    "charts/",
    "xtask/",
    "e2e/",
    "examples/",
    "fuzz/",
    "proto/",
    ".ci/",
    "README.md",
    "CONTRIBUTING.md",
];
/// Extensions that make a backticked word with a `/` (or a bare `x.rs`)
/// a file of ours.
const EXTENSIONS: [&str; 5] = [".rs", ".md", ".tpl", ".go", ".proto"];

/// What a backticked span is, if anything this check reads.
#[derive(Debug, PartialEq, Eq)]
pub enum Span<'a> {
    Code { path: &'a str, item: &'a str },
    Path(&'a str),
}

pub fn classify(span: &str) -> Option<Span<'_>> {
    if span.is_empty()
        || span.starts_with('/')
        || span.contains("://")
        || span
            .chars()
            .any(|c| c.is_whitespace() || "<>*{}$~…[]()=,'\"".contains(c))
    {
        return None;
    }
    if let Some((path, item)) = span.split_once(".rs::") {
        let ident = !item.is_empty()
            && item.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !item.starts_with(|c: char| c.is_ascii_digit());
        return ident.then_some(Span::Code {
            path: &span[..path.len() + 3],
            item,
        });
    }
    // `::` other than a file's item is a Rust path; `target/` is a build
    // output no clone has.
    if span.contains("::") || span.split('/').any(|s| s == "target") {
        return None;
    }
    let ours_by_place = TOP.iter().any(|t| span.starts_with(t));
    // A bare file name is ours only as Rust source (`health.rs`); other
    // bare names are as often upstream's (kubelet's `*.go`).
    let ours_by_kind = EXTENSIONS
        .iter()
        .any(|e| span.ends_with(e) && (*e == ".rs" || span.contains('/')))
        && span
            .chars()
            .all(|c| c.is_alphanumeric() || "_-./".contains(c));
    (ours_by_place || ours_by_kind).then_some(Span::Path(span))
}

/// Whether `text` (Rust source) defines `item`.
fn defines(text: &str, item: &str) -> bool {
    [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "const ",
        "static ",
        "type ",
        "mod ",
        "macro_rules! ",
    ]
    .iter()
    .any(|kw| {
        let needle = format!("{kw}{item}");
        text.match_indices(&needle).any(|(at, _)| {
            let after = text[at + needle.len()..].chars().next();
            let before = text[..at].chars().next_back();
            after.is_none_or(|c| !c.is_alphanumeric() && c != '_')
                && before.is_none_or(|c| !c.is_alphanumeric() && c != '_')
        })
    })
}

/// Every broken name in `markdown` (the page `page`), one line each;
/// and how many names were checked.
pub fn check_page(repo: &Repo, page: &str, markdown: &str) -> Result<(Vec<String>, usize)> {
    let mut broken = Vec::new();
    let mut checked = 0;
    let mut fenced = false;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let at = format!("{page}:{}", n + 1);
            match classify(span) {
                Some(Span::Code { path, item }) => {
                    checked += 1;
                    let files = repo.files_matching(path);
                    if files.is_empty() {
                        broken.push(format!("{at}: `{span}`: no file {path}"));
                        continue;
                    }
                    let mut found = false;
                    for f in &files {
                        let text = std::fs::read_to_string(repo.root.join(f))
                            .with_context(|| format!("reading {f}"))?;
                        found |= defines(&text, item);
                    }
                    if !found {
                        broken.push(format!(
                            "{at}: `{span}`: {} defines no `{item}`",
                            files
                                .iter()
                                .map(|f| f.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
                Some(Span::Path(path)) => {
                    checked += 1;
                    if !repo.exists(path) {
                        broken.push(format!("{at}: `{span}`: no such file or directory"));
                    }
                }
                None => {}
            }
        }
    }
    Ok((broken, checked))
}
