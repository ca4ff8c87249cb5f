//! `discover --instance-type` against a scan of the fixture of the same
//! type, for every type with a model and both partition modes: the same
//! devices and counter sets, field by field, once the runtime-only
//! attributes are taken out of the scanned devices; and the same groups of
//! devices sharing each runtime-only value. The scan is `discover`'s (no
//! API server, no Node labels) with the chips' PCI addresses answered from
//! the fixture, as the ioctl answers them on a node (a fixture's device
//! nodes have no kernel driver behind them). The list of runtime-only
//! attributes is the one `docs/autoscaling.md` documents.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use dra_core::{DeviceInventory, HostPaths};
use k8s_openapi::api::resource::v1::{CounterSet, Device};
use neuron_driver::bdf::StaticBdf;
use neuron_driver::partitions::PartitionMode;
use neuron_driver::template::RUNTIME_ONLY;
use neuron_driver::{DRIVER_NAME, NeuronInventory};
use serde_json::Value;
use topology::PciAddress;

fn template(instance_type: &str, partitions: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-driver"))
        .args(["discover", "--instance-type", instance_type])
        .args(["--partitions", partitions])
        .env_remove("DRIVER_NAME")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The devices and counter sets `discover` prints on the fixture, with the
/// chips' PCI addresses known.
fn scan(instance_type: &str, mode: PartitionMode) -> (Vec<Device>, Vec<CounterSet>) {
    let dir = tempfile::tempdir().unwrap();
    let fx = sysfs_fixtures::generate(instance_type, dir.path()).unwrap();
    let bdf = StaticBdf {
        answers: fx
            .neuron_chips
            .iter()
            .map(|c| {
                let node = fx.dev.join(format!("neuron{}", c.index));
                (node, Ok(c.bdf.parse::<PciAddress>().unwrap()))
            })
            .collect(),
    };
    let host = HostPaths {
        sysfs_root: fx.sys.clone(),
        dev_root: fx.dev.clone(),
    };
    let mut inventory = NeuronInventory::new(&host, Box::new(bdf)).with_mode(mode);
    let scanned = inventory.scan().unwrap();
    assert!(scanned.iter().all(|s| s.health.conditions.is_empty()));
    let devices = scanned
        .into_iter()
        .map(|s| std::sync::Arc::unwrap_or_clone(s.device))
        .collect();
    (devices, inventory.counter_sets())
}

fn qualified(attribute: &str) -> String {
    if attribute.contains('/') {
        attribute.to_owned()
    } else {
        format!("{DRIVER_NAME}/{attribute}")
    }
}

/// `(qualified attribute, sorted device names)`, sorted.
type Groups = BTreeSet<(String, Vec<String>)>;

/// Takes the runtime-only attributes out of `devices` and returns the
/// groups of devices that shared a value, as the template prints them:
/// groups of two or more, and of one in a shared domain except `pciBusID`.
fn strip(devices: &mut [Device]) -> Groups {
    let mut by_value: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for device in devices.iter_mut() {
        let attributes = device.attributes.as_mut().unwrap();
        for attribute in RUNTIME_ONLY {
            if let Some(value) = attributes.remove(*attribute) {
                let value = serde_json::to_string(&value).unwrap();
                by_value
                    .entry((attribute.to_string(), value))
                    .or_default()
                    .push(device.name.clone());
            }
        }
    }
    by_value
        .into_iter()
        .filter(|((a, _), d)| {
            d.len() >= 2 || (a.contains('/') && a != "resource.kubernetes.io/pciBusID")
        })
        .map(|((a, _), mut d)| {
            d.sort();
            (qualified(&a), d)
        })
        .collect()
}

fn bindings(document: &Value) -> Groups {
    document["attributeBindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let mut devices: Vec<String> = b["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["device"].as_str().unwrap().to_owned())
                .collect();
            devices.sort();
            (b["attribute"].as_str().unwrap().to_owned(), devices)
        })
        .collect()
}

/// Every device and counter set of the template's slices, by name, after
/// checking that each slice is the type's pool on a node named after it.
fn template_pool(document: &Value, it: &str) -> (Vec<Device>, Vec<CounterSet>) {
    assert_eq!(document["kind"], "List");
    let mut devices = Vec::new();
    let mut counters = Vec::new();
    for item in document["items"].as_array().unwrap() {
        assert_eq!(item["kind"], "ResourceSlice");
        assert_eq!(item["spec"]["driver"], DRIVER_NAME);
        assert_eq!(
            (&item["spec"]["pool"]["name"], &item["spec"]["nodeName"]),
            (&it.into(), &it.into())
        );
        if let Some(d) = item["spec"].get("devices") {
            devices.extend(serde_json::from_value::<Vec<Device>>(d.clone()).unwrap());
        }
        if let Some(c) = item["spec"].get("sharedCounters") {
            counters.extend(serde_json::from_value::<Vec<CounterSet>>(c.clone()).unwrap());
        }
    }
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    counters.sort_by(|a, b| a.name.cmp(&b.name));
    (devices, counters)
}

#[test]
fn templates_agree_with_fixture_discover_on_every_type() {
    let types: Vec<&str> = topology::catalog::INSTANCE_MODELS
        .iter()
        .map(|m| m.instance_type)
        .collect();
    let fixtures: Vec<&str> = sysfs_fixtures::instance_types()
        .iter()
        .copied()
        .filter(|t| *t != "m5.8xlarge")
        .collect();
    assert_eq!(types, fixtures);
    let mut published_somewhere = BTreeSet::new();
    for it in types {
        for (flag, mode) in [
            ("chips", PartitionMode::Chips),
            ("cores", PartitionMode::Cores),
        ] {
            let (mut real, mut real_counters) = scan(it, mode);
            for d in &real {
                published_somewhere.extend(d.attributes.as_ref().unwrap().keys().cloned());
            }
            let real_groups = strip(&mut real);
            real.sort_by(|a, b| a.name.cmp(&b.name));
            real_counters.sort_by(|a, b| a.name.cmp(&b.name));
            let document = template(it, flag);
            let (devices, counters) = template_pool(&document, it);
            let names = |d: &[Device]| d.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
            assert_eq!(names(&devices), names(&real), "{it} {flag}");
            for (t, r) in devices.iter().zip(&real) {
                assert_eq!(t, r, "{it} {flag}: {}", t.name);
            }
            assert_eq!(counters, real_counters, "{it} {flag}");
            assert_eq!(bindings(&document), real_groups, "{it} {flag}");
            if !real.is_empty() {
                assert!(!real_groups.is_empty(), "{it}: nothing shared");
            }
        }
    }
    for attribute in RUNTIME_ONLY {
        assert!(
            published_somewhere.contains(*attribute),
            "{attribute} is never published"
        );
    }
}

/// `docs/autoscaling.md` lists exactly these attributes as the Neuron
/// driver's runtime-only ones.
#[test]
fn runtime_only_attributes_are_the_documented_ones() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/autoscaling.md"),
    )
    .unwrap();
    let documented: BTreeSet<&str> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 3 && cells[1] == "Neuron").then(|| cells[2].trim_matches('`'))
        })
        .collect();
    assert_eq!(documented, RUNTIME_ONLY.iter().copied().collect());
}
