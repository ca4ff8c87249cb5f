//! The attribute tables of docs/attributes.md, checked row by row against
//! what the drivers publish: every fixture instance type scanned by each
//! driver (with its flag variants), every attribute name seen must be a
//! row of that driver's section with the same type, and every row must be
//! an attribute some scan publishes. These tables stay hand-written: the
//! "value" and "when" columns are knowledge the code does not hold.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use dra_core::{ApiSupport, DeviceInventory, HostPaths};
use k8s_openapi::api::resource::v1::DeviceAttribute;

/// Attribute name (bare for the driver's own domain) → type, as published.
pub type Published = BTreeMap<String, String>;

/// What `I` publishes on every fixture instance type with the flags
/// `flags` (command-line words), the API server supporting everything and
/// the Node carrying `node_labels`.
pub fn published<I: DeviceInventory>(
    flags: &[&[&str]],
    node_labels: &BTreeMap<String, String>,
) -> Result<Published> {
    let mut out = Published::new();
    let dir = tempfile::tempdir()?;
    for (i, instance_type) in sysfs_fixtures::instance_types().iter().enumerate() {
        let fixture = sysfs_fixtures::generate(instance_type, &dir.path().join(i.to_string()))
            .with_context(|| format!("fixture {instance_type}"))?;
        let host = HostPaths {
            sysfs_root: fixture.sys.clone(),
            dev_root: fixture.dev.clone(),
        };
        for words in flags {
            let flags = parse_flags::<I>(words)?;
            let mut inventory = I::open(&host, &flags, &prometheus::Registry::new())
                .map_err(|e| anyhow::anyhow!("opening on {instance_type}: {e}"))?;
            inventory.set_api_support(&ApiSupport {
                partitionable_devices: Some(true),
                consumable_capacity: Some(true),
                ..ApiSupport::unknown()
            });
            inventory.set_node_labels(node_labels);
            let devices = inventory
                .scan()
                .map_err(|e| anyhow::anyhow!("scanning {instance_type}: {e}"))?;
            for d in devices {
                for (name, value) in d.device.attributes.iter().flatten() {
                    out.insert(name.clone(), type_of(value).to_owned());
                }
            }
        }
    }
    Ok(out)
}

fn parse_flags<I: DeviceInventory>(words: &[&str]) -> Result<I::Flags> {
    use clap::{Args, FromArgMatches};
    let command = I::Flags::augment_args(clap::Command::new("flags"));
    let matches =
        command.try_get_matches_from(std::iter::once("flags").chain(words.iter().copied()))?;
    Ok(I::Flags::from_arg_matches(&matches)?)
}

fn type_of(value: &DeviceAttribute) -> &'static str {
    if value.bool.is_some() {
        "bool"
    } else if value.int.is_some() {
        "int"
    } else if value.version.is_some() {
        "version"
    } else {
        "string"
    }
}

/// The attribute rows of the section `## <heading>...` of `markdown`:
/// name → type. A first cell may name several attributes
/// (`` `resource.aws.com/devicegroup4_id`, `devicegroup8_id` ``: the later
/// ones take the first one's domain); `` `x1` … `x3` `` is a numbered range.
/// Only tables whose header starts `| attribute | type |` are read.
pub fn documented(markdown: &str, heading: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let (mut inside, mut attribute_table) = (false, false);
    for line in markdown.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            inside = title.starts_with(heading);
            continue;
        }
        if !line.starts_with('|') {
            attribute_table = false;
            continue;
        }
        if line.starts_with("| attribute | type |") {
            attribute_table = true;
            continue;
        }
        if !inside || !attribute_table || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(names), Some(kind)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        // A row without a type points at rows above ("as on the chips").
        if kind.is_empty() {
            continue;
        }
        if let Some(range) = numbered_range(names) {
            for name in range {
                out.insert(name, (*kind).to_owned());
            }
            continue;
        }
        let mut domain = None;
        for (i, name) in names.split('`').enumerate() {
            if i % 2 == 0 || name.is_empty() {
                continue;
            }
            let full = match (name.split_once('/'), &domain) {
                (Some((d, _)), _) => {
                    domain = Some(d.to_owned());
                    name.to_owned()
                }
                (None, Some(d)) => format!("{d}/{name}"),
                (None, None) => name.to_owned(),
            };
            out.insert(full, (*kind).to_owned());
        }
    }
    out
}

/// `` `layer1` … `layer3` `` as `layer1`, `layer2`, `layer3`.
fn numbered_range(cell: &str) -> Option<Vec<String>> {
    let (first, last) = cell.split_once('…')?;
    let (first, last) = (
        first.trim().trim_matches('`'),
        last.trim().trim_matches('`'),
    );
    let stem = first.trim_end_matches(|c: char| c.is_ascii_digit());
    let from: u32 = first[stem.len()..].parse().ok()?;
    let to: u32 = last.strip_prefix(stem)?.parse().ok()?;
    Some((from..=to).map(|n| format!("{stem}{n}")).collect())
}

/// Every disagreement between `documented` and `published`, one line each.
pub fn disagreements(
    section: &str,
    documented: &BTreeMap<String, String>,
    published: &Published,
    not_on_fixtures: &[&str],
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, kind) in published {
        match documented.get(name) {
            None => out.push(format!(
                "{section}: `{name}` ({kind}) is published but has no row"
            )),
            Some(doc) if doc != kind => out.push(format!(
                "{section}: `{name}` is published as {kind}, the row says {doc}"
            )),
            Some(_) => {}
        }
    }
    let seen: BTreeSet<&String> = published.keys().collect();
    for name in documented.keys() {
        if !seen.contains(name) && !not_on_fixtures.contains(&name.as_str()) {
            out.push(format!(
                "{section}: the row `{name}` names an attribute no fixture scan publishes"
            ));
        }
    }
    out
}
