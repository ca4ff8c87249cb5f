//! A fleet of nodes made from our drivers' real `discover` output, for the
//! tests, the benchmark and `examples/fleet.rs` (included with `#[path]`,
//! so that it stays out of the library's API).
//!
//! Half the nodes are trn2.48xlarge with NeuronCore partitions (16 chips
//! and 128 cores in five Neuron slices, two of them counter sets, and 16
//! EFAs), half p5.48xlarge (32 EFAs). The templates in
//! `tests/fixtures/fleet/` are `neuron-driver discover --partitions cores`
//! and `efa-driver discover` on `cargo xtask fixtures trn2.48xlarge` and
//! `p5.48xlarge` trees, for a node called `trn2` or `p5`; each node gets
//! its own node, pool and slice names. A trn2 and a p5 node of every four
//! have a claim allocated (four EFAs, and on trn2 two NeuronCores). Added: the
//! DeviceClasses the charts install, the pod and template of
//! `examples/neuron/neuron-4-chips-with-efas.yaml`, and a pending claim
//! `train` (8 whole chips and 8 EFAs sharing a devicegroup8_id).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn read(path: &str) -> String {
    let path = dir().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn template(name: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(&read(&format!("tests/fixtures/fleet/{name}")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    match list.get("items") {
        Some(Value::Array(items)) => items.clone(),
        _ => panic!("{name}: not a List"),
    }
}

/// Node `i` of a fleet: its name and shape (`trn2` or `p5`).
pub fn node_name(i: usize) -> String {
    let shape = if i.is_multiple_of(2) { "trn2" } else { "p5" };
    format!("{shape}-{i:04}")
}

/// One node's slices, renamed from the template node `from` to `to`.
fn renamed(slices: &[Value], from: &str, to: &str) -> Vec<Value> {
    slices
        .iter()
        .map(|slice| {
            let mut s = slice.clone();
            if let Some(name) = s.pointer("/metadata/name").and_then(Value::as_str) {
                let name = format!("{to}{}", name.strip_prefix(from).unwrap_or(name));
                s["metadata"]["name"] = Value::String(name);
            }
            s["spec"]["nodeName"] = Value::String(to.to_string());
            s["spec"]["pool"]["name"] = Value::String(to.to_string());
            s
        })
        .collect()
}

fn device_names(slices: &[Value], driver: &str) -> Vec<String> {
    slices
        .iter()
        .filter(|s| s.pointer("/spec/driver").and_then(Value::as_str) == Some(driver))
        .flat_map(|s| {
            s.pointer("/spec/devices")
                .and_then(Value::as_array)
                .cloned()
        })
        .flatten()
        .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

fn holder(n: usize, node: &str, devices: &[(&str, &str, String)]) -> Value {
    let requests: Vec<&str> = {
        let mut r: Vec<&str> = devices.iter().map(|(req, _, _)| *req).collect();
        r.dedup();
        r
    };
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("holder-{n}"), "namespace": "jobs"},
        "spec": {"devices": {"requests": requests.iter().map(|r| {
            let (class, count) = match *r {
                "efas" => ("efa.networking.k8s.aws", 4),
                _ => ("neuron.aws.com", 2),
            };
            json!({"name": r, "exactly": {"deviceClassName": class, "count": count}})
        }).collect::<Vec<_>>()}},
        "status": {"allocation": {"devices": {"results": devices.iter().map(|(req, driver, d)| json!({
            "request": req, "driver": driver, "pool": node, "device": d
        })).collect::<Vec<_>>()}}}
    })
}

/// Every object of a fleet of `nodes` nodes, slices first.
pub fn objects(nodes: usize) -> Vec<Value> {
    let trn2: Vec<Value> = template("trn2-neuron.json")
        .into_iter()
        .chain(template("trn2-efa.json"))
        .collect();
    let p5 = template("p5-efa.json");
    let mut out = Vec::new();
    let mut holders = Vec::new();
    for i in 0..nodes {
        let node = node_name(i);
        let slices = if i.is_multiple_of(2) {
            renamed(&trn2, "trn2", &node)
        } else {
            renamed(&p5, "p5", &node)
        };
        if i % 4 < 2 {
            let mut held: Vec<(&str, &str, String)> =
                device_names(&slices, "efa.networking.k8s.aws")
                    .into_iter()
                    .take(4)
                    .map(|d| ("efas", "efa.networking.k8s.aws", d))
                    .collect();
            held.extend(
                device_names(&slices, "neuron.aws.com")
                    .into_iter()
                    .filter(|d| d.contains("-core-"))
                    .take(2)
                    .map(|d| ("cores", "neuron.aws.com", d)),
            );
            holders.push(holder(i, &node, &held));
        }
        out.extend(slices);
    }
    let classes: Vec<Value> = serde_saphyr::from_multiple(&read("tests/fixtures/classes.yaml"))
        .unwrap_or_else(|e| panic!("classes.yaml: {e}"));
    out.extend(classes);
    out.extend(holders);
    let example: Vec<Value> =
        serde_saphyr::from_multiple(&read("../../examples/neuron/neuron-4-chips-with-efas.yaml"))
            .unwrap_or_else(|e| panic!("neuron-4-chips-with-efas.yaml: {e}"));
    out.extend(example.into_iter().map(|mut o| {
        o["metadata"]["namespace"] = Value::String("default".to_string());
        o
    }));
    out.push(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"devices": {
            "requests": [
                {"name": "chips", "exactly": {
                    "deviceClassName": "neuron.aws.com", "count": 8,
                    "selectors": [{"cel": {"expression":
                        "device.attributes[\"neuron.aws.com\"].resourceType == \"neuron_device\""}}]
                }},
                {"name": "efas", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 8}}
            ],
            "constraints": [{"requests": ["chips", "efas"],
                             "matchAttribute": "resource.aws.com/devicegroup8_id"}]
        }}
    }));
    out
}

/// The fleet as one JSON `List`, one object a line (what `-f` reads).
pub fn json(nodes: usize) -> String {
    let mut text = String::from("{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[\n");
    for (i, o) in objects(nodes).iter().enumerate() {
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&o.to_string());
    }
    text.push_str("\n]}\n");
    text
}
