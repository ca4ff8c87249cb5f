//! `discover --instance-type`: what a node of an instance type publishes,
//! printed before any such node exists, for an autoscaler to plan with
//! (Karpenter's `ResourceSliceTemplates` and `AttributeBindings`).
//!
//! The driver builds the devices from its model of the type with the code
//! its scans use ([`DeviceInventory::instance_template`]). This module
//! takes out every attribute the driver names as runtime-only and says
//! instead which devices share each of its values: one binding per value,
//! listing the devices that carry it, under an opaque `group` key (a hash
//! of the attribute and the stand-in value). Both drivers build stand-ins
//! from one model, so a group of the EFA driver and one of the Neuron driver
//! with the same attribute and key are the same group, and merging their
//! bindings pairs EFAs with chips.
//!
//! Which groups are printed: those of two devices or more, and for an
//! attribute of a shared domain (`resource.kubernetes.io`,
//! `resource.aws.com`: any with a `/`) also those of one device, whose value
//! another driver's devices may share (an EFA's `devicegroup1_id` is its
//! chips' on trn1). `pciBusID` names one PCI function, so its groups of one
//! are left out.
//!
//! [`DeviceInventory::instance_template`]: crate::DeviceInventory::instance_template

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, Device};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::publish::desired_slices_with_counters;
use crate::scan::attributes::PCI_BUS_ID;

/// Characters of the hex SHA-256 a group key keeps.
const GROUP_KEY_LEN: usize = 12;

/// The name a claim's `matchAttribute` uses: an attribute without a domain
/// is in the driver's.
fn qualified(driver: &str, attribute: &str) -> String {
    if attribute.contains('/') {
        attribute.to_owned()
    } else {
        format!("{driver}/{attribute}")
    }
}

fn group_key(attribute: &str, value: &str) -> String {
    let digest = Sha256::digest(format!("{attribute}={value}").as_bytes());
    hex::encode(digest)[..GROUP_KEY_LEN].to_owned()
}

/// Whether a group of one device is worth printing (the module doc).
fn single_device_group_kept(attribute: &str) -> bool {
    attribute.contains('/') && attribute != PCI_BUS_ID
}

/// The document `discover --instance-type` prints: a kubectl-style List of
/// the pool's slices (devices without their runtime-only attributes; pool
/// and node named `pool`), with `attributeBindings` and
/// `runtimeOnlyAttributes` beside `items`.
pub(crate) fn template_document(
    driver: &str,
    pool: &str,
    mut devices: Vec<Device>,
    counter_sets: &[CounterSet],
    runtime_only: &[&str],
) -> Value {
    // (attribute as the driver names it, stand-in value as JSON) →
    // devices, in order.
    let mut groups: BTreeMap<(&str, String), Vec<String>> = BTreeMap::new();
    for device in &mut devices {
        let Some(attributes) = device.attributes.as_mut() else {
            continue;
        };
        for name in runtime_only {
            if let Some(value) = attributes.remove(*name) {
                let value = serde_json::to_string(&value).unwrap_or_default();
                groups
                    .entry((*name, value))
                    .or_default()
                    .push(device.name.clone());
            }
        }
    }
    let bindings: Vec<Value> = groups
        .into_iter()
        .filter(|((attribute, _), names)| names.len() >= 2 || single_device_group_kept(attribute))
        .map(|((attribute, value), names)| {
            let attribute = qualified(driver, attribute);
            let members: Vec<Value> = names
                .iter()
                .map(|name| json!({"driver": driver, "pool": pool, "device": name}))
                .collect();
            json!({
                "attribute": attribute,
                "group": group_key(&attribute, &value),
                "devices": members,
            })
        })
        .collect();
    let runtime_only: Vec<String> = runtime_only.iter().map(|a| qualified(driver, a)).collect();
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": desired_slices_with_counters(driver, pool, None, &devices, counter_sets),
        "attributeBindings": bindings,
        "runtimeOnlyAttributes": runtime_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::attributes::{PCIE_ROOT, int, string};

    fn device(name: &str, attributes: &[(&str, &str)]) -> Device {
        Device {
            name: name.into(),
            attributes: Some(
                attributes
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), string(*v)))
                    .chain([("index".to_owned(), int(1))])
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// Runtime-only attributes leave the devices and come back as groups:
    /// of two or more, and of one only in a shared domain other than
    /// `pciBusID`; keys equal exactly where attribute and value are.
    #[test]
    fn runtime_only_attributes_become_groups() {
        let devices = vec![
            device("a", &[(PCIE_ROOT, "r1"), (PCI_BUS_ID, "1"), ("fw", "x")]),
            device("b", &[(PCIE_ROOT, "r1"), (PCI_BUS_ID, "2"), ("fw", "y")]),
            device("c", &[(PCIE_ROOT, "r2"), (PCI_BUS_ID, "3"), ("fw", "y")]),
        ];
        let doc = template_document(
            "d.example.com",
            "p",
            devices,
            &[],
            &[PCIE_ROOT, PCI_BUS_ID, "fw"],
        );
        assert_eq!(doc["kind"], "List");
        let items = doc["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        for d in items[0]["spec"]["devices"].as_array().unwrap() {
            let names: Vec<&String> = d["attributes"].as_object().unwrap().keys().collect();
            assert_eq!(names, ["index"], "{d}");
        }
        let groups: Vec<(String, Vec<String>)> = doc["attributeBindings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let devices = b["devices"].as_array().unwrap();
                assert!(devices.iter().all(|d| d["driver"] == "d.example.com"));
                let names = devices
                    .iter()
                    .map(|d| d["device"].as_str().unwrap().to_owned());
                (b["attribute"].as_str().unwrap().to_owned(), names.collect())
            })
            .collect();
        let want = |a: &str, d: &[&str]| (a.to_owned(), d.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            groups,
            vec![
                want("d.example.com/fw", &["b", "c"]),
                want(PCIE_ROOT, &["a", "b"]),
                want(PCIE_ROOT, &["c"]),
            ]
        );
        let key = |i: usize| {
            doc["attributeBindings"][i]["group"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(key(1), group_key(PCIE_ROOT, r#"{"string":"r1"}"#));
        assert_ne!(key(1), key(2));
        assert_eq!(key(1).len(), GROUP_KEY_LEN);
        assert_eq!(
            doc["runtimeOnlyAttributes"],
            json!([PCIE_ROOT, PCI_BUS_ID, "d.example.com/fw"])
        );
    }
}
