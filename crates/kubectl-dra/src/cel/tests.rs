mod v1_38;

use super::*;
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

fn neuron_device() -> Device {
    let attr =
        |s: Option<&str>, i: Option<i64>, b: Option<bool>, v: Option<&str>| DeviceAttribute {
            string: s.map(str::to_string),
            int: i,
            bool: b,
            version: v.map(str::to_string),
        };
    let mut attributes = BTreeMap::new();
    attributes.insert("deviceId".to_string(), attr(None, Some(3), None, None));
    attributes.insert(
        "instanceType".to_string(),
        attr(Some("trn2.48xlarge"), None, None, None),
    );
    attributes.insert(
        "draDriverVersion".to_string(),
        attr(None, None, None, Some("0.1.0")),
    );
    attributes.insert("lncCapable".to_string(), attr(None, None, Some(true), None));
    attributes.insert(
        "resource.kubernetes.io/pcieRoot".to_string(),
        attr(Some("pci0000:10"), None, None, None),
    );
    attributes.insert(
        "resource.aws.com/devicegroup4_id".to_string(),
        attr(Some("0-1-2-3"), None, None, None),
    );
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: K8sQuantity("96Gi".to_string()),
            request_policy: None,
        },
    );
    Device {
        name: "neurondevice3".to_string(),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

#[test]
fn selectors_evaluate_like_the_scheduler() {
    use Outcome::*;
    let env = Environment::new();
    let device = DeviceValue::new("neuron.aws.com", &neuron_device());
    let runtime = RuntimeError(String::new());
    let invalid = Invalid(String::new());
    let cases: &[(&str, &Outcome)] = &[
        (r#"device.driver == "neuron.aws.com""#, &Match),
        (r#"device.driver == "efa.networking.k8s.aws""#, &NoMatch),
        // int, string, bool, version attributes in the driver's domain
        (
            r#"device.attributes["neuron.aws.com"].deviceId == 3"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].deviceId >= 4"#,
            &NoMatch,
        ),
        (
            r#"device.attributes["neuron.aws.com"].deviceId == "3""#,
            &NoMatch,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.startsWith("trn2")"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType in ["trn1.32xlarge"]"#,
            &NoMatch,
        ),
        (r#"device.attributes["neuron.aws.com"].lncCapable"#, &Match),
        (
            r#"device.attributes["neuron.aws.com"].draDriverVersion.compareTo(semver("0.1.0")) >= 0"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].draDriverVersion.isLessThan(semver("0.2.0-rc.1"))"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].draDriverVersion == semver("0.1.0")"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].draDriverVersion.major() == 0"#,
            &Match,
        ),
        (
            r#"semver("v1", true).isGreaterThan(semver("0.9.9"))"#,
            &Match,
        ),
        (r#"isSemver("1.2")"#, &NoMatch),
        // other domains
        (
            r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10""#,
            &Match,
        ),
        (
            r#"device.attributes["resource.aws.com"].devicegroup4_id == "0-1-2-3""#,
            &Match,
        ),
        // optional syntax and has()
        (
            r#"device.attributes["resource.kubernetes.io"].?numaNode.orValue(-1) == 1"#,
            &NoMatch,
        ),
        (
            r#"device.attributes["resource.kubernetes.io"].?pcieRoot.orValue("") == "pci0000:10""#,
            &Match,
        ),
        (
            r#"has(device.attributes["resource.kubernetes.io"].numaNode)"#,
            &NoMatch,
        ),
        // a domain the device has nothing in is an empty map, not an error
        (
            r#"device.attributes["gpu.nvidia.com"].?index.orValue(0) == 0"#,
            &Match,
        ),
        (r#"size(device.attributes["gpu.nvidia.com"]) == 0"#, &Match),
        // capacity and quantities
        (
            r#"device.capacity["neuron.aws.com"].memory.compareTo(quantity("64Gi")) > 0"#,
            &Match,
        ),
        (
            r#"device.capacity["neuron.aws.com"].memory.isLessThan(quantity("110G"))"#,
            &Match,
        ),
        (
            r#"device.capacity["neuron.aws.com"].memory.isLessThan(quantity("100G"))"#,
            &NoMatch,
        ),
        (r#"quantity("1.5").isInteger()"#, &NoMatch),
        (r#"quantity("2k").add(5).asInteger() == 2005"#, &Match),
        (r#"quantity("1Gi") == quantity("1024Mi")"#, &Match),
        (r#"device.allowMultipleAllocations"#, &NoMatch),
        // string extensions
        (
            r#"device.attributes["neuron.aws.com"].instanceType.split(".")[0] == "trn2""#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.upperAscii() == "TRN2.48XLARGE""#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.indexOf(".") == 4"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.matches("^trn[12]")"#,
            &Match,
        ),
        // run-time failures the scheduler shares
        (
            r#"device.attributes["resource.kubernetes.io"].numaNode == 1"#,
            &runtime,
        ),
        (
            r#"device.attributes["neuron.aws.com"].instanceType > 3"#,
            &runtime,
        ),
        (r#"semver("not-a-version").major() == 1"#, &runtime),
        (r#"quantity("1GB").isInteger()"#, &runtime),
        // the 1.37 API server declares no `sign` for a quantity
        (r#"quantity("1").sign() == 1"#, &invalid),
        (r#"device.attributes["neuron.aws.com"].deviceId"#, &runtime),
        // what we cannot do is said, not guessed
        // what the API server refuses is invalid, in every release
        (
            r#"device.attributes["neuron.aws.com"].instanceType.noSuchFunction()"#,
            &invalid,
        ),
        (r#"device.driver == "#, &invalid),
        (r#"device.driver"#, &invalid),
        (r#"device.noSuchField == 1"#, &invalid),
        (r#"[1, "a"].size() == 2"#, &invalid),
        (r#""abc".matches("[")"#, &invalid),
        (r#"max(1, 2) == 2"#, &invalid),
        (r#"math.greatest(1, 2) == 2"#, &invalid),
        (r#"1 == "1""#, &invalid),
        // what neither crate has, done here
        (
            r#"cel.bind(t, device.attributes["neuron.aws.com"].instanceType, t.startsWith("trn") && t.endsWith("xlarge"))"#,
            &Match,
        ),
        (r#"[1, 2, 3].all(i, v, v == i + 1)"#, &Match),
        (r#"[1, 2, 3].exists(i, v, i == 2 && v == 3)"#, &Match),
        (r#"{"a": 1, "b": 2}.existsOne(k, v, v > 1)"#, &Match),
        (
            r#"[1, 2, 3].transformList(i, v, v * 2) == [2, 4, 6]"#,
            &Match,
        ),
        (
            r#"[1, 2, 3].transformList(i, v, i > 0, v) == [2, 3]"#,
            &Match,
        ),
        (r#"{"a": 1}.transformMap(k, v, v + 1) == {"a": 2}"#, &Match),
        (
            r#"[1, 2].transformMapEntry(i, v, {string(v): i}) == {"1": 0, "2": 1}"#,
            &Match,
        ),
        (
            r#"["bb", "a", "ccc"].sortBy(s, s.size()) == ["a", "bb", "ccc"]"#,
            &Match,
        ),
        (r#""abc".reverse() == "cba""#, &invalid),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.reverse() == "x""#,
            &invalid,
        ),
        // as the API server of 1.37 answered in the differential test
        (
            r#"device.attributes["neuron.aws.com"].deviceId == 3.0"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].deviceId == 3u"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].deviceId != 3.0"#,
            &NoMatch,
        ),
        (r#"semver("1.0.0+a") == semver("1.0.0+b")"#, &Match),
        (r#"semver("1.0.0") == semver("1.0.1")"#, &NoMatch),
        (r#"semver("1.0.0-alpha") == semver("1.0.0")"#, &NoMatch),
        (r#"semver("1.0.0-alpha") != semver("1.0.0-beta")"#, &Match),
        (r#"quantity("1") == quantity("1000m")"#, &Match),
        (r#"[1, 2.0] == [1.0, 2]"#, &invalid),
        (r#"[[1], [2.0]] == [[1.0], [2]]"#, &Match),
        (
            r#"-device.attributes["neuron.aws.com"].deviceId == -3"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].?deviceId.optMap(g, g * 10).orValue(0) == 30"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].?missing.optMap(g, g * 10).orValue(0) == 0"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].?deviceId.optFlatMap(g, optional.of(g + 1)).orValue(0) == 4"#,
            &Match,
        ),
        (
            r#"format.named("dns1123Subdomain").value().validate(device.attributes["neuron.aws.com"].instanceType).hasValue() == false"#,
            &Match,
        ),
        (r#"!format.named("nope").hasValue()"#, &Match),
        (
            r#"[device.attributes["neuron.aws.com"].deviceId, 3].sum() == 6"#,
            &invalid,
        ),
        (
            r#"[3, device.attributes["neuron.aws.com"].deviceId].sum() == 6"#,
            &invalid,
        ),
        (
            r#"["a", device.attributes["neuron.aws.com"].instanceType].size() == 2"#,
            &invalid,
        ),
        (
            r#"[device.attributes["neuron.aws.com"].deviceId, device.attributes["neuron.aws.com"].deviceId].sum() == 6"#,
            &Match,
        ),
        (
            r#"device.attributes["neuron.aws.com"].deviceId + 1"#,
            &invalid,
        ),
        (
            r#""%s".format([device.attributes["neuron.aws.com"].instanceType]) == "x""#,
            &invalid,
        ),
        (r#""%s-%d".format(["a", 1]) == "a-1""#, &Match),
        (r#""abc".contains(1)"#, &invalid),
        (r#"device.driver.lowerAscii(1) == "x""#, &invalid),
        (r#"duration("1x") > duration("1s")"#, &invalid),
        (r#"duration("1m30s") > duration("1s")"#, &Match),
        (r#"timestamp("not a time").getFullYear() == 1"#, &invalid),
        (
            r#"timestamp("2024-01-02T03:04:05Z").getFullYear() == 2024"#,
            &Match,
        ),
        (r#"[1, 2].existsOne(x, x == 2)"#, &invalid),
        (r#"[1, 2].exists_one(x, x == 2)"#, &Match),
        (r#"[1, 2].existsOne(i, x, x == 2)"#, &Match),
        (
            r#"device.attributes["neuron.aws.com"].instanceType.split(".").join("-") == "trn2-48xlarge""#,
            &invalid,
        ),
        (r#"["b", "a"].min() == "a""#, &invalid),
        (r#"[1.5, 2.5].sum() == 4.0"#, &Match),
        (
            r#"lists.range(device.attributes["neuron.aws.com"].deviceId).size() == 3"#,
            &invalid,
        ),
        (r#"lists.range(3) == [0, 1, 2]"#, &Match),
        (r#"[1, 2].reverse() == [2, 1]"#, &Match),
    ];
    let mut failures = Vec::new();
    for (expression, expected) in cases {
        let got = Selector::compile(expression).evaluate(&env, &device);
        let same = match (&got, expected) {
            (RuntimeError(_), RuntimeError(_))
            | (Invalid(_), Invalid(_))
            | (Unsupported(_), Unsupported(_)) => true,
            (a, b) => a == *b,
        };
        if !same {
            failures.push(format!("{expression}: got {got:?}, want {expected:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unqualified_attributes_live_in_the_driver_domain() {
    assert_eq!(
        split_attribute_name("efa.networking.k8s.aws", "rdmaDevice"),
        ("efa.networking.k8s.aws", "rdmaDevice")
    );
    assert_eq!(
        split_attribute_name("efa.networking.k8s.aws", "resource.kubernetes.io/pcieRoot"),
        ("resource.kubernetes.io", "pcieRoot")
    );
}

fn efa_device() -> Device {
    let mut attributes = BTreeMap::new();
    let string = |s: &str| DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    };
    for (name, value) in [
        ("instanceType", "p5.48xlarge"),
        ("rdmaDevice", "rdmap79s0"),
        ("pciDeviceId", "0xefa1"),
        ("firmwareVersion", "0.0.0"),
        ("resource.kubernetes.io/pcieRoot", "pci0000:44"),
        ("resource.kubernetes.io/pciBusID", "0000:4f:00.0"),
    ] {
        attributes.insert(name.to_string(), string(value));
    }
    attributes.insert(
        "efaGeneration".to_string(),
        DeviceAttribute {
            int: Some(2),
            ..Default::default()
        },
    );
    attributes.insert(
        "draDriverVersion".to_string(),
        DeviceAttribute {
            version: Some("0.1.0".to_string()),
            ..Default::default()
        },
    );
    Device {
        name: "efa-0000-4f-00-0".to_string(),
        attributes: Some(attributes),
        ..Default::default()
    }
}

/// Every selector of the differential test (run against the real scheduler
/// by e2e scenario s20) is decided here, in every release: valid or
/// invalid, and if valid a match, no match or a run-time error, never
/// "cannot evaluate". What the decision should be is the scenario's job.
#[test]
fn every_selector_of_the_differential_test_is_decided() {
    let data = include_str!("../../../e2e/data/cel-selectors.txt");
    let devices = [
        (
            "efa",
            DeviceValue::new("efa.networking.k8s.aws", &efa_device()),
        ),
        (
            "neuron",
            DeviceValue::new("neuron.aws.com", &neuron_device()),
        ),
    ];
    let mut undecided = Vec::new();
    let mut count = 0;
    for release in Release::ALL {
        let env = Environment::for_release(release);
        for line in data.lines() {
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((_, expr)) = line.split_once(char::is_whitespace) else {
                continue;
            };
            let expr = expr
                .trim()
                .replace(r#"["E"]"#, r#"["efa.networking.k8s.aws"]"#)
                .replace(r#"["N"]"#, r#"["neuron.aws.com"]"#)
                .replace(r#"["K"]"#, r#"["resource.kubernetes.io"]"#)
                .replace(r#"["A"]"#, r#"["resource.aws.com"]"#);
            count += 1;
            let selector = Selector::compile(&expr);
            for (name, device) in &devices {
                if let Outcome::Unsupported(why) = selector.evaluate(&env, device) {
                    undecided.push(format!("{release} {name}: {expr}: {why}"));
                }
            }
        }
    }
    assert!(
        count >= Release::ALL.len() * 200,
        "{count} selector evaluations"
    );
    assert!(undecided.is_empty(), "{}", undecided.join("\n"));
}

/// What a release's API server refuses as new and the next one accepts.
#[test]
fn releases_differ_where_kubernetes_does() {
    let device = DeviceValue::new("efa.networking.k8s.aws", &efa_device());
    let cases: &[(&str, &[Release])] = &[
        // lists extension v3 is in the 1.34 environment: new from 1.35 on
        ("[3, 1].sort() == [1, 3]", &[Release::V1_34]),
        // a list's first() and last() come with the optional types (the 1.34
        // API server took `[].first().hasValue()` in the differential test)
        ("[1].first().hasValue()", &[]),
        // allowMultipleAllocations: DRAConsumableCapacity on by default from 1.36
        (
            "device.allowMultipleAllocations == false",
            &[Release::V1_34, Release::V1_35],
        ),
        // includes: the 1.37 environment, so no API server up to 1.37 takes it new
        (
            "[1].includes(1)",
            &[
                Release::V1_34,
                Release::V1_35,
                Release::V1_36,
                Release::V1_37,
            ],
        ),
        // comparing type values: within the cost limit from 1.38 (cel-go v0.33)
        (
            r#"type(device.attributes["efa.networking.k8s.aws"].efaGeneration) == int"#,
            &[
                Release::V1_34,
                Release::V1_35,
                Release::V1_36,
                Release::V1_37,
            ],
        ),
        // CIDR v1: the 1.38 environment, which no API server up to 1.38 checks against
        (r#"cidr("10.0.0.0/8").isMask()"#, &Release::ALL),
        // semver and two-variable comprehensions are older than every release
        (r#"semver("1.0.0").major() == 1"#, &[]),
        ("[1].all(i, v, v > i)", &[]),
    ];
    for (expr, refused_by) in cases {
        for release in Release::ALL {
            let outcome =
                Selector::compile(expr).evaluate(&Environment::for_release(release), &device);
            let invalid = matches!(outcome, Outcome::Invalid(_));
            assert_eq!(
                invalid,
                refused_by.contains(&release),
                "{expr} on {release}: {outcome:?}"
            );
        }
    }
}

/// A selector that panics the interpreter (kube-cel 0.8 slices a string
/// at a byte inside 'é') is "cannot evaluate", with the panic's message,
/// for every device; the next selector evaluates as usual.
#[test]
fn a_panicking_selector_is_unsupported_with_the_reason() {
    let env = Environment::new();
    let device = DeviceValue::new("neuron.aws.com", &neuron_device());
    for e in [
        r#"format.datetime().validate("2024-01-01T12:34:5éZ").hasValue()"#,
        r#"format.named("datetime").value().validate("2024-01-01T12:34:5éZ").hasValue()"#,
    ] {
        let selector = Selector::compile(e);
        for _ in 0..2 {
            match selector.evaluate(&env, &device) {
                Outcome::Unsupported(m) => {
                    assert!(m.starts_with("the CEL interpreter panicked: "), "{m}");
                    assert!(m.contains("char boundary"), "{m}");
                }
                other => panic!("{e}: {other:?}"),
            }
        }
    }
    let fine =
        Selector::compile(r#"format.datetime().validate("2024-01-01T12:34:56Z").hasValue()"#);
    assert_eq!(fine.evaluate(&env, &device), Outcome::NoMatch);
}
