use super::*;
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourcePool, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

const NODE: &str = "ip-10-0-0-1";
const EFA: &str = "efa.networking.k8s.aws";
const NEURON: &str = "neuron.aws.com";

fn device(name: &str, attrs: &[(&str, &str)]) -> Device {
    Device {
        name: name.into(),
        attributes: Some(
            attrs
                .iter()
                .map(|(k, v)| {
                    (
                        (*k).to_string(),
                        DeviceAttribute {
                            string: Some((*v).to_string()),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn efa(bdf: &str) -> Device {
    let name = format!("efa-{}", bdf.replace([':', '.'], "-"));
    device(&name, &[(PCI_BUS_ID, bdf)])
}

fn slice(name: &str, driver: &str, manager: Option<&str>, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            managed_fields: manager.map(|m| {
                vec![ManagedFieldsEntry {
                    manager: Some(m.into()),
                    operation: Some("Update".into()),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(NODE.into()),
            pool: ResourcePool {
                name: NODE.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

fn ours() -> Vec<Device> {
    vec![
        efa("0000:10:1b.0"),
        efa("0000:20:1b.0"),
        efa("0000:30:1b.0"),
    ]
}

/// (observed slices, our driver, expected withheld devices, expected sources)
#[test]
fn decision_table() {
    let dranet = |name: &str, devs: Vec<Device>| slice(name, "dra.net", Some("dranet"), devs);
    type Case = (
        &'static str,
        Vec<ResourceSlice>,
        &'static str,
        Vec<&'static str>,
        Vec<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        ("nothing else on the node", vec![], EFA, vec![], vec![]),
        (
            "our own slice, by field manager",
            vec![slice("x-anything", EFA, Some(FIELD_MANAGER), vec![])],
            EFA,
            vec![],
            vec![],
        ),
        (
            "our own slice, by deterministic name (older version, no field manager)",
            vec![slice(
                &format!("{NODE}-{EFA}-0"),
                EFA,
                Some("kube-rs"),
                vec![],
            )],
            EFA,
            vec![],
            vec![],
        ),
        (
            "DRANET lists one of our EFAs (qualified attribute)",
            vec![dranet(
                "n-dra.net-abcde",
                vec![
                    device(
                        "pci-0000-20-1b-0",
                        &[("dra.net/pciAddress", "0000:20:1b.0")],
                    ),
                    device("eth0", &[("dra.net/pciAddress", "0000:00:05.0")]),
                ],
            )],
            EFA,
            vec!["efa-0000-20-1b-0"],
            vec![("dra.net", "n-dra.net-abcde")],
        ),
        (
            "DRANET, unqualified attribute in its own domain, upper case",
            vec![dranet(
                "d",
                vec![device("p", &[("pciAddress", "0000:30:1B.0")])],
            )],
            EFA,
            vec!["efa-0000-30-1b-0"],
            vec![("dra.net", "d")],
        ),
        (
            "DRANET, only the standard pciBusID",
            vec![dranet(
                "d",
                vec![device("p", &[(PCI_BUS_ID, "0000:10:1b.0")])],
            )],
            EFA,
            vec!["efa-0000-10-1b-0"],
            vec![("dra.net", "d")],
        ),
        (
            "a driver not in the table is ignored even with our PCI address",
            vec![slice(
                "g",
                "gpu.nvidia.com",
                Some("x"),
                vec![device("gpu-0", &[(PCI_BUS_ID, "0000:10:1b.0")])],
            )],
            EFA,
            vec![],
            vec![],
        ),
        (
            "an unqualified pciBusID of another domain is not the standard one",
            vec![dranet(
                "d",
                vec![device("p", &[("pciBusID", "0000:10:1b.0")])],
            )],
            EFA,
            vec![],
            vec![],
        ),
        (
            "garbage PCI address matches nothing",
            vec![dranet(
                "d",
                vec![device("p", &[("dra.net/pciAddress", "10:1b")])],
            )],
            EFA,
            vec![],
            vec![],
        ),
        (
            "a foreign slice of our driver: the whole pool is withheld",
            vec![
                slice(&format!("{NODE}-{EFA}-0"), EFA, Some(FIELD_MANAGER), vec![]),
                slice(
                    &format!("{NODE}-{EFA}-x7k2q"),
                    EFA,
                    Some("neuron-dra"),
                    vec![],
                ),
            ],
            EFA,
            vec!["efa-0000-10-1b-0", "efa-0000-20-1b-0", "efa-0000-30-1b-0"],
            vec![(EFA, "ip-10-0-0-1-efa.networking.k8s.aws-x7k2q")],
        ),
        (
            "the Go helper's generateName of five digits is not an index of ours",
            vec![slice(
                &format!("{NODE}-{EFA}-24567"),
                EFA,
                Some("neuron-dra"),
                vec![],
            )],
            EFA,
            vec!["efa-0000-10-1b-0", "efa-0000-20-1b-0", "efa-0000-30-1b-0"],
            vec![(EFA, "ip-10-0-0-1-efa.networking.k8s.aws-24567")],
        ),
        (
            "a slice of our driver on another node is none of our business",
            vec![{
                let mut s = slice("other", EFA, Some("x"), vec![]);
                s.spec.node_name = Some("other-node".into());
                s
            }],
            EFA,
            vec![],
            vec![],
        ),
        (
            "DRANET is matched for any of our drivers (data, not per driver)",
            vec![dranet(
                "d",
                vec![device("p", &[("dra.net/pciAddress", "0000:10:1b.0")])],
            )],
            NEURON,
            vec!["efa-0000-10-1b-0"],
            vec![("dra.net", "d")],
        ),
    ];
    for (what, observed, driver, want_devices, want_sources) in cases {
        let refs: Vec<&ResourceSlice> = observed.iter().collect();
        let c = find_clashes(driver, NODE, &refs, &ours(), FOREIGN_PUBLISHERS);
        let got: Vec<&str> = c.withheld.keys().map(String::as_str).collect();
        assert_eq!(got, want_devices, "{what}");
        let sources: Vec<(String, String)> = c
            .by_source()
            .into_keys()
            .map(|s| (s.driver, s.slice))
            .collect();
        let want: Vec<(String, String)> = want_sources
            .iter()
            .map(|(d, s)| ((*d).to_string(), (*s).to_string()))
            .collect();
        assert_eq!(sources, want, "{what}");
        assert_eq!(
            c.is_empty(),
            want_devices.is_empty() && want.is_empty(),
            "{what}"
        );
    }
}

#[test]
fn reasons_name_the_other_device_and_address() {
    let s = slice(
        "d",
        "dra.net",
        None,
        vec![device(
            "pci-0000-20-1b-0",
            &[
                ("dra.net/pciAddress", "0000:20:1b.0"),
                (PCI_BUS_ID, "0000:20:1b.0"),
            ],
        )],
    );
    let c = find_clashes(EFA, NODE, &[&s], &ours(), FOREIGN_PUBLISHERS);
    // Both attributes name the same address: one reason, not two.
    assert_eq!(
        c.withheld["efa-0000-20-1b-0"],
        vec![(
            ClashSource {
                driver: "dra.net".into(),
                slice: "d".into()
            },
            ClashReason::SamePciAddress {
                device: "pci-0000-20-1b-0".into(),
                pci_address: "0000:20:1b.0".into()
            }
        )]
    );
    assert_eq!(
        c.count_by_driver(),
        BTreeMap::from([("dra.net".to_string(), 1)])
    );
    assert!(!c.pool_withdrawn());
}

#[test]
fn a_third_driver_is_one_more_row() {
    const TABLE: &[ForeignIdentity] = &[ForeignIdentity {
        driver: "nic.example.com",
        pci_attributes: &["nic.example.com/bdf"],
    }];
    let s = slice(
        "n",
        "nic.example.com",
        None,
        vec![device("nic0", &[("bdf", "10:1b.0")])],
    );
    let c = find_clashes(EFA, NODE, &[&s], &ours(), TABLE);
    assert_eq!(c.withheld.keys().collect::<Vec<_>>(), ["efa-0000-10-1b-0"]);
    // The default table does not know it.
    assert!(find_clashes(EFA, NODE, &[&s], &ours(), FOREIGN_PUBLISHERS).is_empty());
}

#[test]
fn own_slices_leave_foreign_ones_out() {
    let mine = slice(&format!("{NODE}-{NEURON}-1"), NEURON, None, vec![]);
    let marked = slice("renamed", NEURON, Some(FIELD_MANAGER), vec![]);
    let theirs = slice(
        &format!("{NODE}-{NEURON}-abcde"),
        NEURON,
        Some("neuron-dra"),
        vec![],
    );
    let other_driver = slice(&format!("{NODE}-{EFA}-0"), EFA, None, vec![]);
    let all = [mine, marked, theirs, other_driver];
    let names: Vec<&str> = own_slices(&all, NEURON, NODE)
        .into_iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    assert_eq!(names, [format!("{NODE}-{NEURON}-1").as_str(), "renamed"]);
}

#[test]
fn slice_names_by_index() {
    for (name, ours) in [
        (format!("{NODE}-{EFA}-0"), true),
        (format!("{NODE}-{EFA}-12"), true),
        (format!("{NODE}-{EFA}-999"), true),
        (format!("{NODE}-{EFA}-1000"), false),
        (format!("{NODE}-{EFA}-01"), false),
        (format!("{NODE}-{EFA}-"), false),
        (format!("other-{EFA}-0"), false),
        (format!("{NODE}-{NEURON}-0"), false),
    ] {
        assert_eq!(is_our_slice_name(&name, EFA, NODE), ours, "{name}");
    }
}

#[test]
fn pci_addresses_normalise() {
    for (raw, want) in [
        ("0000:10:1b.0", Some("0000:10:1b.0")),
        (" 0000:10:1B.0\n", Some("0000:10:1b.0")),
        ("10:1b.0", Some("0000:10:1b.0")),
        ("0000:10:1b", None),
        ("0000:10:1b.00", None),
        ("zzzz:10:1b.0", None),
        ("", None),
    ] {
        assert_eq!(normalise_pci(raw.to_string()).as_deref(), want, "{raw:?}");
    }
}
