//! Reading files: formats, lists, versions, errors.

use super::*;

#[test]
fn reads_lists_multi_documents_and_discover_output() {
    let mut inv = Inventory::default();
    let discover = include_str!("../../tests/fixtures/trn1-neuron.yaml");
    inv.add_text(Path::new("trn1-neuron.yaml"), discover)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inv.slices.len(), 1);
    assert_eq!(inv.slices[0].devices.len(), 16);

    let multi = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: a}\nspec: {}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
    inv.add_text(Path::new("multi.yaml"), multi)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inv.classes.len(), 1);
    assert_eq!(inv.ignored, 1);

    let json_list = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimList","items":[{"metadata":{"name":"x","namespace":"ns"},"spec":{}}]}"#;
    inv.add_text(Path::new("l.json"), json_list)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(inv.claim("ns", "x").is_some());
}

#[test]
fn rejects_other_api_versions_and_bad_schema_by_name() {
    let mut inv = Inventory::default();
    let beta = "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata: {name: old}\nspec: {}\n";
    let err = inv
        .add_text(Path::new("b.yaml"), beta)
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("old") && e.contains("v1beta1")));
    let bad = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\nspec: {devices: {requests: 3}}\n";
    let err = inv
        .add_text(Path::new("c.yaml"), bad)
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("\"bad\"")));
}

#[test]
fn reads_device_taint_rules_of_any_version() {
    let mut inv = Inventory::default();
    let rule = "apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\nmetadata: {name: maint}\nspec:\n  deviceSelector: {driver: efa.networking.k8s.aws, pool: p5, device: efa-0}\n  taint: {key: example.com/maintenance, value: x, effect: NoSchedule}\n---\napiVersion: resource.k8s.io/v1alpha3\nkind: DeviceTaintRule\nmetadata: {name: all-efa}\nspec:\n  deviceSelector: {driver: efa.networking.k8s.aws}\n  taint: {key: k, effect: NoExecute}\n";
    inv.add_text(Path::new("r.yaml"), rule)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inv.taint_rules.len(), 2);
    let maint = &inv.taint_rules[0];
    assert_eq!(maint.name, "maint");
    assert_eq!(maint.taint.key, "example.com/maintenance");
    assert!(maint.selects("efa.networking.k8s.aws", "p5", "efa-0"));
    assert!(!maint.selects("efa.networking.k8s.aws", "p5", "efa-1"));
    assert!(!maint.selects("efa.networking.k8s.aws", "trn2", "efa-0"));
    assert!(inv.taint_rules[1].selects("efa.networking.k8s.aws", "trn2", "efa-9"));
    assert!(!inv.taint_rules[1].selects("neuron.aws.com", "trn2", "efa-9"));
}

/// kubectl puts `items` before `kind`; items may lack their kind; an object
/// that is not a list may still have a field called `items`.
#[test]
fn json_lists_in_any_key_order() {
    let slice = |name: &str| {
        format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{{"name":"{name}"}},"spec":{{"driver":"d","nodeName":"n","pool":{{"name":"p","generation":1,"resourceSliceCount":2}},"devices":[{{"name":"x"}}]}}}}"#
        )
    };
    let mut inv = Inventory::default();
    let text = format!(
        r#"{{"apiVersion":"v1","items":[{},{}],"kind":"List","metadata":{{}}}}"#,
        slice("a"),
        slice("b")
    );
    inv.add_text(Path::new("l.json"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = inv.slices.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["a", "b"]);

    // Kind-less items take the list's kind, in their place in the list.
    let mut inv = Inventory::default();
    let text = format!(
        r#"{{"items":[{},{{"metadata":{{"name":"c"}},"spec":{{"devices":{{"requests":[]}}}}}},{}],"kind":"ResourceSliceList"}}"#,
        slice("a"),
        slice("b")
    );
    let text = text.replace(
        r#"{"metadata":{"name":"c"},"spec":{"devices":{"requests":[]}}}"#,
        r#"{"metadata":{"name":"c"},"spec":{"driver":"d","pool":{"name":"q","generation":1,"resourceSliceCount":1}}}"#,
    );
    inv.add_text(Path::new("l.json"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = inv.slices.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["a", "c", "b"]);

    // Not a list: `items` is just a field, and the object counts as ignored.
    let mut inv = Inventory::default();
    let text = format!(
        r#"{{"kind":"ConfigMap","items":[{}],"data":{{}}}}"#,
        slice("a")
    );
    inv.add_text(Path::new("c.json"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(inv.slices.is_empty());
    assert_eq!(inv.ignored, 1);
    assert!(inv.pools_complete());
}

#[test]
fn incomplete_pools_are_found() {
    let mut inv = Inventory::default();
    let text = r#"{"kind":"ResourceSlice","apiVersion":"resource.k8s.io/v1","metadata":{"name":"a"},"spec":{"driver":"d","nodeName":"n","pool":{"name":"p","generation":1,"resourceSliceCount":2}}}"#;
    inv.add_text(Path::new("a.json"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!inv.pools_complete());
}
