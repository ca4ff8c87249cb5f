//! The docs checks fail on what they are there to catch: a planted stale
//! flag default, a missing metric row, a renamed function a doc names.

use super::*;

fn root() -> std::path::PathBuf {
    crate::paths::repo_root()
}

/// The committed pages, with `block` of `page` passed through `plant`.
fn planted(page: &str, block: &str, plant: impl Fn(&str) -> String) -> Option<String> {
    let blocks = generated(&root()).unwrap();
    let fresh = blocks
        .iter()
        .find(|b| b.page == page && b.name == block)
        .unwrap();
    let text = blocks::replace(
        &std::fs::read_to_string(root().join(page)).unwrap(),
        block,
        &fresh.content,
    )
    .unwrap();
    let stale = blocks::replace(&text, block, &plant(&fresh.content)).unwrap();
    assert_eq!(blocks::drift(&text, block, &fresh.content).unwrap(), None);
    blocks::drift(&stale, block, &fresh.content).unwrap()
}

#[test]
fn a_stale_flag_default_fails() {
    let drift = planted("docs/reference.md", "flags-efa-driver", |t| {
        assert!(
            t.contains("| `10` |"),
            "the rescan interval's default is in the table"
        );
        t.replacen("| `10` |", "| `30` |", 1)
    })
    .expect("a changed default is drift");
    assert!(drift.contains("`30`") && drift.contains("`10`"), "{drift}");
}

#[test]
fn a_missing_metric_row_fails() {
    let drift = planted("docs/operations.md", "metrics-shared", |t| {
        t.lines()
            .filter(|l| !l.contains("aws_dra_waiting_for"))
            .map(|l| format!("{l}\n"))
            .collect()
    })
    .expect("a missing row is drift");
    assert!(drift.contains("aws_dra_waiting_for"), "{drift}");
}

#[test]
fn every_flag_and_env_var_of_the_binaries_is_in_the_table() {
    let table = flags::render(&driver_command::<EfaInventory>(&EFA));
    for needle in [
        "`efa-driver run`",
        "`efa-driver discover`",
        "| `--rescan-interval` | `RESCAN_INTERVAL_SECONDS` | `10` |",
        "| `--node-name` | `NODE_NAME` | required |",
        "`--sharing`",
    ] {
        assert!(table.contains(needle), "{needle} not in\n{table}");
    }
    let neuron = flags::render(&driver_command::<NeuronInventory>(&NEURON));
    assert!(neuron.contains("`NEURON_PARTITIONS`"), "{neuron}");
    assert!(
        neuron.contains(&format!("`{}`", neuron_driver::DRIVER_NAME)),
        "{neuron}"
    );
}

#[test]
fn values_rows_carry_defaults_and_comments() {
    let yaml = "# file comment\n\na:\n  # the port\n  port: 8080\n  list: []\n  # a map\n  sel:\n    k: v\nb: \"\"\n";
    let table = values::render(yaml).unwrap();
    assert_eq!(
        table,
        "| value | default | what |\n|---|---|---|\n\
         | `a.port` | `8080` | the port |\n\
         | `a.list` | `[]` |  |\n\
         | `a.sel` | (map) | a map |\n\
         | `a.sel.k` | `v` |  |\n\
         | `b` | `\"\"` |  |\n"
    );
}

#[test]
fn a_renamed_function_named_by_a_doc_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("crates/a/src/daemon")).unwrap();
    std::fs::write(
        d.join("crates/a/src/daemon/runtime.rs"),
        "pub(crate) async fn run() {}\nstruct Kept;\n",
    )
    .unwrap();
    let repo = code_refs::Repo::from_list(d, ["crates/a/src/daemon/runtime.rs"].into_iter());
    let page = "Start-up (`daemon/runtime.rs::run`, `crates/a/src/daemon/runtime.rs::Kept`), \
                files `crates/a/src/daemon/`, `runtime.rs`; not ours: `/var/run/cdi`, `a::b`, `x.y/z`.\n\
                ```\n`gone.rs::nothing`\n```\n";
    let (broken, checked) = code_refs::check_page(&repo, "p.md", page).unwrap();
    assert_eq!((broken.len(), checked), (0, 4), "{broken:?}");
    // The step is renamed; the doc is not.
    std::fs::write(
        d.join("crates/a/src/daemon/runtime.rs"),
        "pub(crate) async fn serve() {}\nstruct Kept;\n",
    )
    .unwrap();
    let (broken, _) = code_refs::check_page(&repo, "p.md", page).unwrap();
    assert_eq!(broken.len(), 1, "{broken:?}");
    assert!(broken[0].contains("defines no `run`"), "{broken:?}");
    // A moved file and a path that never was.
    let (broken, _) = code_refs::check_page(
        &repo,
        "p.md",
        "`daemon/gone.rs::run` and `crates/a/src/prepare/`\n",
    )
    .unwrap();
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("no file daemon/gone.rs"), "{broken:?}");
    assert!(broken[1].contains("no such file"), "{broken:?}");
}

#[test]
fn code_names_are_told_from_other_backticked_words() {
    use code_refs::{Span, classify};
    assert_eq!(
        classify("daemon/runtime.rs::run"),
        Some(Span::Code {
            path: "daemon/runtime.rs",
            item: "run"
        })
    );
    assert_eq!(
        classify("crates/dra-core/src/prepare/"),
        Some(Span::Path("crates/dra-core/src/prepare/"))
    );
    assert_eq!(classify("health.rs"), Some(Span::Path("health.rs")));
    for not_ours in [
        "/var/lib/kubelet",
        "resource.k8s.io/v1",
        "plugins/<driver>/dra.sock",
        "dra_core::run",
        "https://x.io/a.md",
        "k8s.efa.networking.k8s.aws/efa",
    ] {
        assert_eq!(classify(not_ours), None, "{not_ours}");
    }
}

#[test]
fn attribute_rows_are_read_per_section() {
    let md = "## EFA (`efa`)\n| attribute | type | value |\n|---|---|---|\n| `resource.aws.com/devicegroup4_id`, `devicegroup8_id` | string | x |\n| `rdmaDevice` | string | y |\n\n| expression | what |\n|---|---|\n| `x.y == 1` | no |\n## Neuron\n| attribute | type |\n|---|---|\n| `deviceId` | int | z |\n| `layer1` … `layer3` | string | w |\n";
    let efa = attributes::documented(md, "EFA");
    assert_eq!(
        efa.keys().collect::<Vec<_>>(),
        [
            "rdmaDevice",
            "resource.aws.com/devicegroup4_id",
            "resource.aws.com/devicegroup8_id"
        ]
    );
    assert_eq!(
        attributes::documented(md, "Neuron")
            .keys()
            .collect::<Vec<_>>(),
        ["deviceId", "layer1", "layer2", "layer3"]
    );
    let published: attributes::Published = [
        ("rdmaDevice".to_owned(), "int".to_owned()),
        ("new".to_owned(), "bool".to_owned()),
    ]
    .into();
    let found = attributes::disagreements(
        "EFA",
        &efa,
        &published,
        &["resource.aws.com/devicegroup8_id"],
    );
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found
            .iter()
            .any(|f| f.contains("`new` (bool) is published but has no row"))
    );
    assert!(
        found
            .iter()
            .any(|f| f.contains("`rdmaDevice` is published as int, the row says string"))
    );
    assert!(
        found
            .iter()
            .any(|f| f.contains("row `resource.aws.com/devicegroup4_id`"))
    );
}
