//! `cargo xtask docs [--check]`: the reference parts of the docs, from the
//! code (docs/reference.md, the metrics tables, the attribute tables).
//!
//! Generated (the code holds all of it): each driver's flags with their
//! environment variables and defaults (its clap command), every metric
//! with its type, labels and help (the registry the process builds), each
//! chart value with its default and comment (`values.yaml`). `cargo xtask
//! docs` rewrites those blocks; `--check` (a CI step) fails when a
//! committed block differs from a fresh one. Checked row by row (the doc
//! holds knowledge the code does not): the attribute tables of
//! docs/attributes.md against what the drivers publish on every fixture,
//! and the Node labels the Neuron driver manages against docs/neuron.md.
//! And in every page, each named piece of code (`file.rs::item`) and each
//! backticked repository path must exist ([`code_refs`]). Why this split:
//! CONTRIBUTING.md, "Docs that follow the code".

mod attributes;
mod blocks;
mod code_refs;
mod flags;
mod metrics;
#[cfg(test)]
mod tests;
mod values;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use dra_core::Program;
use dra_core::testing::reference::{
    driver_command, register_every_metric, register_program_metrics,
};
use efa_driver::EfaInventory;
use neuron_driver::NeuronInventory;

#[derive(clap::Args)]
pub struct DocsArgs {
    /// Compare instead of writing: fail when a generated block differs
    /// from a fresh one, or a checked table or name disagrees with the code.
    #[arg(long)]
    check: bool,
}

const EFA: Program = Program {
    binary: "efa-driver",
    version: "",
    driver_name: efa_driver::DRIVER_NAME,
    device_plugin_resources: efa_driver::safety::DEVICE_PLUGIN_RESOURCES,
};
const NEURON: Program = Program {
    binary: "neuron-driver",
    version: "",
    driver_name: neuron_driver::DRIVER_NAME,
    device_plugin_resources: neuron_driver::safety::DEVICE_PLUGIN_RESOURCES,
};

/// One generated block: the page, the block's name, its content.
pub struct Block {
    pub page: &'static str,
    pub name: &'static str,
    pub content: String,
}

pub fn run(args: DocsArgs) -> Result<()> {
    let root = crate::paths::repo_root();
    let blocks = generated(&root)?;
    let mut problems = Vec::new();
    let mut pages: BTreeMap<&str, String> = BTreeMap::new();
    for b in &blocks {
        if !pages.contains_key(b.page) {
            let text = std::fs::read_to_string(root.join(b.page))
                .with_context(|| format!("reading {}", b.page))?;
            pages.insert(b.page, text);
        }
        let text = pages.get_mut(b.page).expect("read above");
        if args.check {
            if let Some(d) = blocks::drift(text, b.name, &b.content)
                .with_context(|| format!("{} block {}", b.page, b.name))?
            {
                problems.push(format!("{} block {}: {d}", b.page, b.name));
            }
        } else {
            *text = blocks::replace(text, b.name, &b.content)
                .with_context(|| format!("{} block {}", b.page, b.name))?;
        }
    }
    if !args.check {
        for (page, text) in &pages {
            std::fs::write(root.join(page), text).with_context(|| format!("writing {page}"))?;
        }
    }
    problems.extend(checked_tables(&root)?);
    let (broken, names) = names_in_pages(&root)?;
    problems.extend(broken);
    if !problems.is_empty() {
        bail!(
            "the docs disagree with the code ({} problems):\n  {}\n\
             generated blocks: run `cargo xtask docs` and commit the result; the rest: fix the doc \
             (or the code) in the same commit (CONTRIBUTING.md, \"Docs that follow the code\")",
            problems.len(),
            problems.join("\n  ")
        );
    }
    eprintln!(
        "==> docs: {} generated blocks {}, attribute tables and Node labels agree with the code, \
         {names} code names and repository paths in the pages exist",
        blocks.len(),
        if args.check { "up to date" } else { "written" }
    );
    Ok(())
}

