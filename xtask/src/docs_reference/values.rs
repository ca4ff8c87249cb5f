//! The values reference of a chart, from its `values.yaml`: every key with
//! its default and the comment written above it (helm-docs style, without
//! a special comment syntax: the comment block right above a key is its
//! description).

use anyhow::{Context, Result};
use serde_json::Value;

use super::blocks::cell;

/// One table row per key of `yaml` that is a leaf (a scalar, a list, an
/// empty map) or carries a comment of its own.
pub fn render(yaml: &str) -> Result<String> {
    let values: Value = serde_saphyr::from_str(yaml).context("parsing values.yaml")?;
    let mut out = String::from("| value | default | what |\n|---|---|---|\n");
    // (indent, key) of the enclosing keys.
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut comment: Vec<(usize, String)> = Vec::new();
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(c) = trimmed.strip_prefix('#') {
            comment.push((indent, c.trim().to_owned()));
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            comment.clear();
            continue;
        };
        if trimmed.starts_with('-') || key.contains(' ') || key.is_empty() {
            comment.clear();
            continue;
        }
        while path.last().is_some_and(|(i, _)| *i >= indent) {
            path.pop();
        }
        let keys: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        let own: Vec<String> = comment
            .drain(..)
            .filter(|(i, _)| *i == indent)
            .map(|(_, c)| c)
            .collect();
        // Keys inside a leaf (an example list item, a map default) are part
        // of its default, not rows of their own.
        let Some(value) = lookup(&values, &keys) else {
            continue;
        };
        let parent = matches!(value, Value::Object(m) if !m.is_empty());
        if !parent || !own.is_empty() {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                keys.join("."),
                if parent {
                    "(map)".into()
                } else {
                    default(value)
                },
                cell(&own.join(" "))
            ));
        }
        path.push((indent, key.to_owned()));
    }
    Ok(out)
}

fn lookup<'v>(values: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    let mut v = values;
    for (i, k) in keys.iter().enumerate() {
        v = v.as_object()?.get(*k)?;
        // Only the last key may name a leaf.
        if i + 1 < keys.len() && !v.is_object() {
            return None;
        }
    }
    Some(v)
}

fn default(value: &Value) -> String {
    match value {
        Value::String(s) if s.is_empty() => "`\"\"`".into(),
        Value::String(s) => format!("`{}`", cell(s)),
        // A long list (every EFA instance type) by its first entry and size.
        Value::Array(items) if value.to_string().len() > 160 => {
            format!("`[{}, …]` ({} entries)", items[0], items.len())
        }
        other => format!("`{}`", cell(&other.to_string())),
    }
}
