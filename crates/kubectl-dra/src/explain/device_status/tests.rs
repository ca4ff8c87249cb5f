use std::path::Path;

use super::*;
use crate::explain::{Allocatable, Scope, explain, subjects_for_claim};
use crate::inventory::Inventory;

const CLASSES: &str = include_str!("../../../tests/fixtures/classes.yaml");
const TRN2_EFA: &str = include_str!("../../../tests/fixtures/trn2-efa.yaml");
const TRN2_NEURON: &str = include_str!("../../../tests/fixtures/trn2-neuron.yaml");
const CLAIM: &str = include_str!("../../../tests/fixtures/trn2-claim-status.yaml");

fn inventory(claim: &str) -> Inventory {
    let mut inv = Inventory::default();
    for (i, d) in [CLASSES, TRN2_EFA, TRN2_NEURON, claim].iter().enumerate() {
        inv.add_text(Path::new(&format!("doc{i}")), d)
            .unwrap_or_else(|e| panic!("doc{i}: {e}"));
    }
    inv
}

fn explained(inv: &Inventory) -> crate::explain::Explanation {
    let world = World::new(inv);
    let subjects = subjects_for_claim(inv, "default", "chip-and-efa").unwrap();
    explain(&world, &subjects[0], &Scope::default())
}

#[test]
fn an_allocated_claim_shows_each_drivers_entries() {
    let inv = inventory(CLAIM);
    let e = explained(&inv);
    assert_eq!(e.allocatable, Allocatable::Allocated);
    assert!(e.problems.is_empty(), "{:?}", e.problems);
    let got: Vec<(&str, &str, Option<&str>)> = e
        .device_status
        .iter()
        .map(|s| (s.driver.as_str(), s.device.as_str(), s.ready.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            ("neuron.aws.com", "neurondevice0", Some("True")),
            ("efa.networking.k8s.aws", "efa-0000-c9-00-0", Some("False")),
        ]
    );

    let text = crate::render::explanation(&e);
    let status: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("status.devices"))
        .take(6)
        .collect();
    assert_eq!(
        status,
        [
            "  device status (status.devices):",
            "    neuron.aws.com trn2/neurondevice0: Ready=True (Prepared: prepared; the device is healthy)",
            "      data: chip=0, cores=[0,1,2,3,4,5,6,7], deviceNode=/dev/neuron0, logicalNeuronCore=2, visibleCores=0-3",
            "    efa.networking.k8s.aws trn2/efa-0000-c9-00-0: Ready=False (Unhealthy: the device is unhealthy: admin queue closed)",
            "      data: pciBusID=0000:c9:00.0, pcieRoot=pci0000:c5, portState=ACTIVE, rdmaDevice=rdmap201s0, uverbsDevice=/dev/infiniband/uverbs9",
            "      networkData: hardwareAddress=0a:1b:2c:3d:4e:5f, interfaceName=eth9",
        ],
        "{text}"
    );

    // JSON keeps the whole data object.
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["deviceStatus"][0]["data"]["visibleCores"], "0-3");
    assert_eq!(json["deviceStatus"][1]["network"]["interfaceName"], "eth9");
}

#[test]
fn a_claim_without_entries_shows_none() {
    let bare = CLAIM.split("\n  devices:\n  - driver").next().unwrap();
    let e = explained(&inventory(bare));
    assert_eq!(e.allocatable, Allocatable::Allocated);
    assert!(e.device_status.is_empty());
    let text = crate::render::explanation(&e);
    assert!(!text.contains("status.devices"), "{text}");
    let json = serde_json::to_value(&e).unwrap();
    assert!(json.get("deviceStatus").is_none());
}

#[test]
fn long_values_are_cut_in_the_text_only() {
    let long = "x".repeat(100);
    let cut = compact(&serde_json::json!({"k": long})).unwrap();
    assert_eq!(cut.chars().count(), "k=".len() + VALUE_CHARS);
    assert!(cut.ends_with('…'));
    assert_eq!(compact(&serde_json::json!({})), None);
    assert_eq!(compact(&Value::Null), None);
}
