//! Every node a scenario asks for is in the kind cluster's node list.
//!
//! On the local testbeds `Testbed::ensure_node` starts a kubelet when a
//! scenario first needs one; kind fixes its nodes when the cluster is
//! created (`e2e::kind_host::roles`, the config `cargo xtask e2e --cluster
//! kind` writes), so a scenario that asks for a node the list lacks fails
//! there, and only there. This test reads the scenarios' sources for their
//! `ensure_node(name, fixture, …)` calls and fails when a `(name, fixture)`
//! is not a kind role. It understands a string literal and a name bound by
//! `for (name, fixture) in CONST` over a `const` table of string pairs in
//! the same file; any other argument fails the test with the call, so that
//! a new form is taught here rather than missed.
//!
//! The other way round, the local testbeds start kind's node list at
//! bring-up when `AWS_DRA_E2E_NODES=kind` (`e2e::kind_host::NodeList`), so
//! every kind role must also be a node they can start.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use e2e::DriverKind;
use sysfs_fixtures::spec::{DeviceKind, Node};

/// `(role, fixture)` pairs a source asks `ensure_node` for, or the call it
/// cannot read.
fn nodes_asked_for(source: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (at, _) in source.match_indices("ensure_node(") {
        if source[..at].ends_with("fn ") {
            continue;
        }
        let args = &source[at + "ensure_node(".len()..];
        let mut parts = args.splitn(3, ',').map(str::trim);
        let (Some(name), Some(fixture)) = (parts.next(), parts.next()) else {
            return Err(format!("ensure_node({}", first_line(args)));
        };
        match (literal(name), literal(fixture)) {
            (Some(n), Some(f)) => out.push((n.to_owned(), f.to_owned())),
            _ if is_ident(name) && is_ident(fixture) => {
                out.extend(pairs_bound_to(&source[..at], name, fixture).ok_or_else(|| {
                    format!(
                        "ensure_node({name}, {fixture}, …): no `for ({name}, {fixture}) in CONST` \
                         over a const table of string pairs before it"
                    )
                })?);
            }
            _ => return Err(format!("ensure_node({}", first_line(args))),
        }
    }
    Ok(out)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// The contents of a string literal `"…"`.
fn literal(arg: &str) -> Option<&str> {
    arg.strip_prefix('"')?.strip_suffix('"')
}

fn is_ident(arg: &str) -> bool {
    !arg.is_empty() && arg.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The pairs of the table that the last `for (name, fixture) in TABLE`
/// before the call iterates: `TABLE`'s `("a", "b")` entries.
fn pairs_bound_to(before: &str, name: &str, fixture: &str) -> Option<Vec<(String, String)>> {
    let pattern = format!("for ({name}, {fixture}) in ");
    let start = before.rfind(&pattern)? + pattern.len();
    let table: String = before[start..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let decl = before.find(&format!("const {table}:"))?;
    let body = &before[decl..];
    let body = &body[body.find('=')?..body.find("];")?];
    let strings: Vec<&str> = body.split('"').skip(1).step_by(2).collect();
    if strings.is_empty() || !strings.len().is_multiple_of(2) {
        return None;
    }
    Some(
        strings
            .chunks(2)
            .map(|p| (p[0].to_owned(), p[1].to_owned()))
            .collect(),
    )
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for path in std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_node_a_scenario_asks_for_is_a_kind_node() {
    let scenarios = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scenarios");
    let kind: BTreeSet<(String, String)> = e2e::kind_host::roles()
        .into_iter()
        .map(|(role, fixture, _)| (role, fixture))
        .collect();
    let mut asked = Vec::new();
    for file in rust_files(&scenarios) {
        let source = std::fs::read_to_string(&file).unwrap();
        let found = nodes_asked_for(&source)
            .unwrap_or_else(|call| panic!("{}: cannot read {call}", file.display()));
        asked.extend(found.into_iter().map(|n| (file.clone(), n)));
    }
    // The scenarios that add nodes today: trn1 and the UltraServer.
    assert!(asked.len() >= 5, "found only {asked:?}");
    let missing: Vec<String> = asked
        .iter()
        .filter(|(_, node)| !kind.contains(node))
        .map(|(file, (role, fixture))| {
            format!("{role} ({fixture}), asked for in {}", file.display())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "nodes the kind cluster lacks (add them to e2e::kind_host::roles): {missing:#?}"
    );
}

/// Whether the PCIe tree below `nodes` has a device that `is` accepts.
fn has_device(nodes: &[Node], is: &dyn Fn(&DeviceKind) -> bool) -> bool {
    nodes.iter().any(|n| match n {
        Node::Bridge { children, .. } => has_device(children, is),
        Node::Device { kind, .. } => is(kind),
    })
}

#[test]
fn every_kind_node_is_one_the_local_testbeds_can_start() {
    let roles = e2e::kind_host::roles();
    let names: BTreeSet<&str> = roles.iter().map(|(role, _, _)| role.as_str()).collect();
    assert_eq!(names.len(), roles.len(), "a role twice: {roles:?}");
    for (role, fixture, drivers) in &roles {
        // The node's name: the role on the host testbed, `chart-<role>` on
        // the charts' (and the role is the value of its role label).
        let chart_name = e2e::chart_testbed::local_host::local_node_name(role);
        for name in [role, &chart_name] {
            assert!(
                local_cluster::cluster_config::is_short_dns_label(name),
                "{name}: a local node's name must be a DNS label of at most 20 characters"
            );
        }
        let spec = sysfs_fixtures::spec(fixture)
            .unwrap_or_else(|| panic!("{role}: no fixture {fixture} (sysfs_fixtures::spec)"));
        assert!(!drivers.is_empty(), "{role} runs no driver");
        for kind in drivers {
            let devices = |k: &DeviceKind| match kind {
                DriverKind::Efa => matches!(k, DeviceKind::Efa { .. }),
                DriverKind::Neuron => matches!(k, DeviceKind::Neuron { .. }),
                DriverKind::GpuTest => matches!(k, DeviceKind::NvidiaGpu { .. }),
            };
            assert!(
                spec.roots.iter().any(|r| has_device(&r.children, &devices)),
                "{role}: {} has no device on {fixture}",
                kind.binary()
            );
        }
    }
    // `ensure_node` leaves a node the testbed has as it is: the testbed's
    // own nodes must be kind roles exactly, or a different fixture or driver
    // set there would go unnoticed.
    for node in e2e::LocalOptions::default().nodes {
        assert!(
            roles.contains(&node),
            "the local testbeds' node {node:?} is not a kind role as it is"
        );
    }
}

#[test]
fn the_reader_finds_literals_and_tables_and_refuses_the_rest() {
    let source = r#"
const SERVER: [(&str, &str); 2] = [
    ("us-0", "trn2u.48xlarge@node0"),
    ("us-1", "trn2u.48xlarge@node1"),
];
async fn ensure_node(&self, name: &str) {}
async fn s(tb: &T) {
    tb.ensure_node("trn1", "trn1.32xlarge", &[DriverKind::Efa]).await?;
    for (name, fixture) in SERVER {
        tb.ensure_node(name, fixture, &[DriverKind::Neuron]).await?;
    }
}
"#;
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        nodes_asked_for(source).unwrap(),
        [
            pair("trn1", "trn1.32xlarge"),
            pair("us-0", "trn2u.48xlarge@node0"),
            pair("us-1", "trn2u.48xlarge@node1"),
        ]
    );
    let unknown = "tb.ensure_node(&format!(\"n{i}\"), \"p5.48xlarge\", &[]).await?;";
    let err = nodes_asked_for(unknown).unwrap_err();
    assert!(err.contains("format!"), "{err}");
    let unbound = "tb.ensure_node(name, fixture, &[]).await?;";
    assert!(nodes_asked_for(unbound).is_err());
}
