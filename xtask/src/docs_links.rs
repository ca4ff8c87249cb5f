//! `cargo xtask docs-links`: every file under `docs/` is reachable from
//! `docs/README.md` by following relative links, and no relative link in
//! those pages points at a file that does not exist.
//!
//! Why: a page nobody links to is a page nobody finds (three pages were
//! missing from the index before this check). The walk starts at the index
//! and follows Markdown links `[text](target)` whose target is relative;
//! links that leave `docs/` (to `../examples/`, a crate) are checked for
//! existence but not walked. An anchor (`page.md#section`, `#section`)
//! into a Markdown page must be one of its headings' slugs or explicit
//! anchors ([`crate::docs_anchors`]). Limits: absolute URLs are not
//! checked; links inside code blocks are skipped.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, ensure};

pub fn run() -> Result<()> {
    let root = crate::paths::repo_root();
    let report = check(&normalize(&root.join("docs")))?;
    eprintln!(
        "==> docs-links: {} files under docs/, all reachable from docs/README.md; {} relative links checked",
        report.files, report.links
    );
    Ok(())
}

#[derive(Debug)]
pub struct Report {
    pub files: usize,
    pub links: usize,
}

/// Walks `docs` from its `README.md`; fails naming every unreachable file
/// and every broken link.
pub fn check(docs: &Path) -> Result<Report> {
    let all = files_under(docs)?;
    let index = docs.join("README.md");
    ensure!(all.contains(&index), "{} is missing", index.display());
    let mut reached = BTreeSet::from([index.clone()]);
    let mut queue = VecDeque::from([index]);
    let mut broken = Vec::new();
    let mut links = 0;
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    while let Some(page) = queue.pop_front() {
        if page.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&page)
            .with_context(|| format!("reading {}", page.display()))?;
        let dir = page.parent().unwrap_or(docs);
        for (target, anchor) in links_of(&text) {
            links += 1;
            let path = if target.is_empty() {
                page.clone()
            } else {
                normalize(&dir.join(&target))
            };
            if !path.exists() {
                broken.push(format!("{} -> {target}", rel(docs, &page)));
                continue;
            }
            if let Some(anchor) = anchor
                && path.extension().is_some_and(|e| e == "md")
                && path.is_file()
            {
                if !anchors.contains_key(&path) {
                    let markdown = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    anchors.insert(path.clone(), crate::docs_anchors::anchors(&markdown));
                }
                if !anchors[&path].contains(&anchor) {
                    broken.push(format!(
                        "{} -> {target}#{anchor} (no such heading or anchor)",
                        rel(docs, &page)
                    ));
                }
            }
            if path.starts_with(docs) && path.is_file() && reached.insert(path.clone()) {
                queue.push_back(path);
            }
        }
    }
    let unreachable: Vec<String> = all
        .iter()
        .filter(|f| !reached.contains(*f))
        .map(|f| rel(docs, f))
        .collect();
    ensure!(
        broken.is_empty(),
        "broken relative links in docs/: {broken:?}"
    );
    ensure!(
        unreachable.is_empty(),
        "not reachable from docs/README.md (link them from the index or from a page it reaches): {unreachable:?}"
    );
    Ok(Report {
        files: all.len(),
        links,
    })
}

fn rel(docs: &Path, p: &Path) -> String {
    p.strip_prefix(docs).unwrap_or(p).display().to_string()
}

fn files_under(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(files_under(&path)?);
        } else {
            out.insert(normalize(&path));
        }
    }
    Ok(out)
}

/// `a/b/../c` as `a/c`, without touching the file system (the target may
/// not exist).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link of a Markdown page as `(path, anchor)`:
/// `[text](target)` outside fenced code blocks and inline code, skipping
/// URLs (`scheme:`) and absolute paths; the path is empty for a link within
/// the page (`#section`).
fn links_of(markdown: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans may hold `[a](b)` that is not a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a.to_owned())),
                None => (target, None),
            };
            let relative = !path.contains(':') && !path.starts_with('/');
            if relative && (!path.is_empty() || anchor.as_ref().is_some_and(|a| !a.is_empty())) {
                out.push((path.to_owned(), anchor));
            }
            rest = &after[end..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_found_outside_code_only() {
        let md = "See [a](a.md#x) and [b](../b/ \"t\"), [web](https://x.io/y.md), [top](#top).\n\
                  `[not](code.md)` and\n```\n[not](fenced.md)\n```\n[c](sub/c.md)\n";
        let got = links_of(md);
        let want = [
            ("a.md", Some("x")),
            ("../b/", None),
            ("", Some("top")),
            ("sub/c.md", None),
        ]
        .map(|(p, a)| (p.to_owned(), a.map(str::to_owned)));
        assert_eq!(got, want);
    }

    #[test]
    fn an_unlinked_page_and_a_broken_link_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("README.md"), "[a](a.md)\n").unwrap();
        std::fs::write(d.join("a.md"), "[b](b.md) [gone](gone.md)\n").unwrap();
        std::fs::write(d.join("b.md"), "back to [index](README.md)\n").unwrap();
        std::fs::write(d.join("orphan.md"), "nobody links here\n").unwrap();
        let e = format!("{:#}", check(d).unwrap_err());
        assert!(e.contains("a.md -> gone.md"), "{e}");
        std::fs::write(d.join("a.md"), "[b](b.md)\n").unwrap();
        let e = format!("{:#}", check(d).unwrap_err());
        assert!(e.contains("[\"orphan.md\"]"), "{e}");
        std::fs::write(d.join("b.md"), "[o](./orphan.md)\n").unwrap();
        let r = check(d).unwrap();
        assert_eq!((r.files, r.links), (4, 3));
    }

    #[test]
    fn anchors_must_name_a_heading() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("README.md"),
            "# Top\n[a](a.md#which-mode) [self](#top) [gone](a.md#gone) [me](#nope)\n",
        )
        .unwrap();
        std::fs::write(d.join("a.md"), "## Which mode?\n[back](README.md#top)\n").unwrap();
        let e = format!("{:#}", check(d).unwrap_err());
        assert!(e.contains("README.md -> a.md#gone"), "{e}");
        assert!(e.contains("README.md -> #nope"), "{e}");
        assert!(!e.contains("which-mode"), "{e}");
        assert!(!e.contains("#top"), "{e}");
    }
}
