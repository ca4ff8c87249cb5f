use super::*;
use k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TestConfig {
    #[serde(default)]
    logical_neuron_core: Option<u8>,
    #[serde(default)]
    tuning: Option<Tuning>,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Tuning {
    depth: u32,
}

impl DriverConfig for TestConfig {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "TestConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        match self.logical_neuron_core {
            None | Some(1) | Some(2) => Ok(()),
            Some(v) => Err(InvalidValue {
                field: "logicalNeuronCore".into(),
                value: v.to_string(),
                accepted: "1, 2".into(),
            }),
        }
    }
}

#[test]
fn strict_decoding_messages() {
    let cases: &[(serde_json::Value, &str)] = &[
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lnc": 2}),
            "field `lnc`: unknown field; accepted fields: apiVersion, kind, logicalNeuronCore, tuning",
        ),
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "OtherConfig"}),
            "field `kind`: unsupported value \"OtherConfig\"; accepted values: \"TestConfig\"",
        ),
        (
            json!({"apiVersion": "test.example.com/v2", "kind": "TestConfig"}),
            "field `apiVersion`: unsupported value \"test.example.com/v2\"; accepted values: \"test.example.com/v1\"",
        ),
        (
            json!({"kind": "TestConfig"}),
            "field `apiVersion`: missing; accepted values: \"test.example.com/v1\"",
        ),
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "logicalNeuronCore": 3}),
            "field `logicalNeuronCore`: value 3 is out of range; accepted values: 1, 2",
        ),
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "logicalNeuronCore": "2"}),
            "field `logicalNeuronCore`: invalid type: string \"2\", expected u8",
        ),
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "tuning": {"depth": 1, "speed": 2}}),
            "field `tuning.speed`: unknown field; accepted fields: see the driver's documentation",
        ),
        (json!([1]), "parameters must be a JSON object, got an array"),
        (
            json!({"apiVersion": "other.example.com/v1", "kind": "TestConfig"}),
            "field `apiVersion`: \"other.example.com/v1\" is not an apiVersion of this driver (accepted values: \"test.example.com/v1\"); a config meant for another driver must name that driver in `opaque.driver`",
        ),
        (
            json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "pad": "x".repeat(MAX_PARAMETERS_BYTES)}),
            "parameters are 10305 bytes of JSON; the limit is 10240 bytes",
        ),
    ];
    for (input, want) in cases {
        let got = decode_config::<TestConfig>(input).map_err(|e| e.to_string());
        assert_eq!(got, Err(want.to_string()), "input {input}");
    }
}

#[test]
fn valid_config_decodes() {
    let got = decode_config::<TestConfig>(
        &json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "logicalNeuronCore": 2}),
    );
    assert_eq!(
        got,
        Ok(TestConfig {
            logical_neuron_core: Some(2),
            tuning: None
        })
    );
}

fn entry(
    source: &str,
    driver: &str,
    requests: Option<&[&str]>,
    lnc: u8,
) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(json!({
                "apiVersion": "test.example.com/v1", "kind": "TestConfig", "logicalNeuronCore": lnc
            })),
        }),
    }
}

#[test]
fn precedence_class_then_claim_and_request_filter() {
    let entries = vec![
        entry("FromClaim", "ours", None, 2),
        entry("FromClass", "ours", None, 1),
        entry("FromClaim", "other", None, 9),
        entry("FromClaim", "ours", Some(&["special"]), 1),
    ];
    let resolved = decode_allocation_configs::<TestConfig>("ours", &entries).unwrap();
    let lnc = |req: &str| config_for_request(&resolved, req).and_then(|c| c.logical_neuron_core);
    assert_eq!(lnc("plain"), Some(2), "claim entry beats class entry");
    assert_eq!(lnc("special"), Some(1), "later request-scoped entry wins");
    assert_eq!(lnc("special/sub"), Some(1), "subrequest matches its base");
    assert!(
        decode_allocation_configs::<TestConfig>("nobody", &entries)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn bad_entry_is_reported_with_position_and_source() {
    let entries = vec![
        entry("FromClass", "ours", None, 1),
        entry("FromClaim", "ours", None, 7),
    ];
    let err = decode_allocation_configs::<TestConfig>("ours", &entries).unwrap_err();
    assert_eq!(
        err.to_string(),
        "opaque config #1 (from ResourceClaim): field `logicalNeuronCore`: value 7 is out of range; accepted values: 1, 2"
    );
}

#[test]
fn base_request_strips_subrequest() {
    assert_eq!(base_request("a/b"), "a");
    assert_eq!(base_request("a"), "a");
}

/// A config of two kinds: each kind's entries replace each other whole,
/// the kinds merge.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TwoKinds {
    #[serde(default)]
    speed: Option<u32>,
    #[serde(skip)]
    mode: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct ModeKind {
    mode: u32,
}

impl DriverConfig for ModeKind {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "ModeConfig";
}

impl DriverConfig for TwoKinds {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "SpeedConfig";
    const OTHER_KINDS: &'static [&'static str] = &["ModeConfig"];
    fn decode_other_kind(_: &str, parameters: &serde_json::Value) -> Result<Self, ConfigError> {
        let m = decode_config::<ModeKind>(parameters)?;
        Ok(TwoKinds {
            speed: None,
            mode: Some(m.mode),
        })
    }
    fn merge(self, later: Self) -> Self {
        TwoKinds {
            speed: later.speed.or(self.speed),
            mode: later.mode.or(self.mode),
        }
    }
}

#[test]
fn kinds_merge_and_each_kind_replaces_itself() {
    let entry = |source: &str, kind: &str, field: Option<(&str, u32)>| {
        let mut p = serde_json::json!({"apiVersion": "test.example.com/v1", "kind": kind});
        if let Some((f, v)) = field {
            p[f] = serde_json::json!(v);
        }
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: None,
            opaque: Some(OpaqueDeviceConfiguration {
                driver: "ours".into(),
                parameters: RawExtension(p),
            }),
        }
    };
    let entries = vec![
        entry("FromClass", "SpeedConfig", Some(("speed", 5))),
        entry("FromClass", "ModeConfig", Some(("mode", 2))),
        entry("FromClaim", "SpeedConfig", None),
    ];
    let resolved = decode_allocation_configs::<TwoKinds>("ours", &entries).unwrap();
    assert_eq!(
        config_for_request(&resolved, "r"),
        Some(TwoKinds {
            speed: None,
            mode: Some(2)
        }),
        "the claim's SpeedConfig replaces the class's whole; the ModeConfig stays"
    );
    let err = decode_config::<TwoKinds>(
        &serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "Other"}),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "field `kind`: unsupported value \"Other\"; accepted values: \"SpeedConfig\", \"ModeConfig\""
    );
    let err = decode_config::<TwoKinds>(&serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "ModeConfig", "mode": 1, "speed": 3}))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "field `speed`: unknown field; accepted fields: apiVersion, kind, mode"
    );
}
