//! Generated blocks inside hand-written pages: the text between
//! `<!-- BEGIN GENERATED name ... -->` and `<!-- END GENERATED name -->` is
//! what `cargo xtask docs` writes from the code, and what `--check` compares.

use anyhow::{Result, bail};

fn begin_marker(name: &str) -> String {
    format!(
        "<!-- BEGIN GENERATED {name}: `cargo xtask docs` writes this from the code; edit the code, not this -->"
    )
}

fn end_marker(name: &str) -> String {
    format!("<!-- END GENERATED {name} -->")
}

/// Where the block `name` is in `text`: the byte range of its content
/// (between the marker lines).
fn content_range(text: &str, name: &str) -> Result<std::ops::Range<usize>> {
    let begin_prefix = format!("<!-- BEGIN GENERATED {name}:");
    let end = end_marker(name);
    let Some(b) = text.find(&begin_prefix) else {
        bail!("no `<!-- BEGIN GENERATED {name}: ... -->` line");
    };
    let Some(line_end) = text[b..].find('\n') else {
        bail!("the BEGIN GENERATED {name} line does not end");
    };
    let start = b + line_end + 1;
    let Some(e) = text[start..].find(&end) else {
        bail!("no `{end}` after its BEGIN line");
    };
    Ok(start..start + e)
}

/// `text` with block `name` holding `content` (and its BEGIN line in the
/// current wording).
pub fn replace(text: &str, name: &str, content: &str) -> Result<String> {
    let range = content_range(text, name)?;
    let begin_prefix = format!("<!-- BEGIN GENERATED {name}:");
    let b = text.find(&begin_prefix).unwrap_or(range.start);
    let mut out = String::with_capacity(text.len() + content.len());
    out.push_str(&text[..b]);
    out.push_str(&begin_marker(name));
    out.push('\n');
    out.push_str(content);
    if !content.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&text[range.end..]);
    Ok(out)
}

/// `None` when block `name` of `text` holds exactly `content`; else the
/// first line that differs, doc against code.
pub fn drift(text: &str, name: &str, content: &str) -> Result<Option<String>> {
    let range = content_range(text, name)?;
    let have = &text[range];
    let want = if content.ends_with('\n') {
        content.to_owned()
    } else {
        format!("{content}\n")
    };
    if have == want {
        return Ok(None);
    }
    let (h, w): (Vec<&str>, Vec<&str>) = (have.lines().collect(), want.lines().collect());
    for i in 0..h.len().max(w.len()) {
        let (a, b) = (h.get(i), w.get(i));
        if a != b {
            return Ok(Some(format!(
                "line {} of the block: the doc has {}, the code gives {}",
                i + 1,
                a.map_or("nothing".into(), |l| format!("`{l}`")),
                b.map_or("nothing".into(), |l| format!("`{l}`"))
            )));
        }
    }
    Ok(Some("whitespace differs".into()))
}

/// A Markdown table cell: one line, `|` escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
