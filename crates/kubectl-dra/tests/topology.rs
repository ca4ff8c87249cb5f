//! `kubectl dra topology` as a user runs it, offline, on our drivers' real
//! `discover` output for the sample nodes: the SVG is strict XML and names
//! every device the node publishes; the text shows roots, the chip grid,
//! holders and taints, and colour only when asked; the pictures in
//! `docs/images` are what it draws now.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// Runs the binary with `-f` for each fixture, then `args`; NO_COLOR and
/// TERM are cleared so the environment of the test run does not leak in.
fn run(files: &[&str], args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-dra"));
    cmd.env_remove("NO_COLOR");
    for f in files {
        cmd.arg("-f").arg(fixture(f));
    }
    let out = cmd
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl-dra: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Names of the devices the fixtures publish on `node`, read from the files
/// themselves (not from the tool).
fn published(files: &[&str], node: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(fixture(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
        for doc in docs {
            let items = match doc.get("items").and_then(|i| i.as_array()) {
                Some(items) => items.clone(),
                None => vec![doc.clone()],
            };
            for item in items {
                if item["kind"] != "ResourceSlice" || item["spec"]["nodeName"] != node {
                    continue;
                }
                for d in item["spec"]["devices"].as_array().into_iter().flatten() {
                    if let Some(n) = d["name"].as_str() {
                        names.insert(n.to_string());
                    }
                }
            }
        }
    }
    names
}

/// Every `<text>` and `<title>` of a well-formed SVG document, as strings.
fn svg_strings(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    for attr in ["width", "height", "viewBox"] {
        assert!(root.attribute(attr).is_some(), "no {attr} on <svg>");
    }
    doc.descendants()
        .filter(|n| matches!(n.tag_name().name(), "text" | "title"))
        .map(|n| n.text().unwrap_or_default().to_string())
        .collect()
}

/// The sample nodes: fixtures and what the picture must hold.
const NODES: &[(&str, &[&str])] = &[
    ("p5", &["p5-efa.yaml", "p5-gpu.yaml"]),
    (
        "trn1",
        &["trn1-efa.yaml", "trn1-neuron.yaml", "trn1-state.yaml"],
    ),
    ("trn2", &["trn2-efa.yaml", "trn2-neuron.yaml"]),
    (
        "trn2-cores",
        &[
            "trn2-cores-efa.yaml",
            "trn2-cores-neuron.yaml",
            "trn2-cores-state.yaml",
        ],
    ),
];

#[test]
fn svg_is_well_formed_and_names_every_device() {
    for (node, files) in NODES {
        let expected = published(files, node);
        assert!(expected.len() >= 16, "{node}: only {expected:?}");
        let (code, svg, err) = run(files, &["topology", node, "-o", "svg"]);
        assert_eq!(code, 0, "{node}: {err}");
        let strings = svg_strings(&svg);
        let missing: Vec<&String> = expected
            .iter()
            .filter(|name| {
                !strings.iter().any(|s| {
                    s.split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                        .any(|w| w == name.as_str())
                })
            })
            .collect();
        assert!(missing.is_empty(), "{node}: SVG does not name {missing:?}");
    }
}

#[test]
fn text_draws_roots_grid_holders_and_taints() {
    let (code, out, err) = run(NODES[1].1, &["topology", "trn1"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "Node trn1 · trn1.32xlarge · 8 EFAs, 16 Neuron chips",
        "{out}"
    );
    // Each PCIe root is one block of the table, its EFAs in PCI order.
    let root = lines
        .iter()
        .position(|l| l.starts_with("│ pci0000:10 │"))
        .unwrap_or_else(|| panic!("no pci0000:10 row:\n{out}"));
    assert!(lines[root].contains("○ EFA  efa-0000-10-19-0"), "{out}");
    assert!(lines[root + 1].starts_with("│ NUMA 0     │"), "{out}");
    assert!(
        lines[root + 1].contains("● EFA  efa-0000-10-1a-0")
            && lines[root + 1].contains("4A 8A 16A")
            && lines[root + 1].contains("team-a/training-job"),
        "{out}"
    );
    assert!(out.contains("ops/debug-efa (admin)"), "{out}");
    // The grid: row 0 is chips 0-3, all held; chip 7 (row 1, col 3) tainted.
    let row0 = lines
        .iter()
        .find(|l| l.contains("neurondevice0 "))
        .unwrap_or_else(|| panic!("no chip 0:\n{out}"));
    for chip in 0..4 {
        assert!(row0.contains(&format!("● neurondevice{chip} ")), "{row0}");
    }
    let row1 = lines
        .iter()
        .find(|l| l.contains("neurondevice4 "))
        .unwrap_or_else(|| panic!("no chip 4:\n{out}"));
    assert!(
        row1.trim_end_matches('│')
            .trim_end()
            .ends_with("▲ neurondevice7"),
        "{row1}"
    );
    assert!(out.contains("Neuron chips (4×4 torus"), "{out}");
    assert!(
        out.contains(
            "4A   resource.aws.com/devicegroup4_id = 88a3c6ad1661fe1d: chips 0-3 · efa-0000-10-1a-0, efa-0000-a0-1a-0"
        ),
        "{out}"
    );
    assert!(
        out.contains("● team-a/training-job: efa-0000-10-1a-0, efa-0000-a0-1a-0, neurondevice0, neurondevice1, neurondevice2, neurondevice3"),
        "{out}"
    );
    assert!(
        out.contains("▲ neurondevice7: example.com/maintenance=memory-test:NoSchedule (DeviceTaintRule chip-7-maintenance)"),
        "{out}"
    );
    // Box lines of one table are all as wide as each other.
    let widths: BTreeSet<usize> = lines
        .iter()
        .filter(|l| l.starts_with('│') && l.contains("pci0000"))
        .map(|l| l.chars().count())
        .collect();
    assert_eq!(widths.len(), 1, "{out}");
    assert!(!out.contains('\x1b'), "colour in piped output:\n{out}");
}

#[test]
fn colour_only_when_asked_or_on_a_terminal_without_no_color() {
    let (code, out, err) = run(NODES[1].1, &["topology", "trn1", "--color", "always"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\x1b[33m●\x1b[0m"), "{out}");
    assert!(out.contains("\x1b[35m▲\x1b[0m"), "{out}");
    let (_, out, _) = run(NODES[1].1, &["topology", "trn1", "--color", "never"]);
    assert!(!out.contains('\x1b'));

    // On a terminal (util-linux `script` gives the run a pseudo-terminal):
    // colour by default, none with NO_COLOR set.
    let mut line = vec![env!("CARGO_BIN_EXE_kubectl-dra").to_string()];
    for f in NODES[1].1 {
        line.extend(["-f".to_string(), fixture(f)]);
    }
    line.extend(["topology".to_string(), "trn1".to_string()]);
    let on_tty = |no_color: Option<&str>| {
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line.join(" "), "/dev/null"]);
        match no_color {
            Some(v) => cmd.env("NO_COLOR", v),
            None => cmd.env_remove("NO_COLOR"),
        };
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running script: {e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(on_tty(None).contains("\x1b[33m●\x1b[0m"));
    assert!(!on_tty(Some("1")).contains('\x1b'));
    // An empty NO_COLOR does not count (no-color.org).
    assert!(on_tty(Some("")).contains('\x1b'));
}

#[test]
fn health_taints_show_as_unhealthy_and_cores_as_partitions() {
    let (code, out, err) = run(NODES[3].1, &["topology", "trn2-cores"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("16 Neuron chips, 128 NeuronCore devices"),
        "{out}"
    );
    // Every chip cell shows its 8 cores as squares.
    assert!(out.contains("  □□□□□□□□ "), "{out}");
    assert!(out.contains("✖ "), "{out}");
    // The chip's health taint is on each of its cores too: one line for all.
    assert!(
        out.contains("✖ neurondevice5 and its 8 cores: neuron.aws.com/sram-ecc-uncorrected=1:NoSchedule (health reported by neuron.aws.com)"),
        "{out}"
    );
    assert!(!out.contains("✖ neurondevice5-core-0:"), "{out}");
    assert!(
        out.contains("✖ efa-0000-6c-00-0: efa.networking.k8s.aws/admin-queue-closed=1:NoSchedule"),
        "{out}"
    );
}

#[test]
fn gpus_and_efas_share_their_roots_on_p5() {
    let (code, out, err) = run(NODES[0].1, &["topology", "p5"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("8 GPUs, 32 EFAs"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let root = lines
        .iter()
        .position(|l| l.starts_with("│ pci0000:44 │"))
        .unwrap_or_else(|| panic!("no pci0000:44:\n{out}"));
    assert!(
        lines[root].contains("○ GPU  gpu-0             NVIDIA H100 80GB HBM3"),
        "{}",
        lines[root]
    );
    for k in 1..=4 {
        assert!(lines[root + k].contains("EFA "), "{}", lines[root + k]);
    }
}

#[test]
fn unknown_node_names_the_nodes_and_the_fix() {
    let (code, _, err) = run(NODES[1].1, &["topology", "trn3"]);
    assert_eq!(code, 2);
    assert!(err.contains("node \"trn3\" publishes no devices"), "{err}");
    assert!(err.contains("nodes with devices: trn1"), "{err}");
    assert!(err.contains("kubectl get resourceslices"), "{err}");
}

#[test]
fn json_model_counts_devices() {
    let (code, out, err) = run(NODES[2].1, &["topology", "trn2", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["grid"]["chips"].as_array().map(Vec::len), Some(16));
    assert_eq!(v["grid"]["torus"], true);
    assert_eq!(v["roots"].as_array().map(Vec::len), Some(8));
}

/// The pictures in `docs/images` that `docs/troubleshooting.md` shows, and
/// the sample node (of [`NODES`]) each draws.
const DOC_IMAGES: &[(&str, &str)] = &[("topology-trn2-cores.svg", "trn2-cores")];

/// The docs show what the tool draws now: each image is compared with a
/// fresh rendering, and `UPDATE_FIXTURES=1 cargo test -p kubectl-dra --test
/// topology` rewrites them (as it rewrites the fixtures in
/// `fixtures_current`).
#[test]
fn doc_images_are_the_current_rendering() {
    let images = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/images");
    for (file, name) in DOC_IMAGES {
        let files = NODES
            .iter()
            .find(|(node, _)| node == name)
            .map(|(_, files)| *files)
            .unwrap_or_else(|| panic!("{file}: no sample node {name}"));
        let (code, svg, err) = run(files, &["topology", name, "-o", "svg"]);
        assert_eq!(code, 0, "{name}: {err}");
        let path = images.join(file);
        if std::env::var_os("UPDATE_FIXTURES").is_some() {
            std::fs::write(&path, &svg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let committed =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == svg,
            "{} is not what `kubectl dra topology {name} -o svg` draws now from {files:?}; \
             regenerate: UPDATE_FIXTURES=1 cargo test -p kubectl-dra --test topology",
            path.display()
        );
    }
}