/// Every generated block, fresh from the code.
pub fn generated(root: &Path) -> Result<Vec<Block>> {
    let mut out = vec![
        Block {
            page: "docs/reference.md",
            name: "flags-efa-driver",
            content: flags::render(&driver_command::<EfaInventory>(&EFA)),
        },
        Block {
            page: "docs/reference.md",
            name: "flags-neuron-driver",
            content: flags::render(&driver_command::<NeuronInventory>(&NEURON)),
        },
    ];
    for chart in ["efa-dra-driver", "neuron-dra-driver"] {
        let path = root.join("charts").join(chart).join("values.yaml");
        let yaml = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        out.push(Block {
            page: "docs/reference.md",
            name: if chart == "efa-dra-driver" {
                "values-efa-dra-driver"
            } else {
                "values-neuron-dra-driver"
            },
            content: values::render(&yaml).with_context(|| format!("charts/{chart}"))?,
        });
    }
    let (efa, neuron) = (efa_metrics()?, neuron_metrics()?);
    let driver_own = |n: &str| n.starts_with("aws_dra_efa_") || n.starts_with("aws_dra_neuron_");
    out.push(Block {
        page: "docs/operations.md",
        name: "metrics-shared",
        content: metrics::render(&efa, |n| !driver_own(n)),
    });
    out.push(Block {
        page: "docs/efa.md",
        name: "metrics-efa",
        content: metrics::render(&efa, |n| n.starts_with("aws_dra_efa_")),
    });
    out.push(Block {
        page: "docs/neuron.md",
        name: "metrics-neuron",
        content: metrics::render(&neuron, |n| n.starts_with("aws_dra_neuron_")),
    });
    // Every metric constructed in the source is in those registries.
    let shared = {
        let r = prometheus::Registry::new();
        register_every_metric(&r, "aws_dra_x")?;
        r.gather().len()
    };
    let own_efa = efa.len() - shared;
    let own_neuron = neuron.len() - shared;
    for (src, registered) in [
        ("crates/dra-core/src", shared),
        ("crates/efa-driver/src", own_efa),
        ("crates/neuron-driver/src", own_neuron),
    ] {
        let sites = metrics::constructor_sites(&root.join(src))?;
        if sites.len() != registered {
            bail!(
                "{src} constructs {} metrics but the metrics reference registers {registered}: \
                 a metric registered where `register_every_metric` \
                 (crates/dra-core/src/daemon/metric_catalog.rs) or this generator does not \
                 (give it a child there); constructors at {sites:?}",
                sites.len()
            );
        }
    }
    Ok(out)
}

/// The EFA driver's process registry: dra-core's metrics and its own.
fn efa_metrics() -> Result<Vec<prometheus::proto::MetricFamily>> {
    let registry = prometheus::Registry::new();
    register_program_metrics(&registry, &EFA)?;
    let own = efa_driver::inventory::EfaMetrics::register(&registry)?;
    own.unusable.with_label_values(&["driver_not_bound"]).set(0);
    own.unusable_total
        .with_label_values(&["driver_not_bound"])
        .inc();
    Ok(registry.gather())
}

/// The Neuron driver's process registry: dra-core's metrics (it has none
/// of its own).
fn neuron_metrics() -> Result<Vec<prometheus::proto::MetricFamily>> {
    let registry = prometheus::Registry::new();
    register_program_metrics(&registry, &NEURON)?;
    Ok(registry.gather())
}

/// The attribute tables and the Node labels, against what the drivers do.
fn checked_tables(root: &Path) -> Result<Vec<String>> {
    let page = std::fs::read_to_string(root.join("docs/attributes.md"))?;
    let mut out = attributes::disagreements(
        "docs/attributes.md, EFA",
        &attributes::documented(&page, "EFA"),
        &attributes::published::<EfaInventory>(&[&[]], &BTreeMap::new())?,
        &[],
    );
    let layers: BTreeMap<String, String> = (1..=3)
        .map(|n| {
            (
                format!("{}{n}", neuron_driver::attributes::NETWORK_NODE_LAYER_LABEL),
                format!("nn-{n}"),
            )
        })
        .collect();
    out.extend(attributes::disagreements(
        "docs/attributes.md, Neuron",
        &attributes::documented(&page, "Neuron"),
        &attributes::published::<NeuronInventory>(&[&[], &["--partitions", "cores"]], &layers)?,
        NEURON_ATTRIBUTES_NOT_ON_FIXTURES,
    ));
    let neuron_page = std::fs::read_to_string(root.join("docs/neuron.md"))?;
    for label in neuron_driver::ultraserver::NODE_LABELS {
        if !neuron_page.contains(&format!("`{label}`")) {
            out.push(format!(
                "docs/neuron.md: the Neuron driver manages the Node label `{label}`, which the page does not name"
            ));
        }
    }
    Ok(out)
}

/// Documented Neuron attributes no fixture scan can publish, and why.
/// The PCI placement of a chip comes from the `NEURON_IOCTL_DEVICE_BDF`
/// ioctl on its `/dev/neuronN`, which a fixture's plain files cannot answer.
const NEURON_ATTRIBUTES_NOT_ON_FIXTURES: &[&str] = &[
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/numaNode",
];

/// The code names and repository paths of README.md, CONTRIBUTING.md and
/// every page under docs/.
fn names_in_pages(root: &Path) -> Result<(Vec<String>, usize)> {
    let repo = code_refs::Repo::from_git(root)?;
    let mut pages = vec!["README.md".to_owned(), "CONTRIBUTING.md".to_owned()];
    for entry in std::fs::read_dir(root.join("docs"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    let (mut broken, mut checked) = (Vec::new(), 0);
    for page in pages {
        let text = std::fs::read_to_string(root.join(&page))?;
        let (b, n) = code_refs::check_page(&repo, &page, &text)?;
        broken.extend(b);
        checked += n;
    }
    Ok((broken, checked))
}
