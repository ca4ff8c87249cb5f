//! The anchors a Markdown page offers, as GitHub renders it: one per
//! heading (its text in GitHub's slug form) and one per explicit
//! `<a id="...">` / `<a name="...">`. `docs-links` checks every
//! `page.md#anchor` and `#anchor` link against them, so a heading renamed
//! without its links is caught.
//!
//! GitHub's slug of a heading: its rendered text lower-cased, every
//! character that is not a letter, a digit, a space, `-` or `_` dropped,
//! spaces turned into `-`; a slug seen before on the page gets `-1`, `-2`,
//! ... appended. "Rendered text" matters for inline code (the backticks go,
//! the text stays) and links (the text stays, the target goes).

use std::collections::{BTreeMap, BTreeSet};

/// Every anchor of `markdown`.
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        out.extend(explicit_anchors(line));
        let Some(text) = heading_text(trimmed) else {
            continue;
        };
        let base = slug(&rendered(text));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The text of an ATX heading (`## Text ##`), if `line` is one.
fn heading_text(line: &str) -> Option<&str> {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    if hashes == 0 || hashes > 6 {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.is_empty() && !rest.starts_with(' ') {
        return None;
    }
    Some(rest.trim().trim_end_matches('#').trim_end())
}

/// A heading's text as rendered: `[text](target)` as `text`, `<tag>`s
/// dropped (backticks and emphasis marks go with the slug's punctuation).
fn rendered(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['[', '<']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if tail.starts_with('<') {
            match tail.find('>') {
                Some(end) => rest = &tail[end + 1..],
                None => {
                    out.push_str(tail);
                    rest = "";
                }
            }
            continue;
        }
        match (tail.find("]("), tail.find(')')) {
            (Some(mid), Some(end)) if mid < end => {
                out.push_str(&tail[1..mid]);
                rest = &tail[end + 1..];
            }
            _ => {
                out.push('[');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// GitHub's slug of rendered heading text.
pub fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `id`/`name` values of `<a ...>` tags on a line.
fn explicit_anchors(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("<a ") {
        let tag = &rest[at..];
        let end = tag.find('>').unwrap_or(tag.len());
        for attr in ["id=\"", "name=\""] {
            if let Some(v) = tag[..end].find(attr) {
                let value = &tag[v + attr.len()..end];
                if let Some(close) = value.find('"') {
                    out.push(value[..close].to_owned());
                }
            }
        }
        rest = &tag[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_as_github_renders_them() {
        let md = "# The Neuron driver (`neuron.aws.com`)\n\
                  ## Which mode: `--partitions chips|auto|cores`\n\
                  ```\n# not a heading\n```\n\
                  ### Steps\n### Steps\n\
                  ## See [install.md](install.md) first\n\
                  #hashtag\n\
                  <a id=\"fault-matrix\"></a>\n\
                  ## 1. Pick a node pool and drain it ##\n";
        let got = anchors(md);
        for want in [
            "the-neuron-driver-neuronawscom",
            "which-mode---partitions-chipsautocores",
            "steps",
            "steps-1",
            "see-installmd-first",
            "fault-matrix",
            "1-pick-a-node-pool-and-drain-it",
        ] {
            assert!(got.contains(want), "{want} not in {got:?}");
        }
        assert!(!got.contains("not-a-heading"));
        assert!(!got.contains("hashtag"));
        assert_eq!(got.len(), 7, "{got:?}");
    }
}
