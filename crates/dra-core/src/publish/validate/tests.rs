use super::*;
use k8s_openapi::api::resource::v1::DeviceCapacity;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const DRIVER: &str = "efa.networking.k8s.aws";

fn s(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}
fn i(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}
fn ver(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(v.into()),
        ..Default::default()
    }
}
fn device(name: &str, attrs: Vec<(&str, DeviceAttribute)>) -> Device {
    Device {
        name: name.into(),
        attributes: Some(attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        ..Default::default()
    }
}

/// One attribute per row: what survives and which issue is reported.
#[test]
fn attribute_table() {
    let long = "x".repeat(70);
    let long_utf8 = "é".repeat(40); // 80 bytes, 2 per char
    type Row = (
        &'static str,
        DeviceAttribute,
        Option<DeviceAttribute>,
        Option<(IssueAction, &'static str)>,
    );
    let cases: Vec<Row> = vec![
        ("rdmaDevice", s("rdmap79s0"), Some(s("rdmap79s0")), None),
        (
            "resource.kubernetes.io/pcieRoot",
            s("pci0000:10"),
            Some(s("pci0000:10")),
            None,
        ),
        ("numa_node", i(-1), Some(i(-1)), None),
        (
            "draDriverVersion",
            ver("1.2.3-rc.1+g1234"),
            Some(ver("1.2.3-rc.1+g1234")),
            None,
        ),
        ("x", s(&"y".repeat(64)), Some(s(&"y".repeat(64))), None),
        (
            "long",
            s(&long),
            Some(s(&"x".repeat(64))),
            Some((IssueAction::AttributeShortened, "value_too_long")),
        ),
        (
            "utf8",
            s(&long_utf8),
            Some(s(&"é".repeat(32))),
            Some((IssueAction::AttributeShortened, "value_too_long")),
        ),
        (
            "9lives",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "has-dash",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "a_very_long_identifier_of_33_char",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "Bad_Domain.com/x",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "/x",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "a/b/c",
            s("a"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_name")),
        ),
        (
            "nothing",
            DeviceAttribute::default(),
            None,
            Some((IssueAction::AttributeDropped, "no_value")),
        ),
        (
            "two",
            DeviceAttribute {
                int: Some(1),
                bool: Some(true),
                ..Default::default()
            },
            None,
            Some((IssueAction::AttributeDropped, "multiple_values")),
        ),
        (
            "v",
            ver("1.2"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_version")),
        ),
        (
            "v",
            ver("01.2.3"),
            None,
            Some((IssueAction::AttributeDropped, "invalid_version")),
        ),
        (
            "v",
            ver(&format!("1.2.3-{}", "a".repeat(60))),
            None,
            Some((IssueAction::AttributeDropped, "version_too_long")),
        ),
    ];
    for (name, attr, want, want_issue) in cases {
        let d = device("dev-0", vec![(name, attr), ("keep", i(1))]);
        let (out, issues) = validate_devices(DRIVER, &[d]);
        assert_eq!(out.len(), 1, "{name}: device must survive");
        let attrs = out[0].attributes.clone().unwrap_or_default();
        assert_eq!(attrs.get(name), want.as_ref(), "{name}");
        assert_eq!(
            attrs.get("keep"),
            Some(&i(1)),
            "{name}: other attribute kept"
        );
        let got: Vec<_> = issues
            .iter()
            .map(|i| (i.action, i.reason.as_str()))
            .collect();
        assert_eq!(got, want_issue.into_iter().collect::<Vec<_>>(), "{name}");
        for issue in &issues {
            assert_eq!(issue.entry.as_deref(), Some(name));
        }
    }
}

#[test]
fn device_names() {
    let long = "a".repeat(64);
    let devices: Vec<Device> = [
        "efa-0000-4f-00-0",
        "Bad",
        "-x",
        "x-",
        "",
        &long,
        "a.b",
        "efa-0000-4f-00-0",
        "ok",
    ]
    .iter()
    .map(|n| device(n, vec![]))
    .collect();
    let (out, issues) = validate_devices(DRIVER, &devices);
    let names: Vec<_> = out.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["efa-0000-4f-00-0", "ok"]);
    let reasons: Vec<_> = issues
        .iter()
        .map(|i| (i.device.as_str(), i.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("Bad", "invalid_device_name"),
            ("-x", "invalid_device_name"),
            ("x-", "invalid_device_name"),
            ("", "invalid_device_name"),
            (long.as_str(), "invalid_device_name"),
            ("a.b", "invalid_device_name"),
            ("efa-0000-4f-00-0", "duplicate_device_name"),
        ]
    );
    assert!(
        issues
            .iter()
            .all(|i| i.action == IssueAction::DeviceDropped)
    );
    // Empty maps are not published (the server drops them anyway).
    assert_eq!(out[0].attributes, None);
}

#[test]
fn unqualified_and_driver_qualified_names_collide() {
    let d = device(
        "d",
        vec![
            ("foo", i(1)),
            ("efa.networking.k8s.aws/foo", i(2)),
            ("other.io/foo", i(3)),
        ],
    );
    let (out, issues) = validate_devices(DRIVER, &[d]);
    let attrs = out[0].attributes.clone().unwrap_or_default();
    assert_eq!(attrs.len(), 2);
    assert_eq!(attrs.get("other.io/foo"), Some(&i(3)));
    assert_eq!(issues.len(), 1);
    assert_eq!(issues[0].reason, IssueReason::DuplicateName);
}

#[test]
fn at_most_32_attributes_and_capacities() {
    let names: Vec<String> = (0..30).map(|n| format!("a{n:02}")).collect();
    let mut d = device("d", names.iter().map(|n| (n.as_str(), i(1))).collect());
    d.capacity = Some(
        ["c1", "c2", "c3", "bad-name"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    DeviceCapacity {
                        value: Quantity("1Gi".into()),
                        ..Default::default()
                    },
                )
            })
            .chain([(
                "c0".to_string(),
                DeviceCapacity {
                    value: Quantity("lots".into()),
                    ..Default::default()
                },
            )])
            .collect(),
    );
    let (out, issues) = validate_devices(DRIVER, &[d]);
    assert_eq!(out[0].attributes.as_ref().map(BTreeMap::len), Some(30));
    let caps: Vec<_> = out[0]
        .capacity
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(caps, ["c1", "c2"]);
    let got: Vec<_> = issues
        .iter()
        .map(|i| {
            (
                i.entry.as_deref().unwrap_or(""),
                i.action,
                i.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("bad-name", IssueAction::CapacityDropped, "invalid_name"),
            ("c0", IssueAction::CapacityDropped, "invalid_quantity"),
            ("c3", IssueAction::CapacityDropped, "too_many_entries"),
        ]
    );
}

#[test]
fn semver_table() {
    for ok in [
        "0.0.0",
        "1.2.3",
        "10.20.30",
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-0.3.7",
        "1.0.0-x.7.z.92",
        "1.0.0+20130313144700",
        "1.0.0-beta+exp.sha.5114f85",
        "1.0.0-x-y-z.--",
    ] {
        assert!(is_semver(ok), "{ok}");
    }
    for bad in [
        "",
        "1",
        "1.2",
        "1.2.3.4",
        "01.1.1",
        "1.01.1",
        "1.1.01",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3+",
        "1.2.3-a..b",
        "v1.2.3",
        "1.2.3-a_b",
        "1.2.3+a+b",
        " 1.2.3",
    ] {
        assert!(!is_semver(bad), "{bad}");
    }
}

#[test]
fn dns_names() {
    assert!(is_dns_subdomain("resource.kubernetes.io"));
    assert!(is_dns_subdomain("ip-10-0-0-1.ec2.internal"));
    assert!(!is_dns_subdomain("a..b"));
    assert!(!is_dns_subdomain("A.b"));
    assert!(!is_dns_subdomain(&"a".repeat(254)));
}

proptest::proptest! {
    #[test]
    fn validated_devices_always_within_limits(
        attrs in proptest::collection::btree_map("[a-zA-Z0-9_./-]{0,40}", "\\PC{0,80}", 0..40)
    ) {
        let d = Device {
            name: "d".into(),
            attributes: Some(attrs.into_iter().map(|(k, v)| (k, s(&v))).collect()),
            ..Default::default()
        };
        let (out, _) = validate_devices(DRIVER, &[d]);
        let attrs = out[0].attributes.clone().unwrap_or_default();
        proptest::prop_assert!(attrs.len() <= MAX_ATTRIBUTES_AND_CAPACITIES);
        for (k, v) in attrs {
            proptest::prop_assert!(qualified_name(DRIVER, &k).is_ok());
            proptest::prop_assert!(v.string.is_some_and(|s| s.len() <= MAX_ATTRIBUTE_VALUE_LEN));
        }
    }
}
