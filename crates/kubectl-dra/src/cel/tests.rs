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
        name: "neuron-device-3".to_string(),
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
    let unsupported = Unsupported(String::new());
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
        (r#"quantity("1GB").sign() == 1"#, &runtime),
        (r#"device.attributes["neuron.aws.com"].deviceId"#, &runtime),
        // what we cannot do is said, not guessed
        (
            r#"device.attributes["neuron.aws.com"].instanceType.noSuchFunction()"#,
            &unsupported,
        ),
        (r#"device.driver == "#, &unsupported),
    ];
    let mut failures = Vec::new();
    for (expression, expected) in cases {
        let got = Selector::compile(expression).evaluate(&env, &device);
        let same = match (&got, expected) {
            (RuntimeError(_), RuntimeError(_)) | (Unsupported(_), Unsupported(_)) => true,
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
