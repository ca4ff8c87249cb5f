//! The generated fleet (`tests/support/fleet.rs`) through the library and
//! the binary: the node index, the streaming reader against the plain one,
//! and answers on a fleet.

mod support {
    pub mod fleet;
}

use std::path::Path;
use std::process::Command;

use kubectl_dra::explain::{Allocatable, Scope, explain, subjects_for_claim};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::world::World;
use serde_json::Value;
use support::fleet;

fn load(text: &str) -> Inventory {
    let mut inv = Inventory::default();
    inv.add_text(Path::new("fleet.json"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    inv
}

#[test]
fn the_node_index_holds_each_nodes_devices_in_order() {
    let inv = load(&fleet::json(6));
    let world = World::new(&inv);
    let nodes: Vec<String> = (0..6).map(fleet::node_name).collect();
    let mut sorted = nodes.clone();
    sorted.sort();
    assert_eq!(world.nodes(), sorted);
    for node in &nodes {
        let want: Vec<usize> = (0..world.devices.len())
            .filter(|&i| world.devices[i].node == Some(node.as_str()))
            .collect();
        assert_eq!(world.on_node(node), want, "{node}");
        let per_node = if node.starts_with("trn2") {
            144 + 16
        } else {
            32
        };
        assert_eq!(want.len(), per_node, "{node}");
    }
    assert!(world.on_node("nowhere").is_empty());
    let first = &world.devices[world.on_node(&nodes[0])[0]];
    assert_eq!(world.index_of(&first.id), Some(world.on_node(&nodes[0])[0]));
}

/// Items whose `spec` comes before `kind` cannot take the typed shortcut;
/// both ways must read the same slices.
#[test]
fn the_typed_shortcut_reads_what_the_plain_way_reads() {
    let objects = fleet::objects(4);
    let spec_first: Vec<String> = objects
        .iter()
        .map(|o| {
            let Value::Object(map) = o else {
                return o.to_string();
            };
            let mut fields: Vec<String> = Vec::new();
            for key in ["spec", "metadata", "kind", "apiVersion", "status"] {
                if let Some(v) = map.get(key) {
                    fields.push(format!("{}:{v}", Value::String(key.to_string())));
                }
            }
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    let plain = load(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{}]}}",
        spec_first.join(",")
    ));
    let fast = load(&fleet::json(4));
    assert_eq!(fast.slices.len(), 2 * 6 + 2);
    assert_eq!(fast.slices, plain.slices);
    assert_eq!(fast.claims, plain.claims);
    assert_eq!(fast.classes, plain.classes);
}

#[test]
fn a_broken_slice_is_reported_by_name_either_way() {
    let mut objects = fleet::objects(2);
    objects[1]["spec"]["pool"]["generation"] = Value::String("one".to_string());
    let name = objects[1]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let text =
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
    let mut inv = Inventory::default();
    let e = inv
        .add_text(Path::new("fleet.json"), &text)
        .expect_err("broken");
    let e = e.to_string();
    assert!(e.contains(&format!("ResourceSlice {name:?}")), "{e}");
    assert!(
        e.contains("does not match the resource.k8s.io/v1 schema"),
        "{e}"
    );
}

#[test]
fn the_pending_claim_fits_and_the_binary_answers_on_a_fleet() {
    let text = fleet::json(8);
    let inv = load(&text);
    let world = World::new(&inv);
    let subjects = subjects_for_claim(&inv, "default", "train").unwrap_or_else(|e| panic!("{e}"));
    let e = explain(&world, &subjects[0], &Scope::default());
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", e.verdict);

    let dir = std::env::temp_dir().join(format!("kubectl-dra-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.join("fleet.json");
    std::fs::write(&file, &text).unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
            .arg("-f")
            .arg(&file)
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&["explain", "pod", "neuron-4-chips-with-efas"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run(&["devices", "--node", &fleet::node_name(1)]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 1 + 32, "{out}");
    let (code, out, err) = run(&["topology", &fleet::node_name(2), "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("neurondevice15"), "{out}");
    assert!(err.is_empty(), "no progress lines from -f: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
