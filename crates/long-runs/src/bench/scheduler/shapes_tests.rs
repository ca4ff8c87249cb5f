use super::*;

/// A chips-only Neuron slice and an EFA slice as `discover` prints them
/// for node `template` (two devices each, attributes trimmed).
fn neuron_slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "template-neuron.aws.com-0"},
        "spec": {
            "driver": "neuron.aws.com",
            "nodeName": "template",
            "pool": {"name": "template", "generation": 3, "resourceSliceCount": 1},
            "devices": [
                {"name": "neurondevice0", "attributes": {
                    "deviceId": {"int": 0},
                    "resourceType": {"string": "neuron_device"},
                    "coreCount": {"int": 8},
                    "topology4_id": {"int": 0},
                    "resource.aws.com/devicegroup4_id": {"string": "0000:10:1b.0"},
                    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
                }, "capacity": {"cores": {"value": "8"}}},
                {"name": "neuronnode", "attributes": {
                    "resourceType": {"string": "neuron_node"},
                }},
            ],
        },
    })
}

fn efa_slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "template-efa"},
        "spec": {
            "driver": "efa.networking.k8s.aws",
            "nodeName": "template",
            "pool": {"name": "template", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "efa-0000-10-1b-0", "attributes": {
                    "resource.kubernetes.io/pciBusID": {"string": "0000:10:1B.0"},
                    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
                    "resource.kubernetes.io/numaNode": {"int": 0},
                    "resource.aws.com/devicegroup1_id": {"string": "0000:10:1b.0"},
                    "rdmaDevice": {"string": "rdmap16s27"},
                    "instanceType": {"string": "trn2.48xlarge"},
                }},
                {"name": "no-bdf", "attributes": {}},
            ],
        },
    })
}

#[test]
fn each_node_gets_its_own_named_owned_copy_in_its_own_pool() {
    let t = NodeTemplate {
        shape: Shape::Trn2Chips,
        slices: vec![neuron_slice(), efa_slice()],
        classes: vec![],
    };
    let copies = t.for_node("n00042", "uid-42");
    assert_eq!(copies.len(), 2);
    assert_eq!(copies[0]["metadata"]["name"], "n00042-neuron-0");
    assert_eq!(copies[1]["metadata"]["name"], "n00042-efa-1");
    for c in &copies {
        assert_eq!(c["spec"]["nodeName"], "n00042");
        assert_eq!(c["spec"]["pool"]["name"], "n00042");
        assert_eq!(c["metadata"]["labels"][LABEL], "true");
        assert_eq!(c["metadata"]["ownerReferences"][0]["uid"], "uid-42");
        assert_eq!(c["metadata"]["ownerReferences"][0]["kind"], "Node");
    }
    // Everything else is the template's: generation, count, devices.
    assert_eq!(copies[0]["spec"]["pool"]["generation"], 3);
    assert_eq!(
        copies[0]["spec"]["devices"],
        neuron_slice()["spec"]["devices"]
    );
    assert_eq!(t.devices(), 4);
    // Two nodes never share a slice name.
    assert_ne!(
        t.for_node("a", "1")[0]["metadata"]["name"],
        t.for_node("b", "2")[0]["metadata"]["name"]
    );
}

#[test]
fn a_slice_without_a_node_name_stays_without_one() {
    let mut counters = neuron_slice();
    counters["spec"].as_object_mut().unwrap().remove("nodeName");
    counters["spec"]["allNodes"] = json!(true);
    let copy = slice_for_node(&counters, 0, "n1", "u");
    assert!(copy["spec"].get("nodeName").is_none());
    assert_eq!(copy["spec"]["pool"]["name"], "n1");
}

#[test]
fn aws_neuron_shape_keeps_chips_and_aws_attributes_only() {
    let aws = aws_neuron_slices(&[neuron_slice()]);
    assert_eq!(aws.len(), 1);
    let devices = aws[0]["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "the whole-node device is not AWS's chip");
    assert_eq!(devices[0]["name"], "neurondevice0");
    let mut attrs: Vec<&str> = devices[0]["attributes"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    attrs.sort_unstable();
    assert_eq!(
        attrs,
        [
            "deviceId",
            "resource.aws.com/devicegroup4_id",
            "resourceType",
            "topology4_id"
        ]
    );
    assert!(devices[0].get("capacity").is_none());
    assert_eq!(aws[0]["spec"]["driver"], "neuron.aws.com");
    assert_eq!(aws[0]["spec"]["pool"]["resourceSliceCount"], 1);
    assert!(aws_neuron_slices(&[]).is_empty());
}

#[test]
fn dranet_shape_names_efas_by_pci_address_under_its_driver() {
    let slices = dranet_slices(&[efa_slice()]);
    assert_eq!(slices.len(), 1);
    let spec = &slices[0]["spec"];
    assert_eq!(spec["driver"], "dra.net");
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(
        devices.len(),
        1,
        "a device without a PCI address is skipped"
    );
    let d = &devices[0];
    assert_eq!(d["name"], "pci-0000-10-1b-0");
    let a = &d["attributes"];
    assert_eq!(a["dra.net/pciAddress"]["string"], "0000:10:1B.0");
    assert_eq!(
        a["dra.net/pciDevice"]["string"],
        "Elastic Fabric Adapter (EFA)"
    );
    assert_eq!(a["dra.net/rdma"]["bool"], true);
    assert_eq!(a["dra.net/rdmaDevice"]["string"], "rdmap16s27");
    assert_eq!(a["dra.net/numaNode"]["int"], 0);
    assert_eq!(a["resource.kubernetes.io/numaNode"]["int"], 0);
    assert_eq!(a["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:10");
    assert_eq!(
        a["resource.aws.com/devicegroup1_id"]["string"],
        "0000:10:1b.0"
    );
    assert!(a.get("instanceType").is_none());
    assert!(a.get("rdmaDevice").is_none());
}

#[test]
fn aws_classes_select_dranet_efas_and_any_neuron_device() {
    let classes = aws_classes();
    let names: Vec<&str> = classes
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["neuron.aws.com", "efa.networking.k8s.aws"]);
    let efa = classes[1]["spec"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    assert!(efa.contains("device.driver == \"dra.net\""), "{efa}");
    assert!(
        efa.contains("pciDevice == 'Elastic Fabric Adapter (EFA)'"),
        "{efa}"
    );
    for c in classes {
        let _: k8s_openapi::api::resource::v1::DeviceClass = serde_json::from_value(c).unwrap();
    }
}

#[test]
fn shapes_parse_by_name_and_pick_their_claims() {
    for s in Shape::ALL {
        assert_eq!(Shape::parse(s.name()), Some(s));
    }
    assert_eq!(Shape::parse("trn3"), None);
    assert_eq!(Shape::Trn2Cores.claims(), Shape::Trn2Aws.claims());
    assert_eq!(Shape::Trn2Chips.claims().len(), 4);
    assert_eq!(Shape::Trn2u.claims(), [ClaimKind::UltraServerNode]);
    assert!(Shape::Trn2Cores.profiled() && Shape::Trn2Chips.profiled());
    assert!(!Shape::Trn2Aws.profiled());
}
