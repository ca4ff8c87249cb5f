//! The opaque configuration of a Neuron claim, the two kinds AWS's Neuron
//! DRA driver defines:
//!
//! ```yaml
//! apiVersion: neuron.aws.com/v1
//! kind: NeuronConfig
//! logicalNeuronCore: 1   # or 2; optional
//! ---
//! apiVersion: neuron.aws.com/v1
//! kind: UltraServerConfig
//! ultraserverMode: 4     # 1, 2 or 4 nodes of a Trn2 UltraServer
//! ```
//!
//! AWS's beta manifests wrote `apiVersion: neuron.aws.com/v1alphav1` or
//! `resource.neuron.aws.com/v1alphav1` with the same kinds and fields; both
//! are accepted, so claims written for AWS's driver run unchanged.
//!
//! One request may carry one entry of each kind: they merge (an LNC and an
//! UltraServer mode), while a later entry of the same kind replaces an
//! earlier one whole ([`dra_core::config_for_request`]).
//!
//! `dra-core` decodes each strictly (unknown fields, wrong types, another
//! `apiVersion`/`kind` are errors naming the field). [`DriverConfig::validate`]
//! rejects values that no node accepts; whether LNC 2 is allowed depends on
//! the allocated chip and is checked at prepare time ([`crate::lnc`]), and
//! whether an UltraServer mode is, on the node's supported modes
//! ([`crate::ultraserver`]).

use dra_core::{ConfigError, decode_config};
use dra_core::{DriverConfig, InvalidValue};
use serde::Deserialize;

/// `apiVersion` of [`NeuronConfig`] and [`UltraServerConfig`].
pub const API_VERSION: &str = "neuron.aws.com/v1";
/// Every `apiVersion` accepted: ours first, then AWS's beta ones.
pub const API_VERSIONS: &[&str] = &[
    API_VERSION,
    "neuron.aws.com/v1alphav1",
    "resource.neuron.aws.com/v1alphav1",
];
/// `kind` of [`NeuronConfig`].
pub const KIND: &str = "NeuronConfig";
/// `kind` of [`UltraServerConfig`].
pub const ULTRASERVER_KIND: &str = "UltraServerConfig";
/// The accepted `ultraserverMode` values, for messages.
pub const ACCEPTED_ULTRASERVER_MODES: &str =
    "1, 2 or 4 (nodes of a Trn2 UltraServer used together)";

/// What every chip and the 8-core chips accept, for messages.
pub const ACCEPTED_LNC: &str =
    "1 (every chip), 2 (only chips with 8 physical cores: Trainium2, Trainium3)";

/// Per-request Neuron settings: a `NeuronConfig`, an `UltraServerConfig`,
/// or both merged.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NeuronConfig {
    /// Physical NeuronCores fused into one logical core; `None`: the
    /// instance's default (2 on Trainium2/3, 1 elsewhere).
    #[serde(default)]
    pub logical_neuron_core: Option<u32>,
    /// From an `UltraServerConfig` entry: how many nodes of the UltraServer
    /// the workload spans. Not a field of `NeuronConfig` itself.
    #[serde(skip)]
    pub ultraserver_mode: Option<u32>,
}

/// `kind: UltraServerConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UltraServerConfig {
    /// Nodes of the UltraServer used together: 1, 2 or 4.
    pub ultraserver_mode: u32,
}

impl DriverConfig for NeuronConfig {
    const API_VERSIONS: &'static [&'static str] = API_VERSIONS;
    const KIND: &'static str = KIND;
    const OTHER_KINDS: &'static [&'static str] = &[ULTRASERVER_KIND];

    fn validate(&self) -> Result<(), InvalidValue> {
        match self.logical_neuron_core {
            None | Some(1) | Some(2) => Ok(()),
            Some(v) => Err(InvalidValue {
                field: "logicalNeuronCore".into(),
                value: v.to_string(),
                accepted: ACCEPTED_LNC.into(),
            }),
        }
    }

    fn decode_other_kind(_kind: &str, parameters: &serde_json::Value) -> Result<Self, ConfigError> {
        let us = decode_config::<UltraServerConfig>(parameters)?;
        Ok(NeuronConfig {
            logical_neuron_core: None,
            ultraserver_mode: Some(us.ultraserver_mode),
        })
    }

    fn merge(self, later: Self) -> Self {
        NeuronConfig {
            logical_neuron_core: later.logical_neuron_core.or(self.logical_neuron_core),
            ultraserver_mode: later.ultraserver_mode.or(self.ultraserver_mode),
        }
    }
}

impl DriverConfig for UltraServerConfig {
    const API_VERSIONS: &'static [&'static str] = API_VERSIONS;
    const KIND: &'static str = ULTRASERVER_KIND;

    fn validate(&self) -> Result<(), InvalidValue> {
        match self.ultraserver_mode {
            1 | 2 | 4 => Ok(()),
            v => Err(InvalidValue {
                field: "ultraserverMode".into(),
                value: v.to_string(),
                accepted: ACCEPTED_ULTRASERVER_MODES.into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_core::{config_for_request, decode_allocation_configs};
    use k8s_openapi::api::resource::v1::{
        DeviceAllocationConfiguration, OpaqueDeviceConfiguration,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    #[test]
    fn strict_decoding_messages() {
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "lnc": 2}),
                "field `lnc`: unknown field; accepted fields: apiVersion, kind, logicalNeuronCore",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 3}),
                "field `logicalNeuronCore`: value 3 is out of range; accepted values: 1 (every chip), 2 (only chips with 8 physical cores: Trainium2, Trainium3)",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 0}),
                "field `logicalNeuronCore`: value 0 is out of range; accepted values: 1 (every chip), 2 (only chips with 8 physical cores: Trainium2, Trainium3)",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": "2"}),
                "field `logicalNeuronCore`: invalid type: string \"2\", expected u32",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": -1}),
                "field `logicalNeuronCore`: invalid value: integer `-1`, expected u32",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v2", "kind": "NeuronConfig"}),
                "field `apiVersion`: unsupported value \"neuron.aws.com/v2\"; accepted values: \"neuron.aws.com/v1\", \"neuron.aws.com/v1alphav1\", \"resource.neuron.aws.com/v1alphav1\"",
            ),
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"}),
                "field `apiVersion`: \"efa.networking.k8s.aws/v1\" is not an apiVersion of this driver (accepted values: \"neuron.aws.com/v1\", \"neuron.aws.com/v1alphav1\", \"resource.neuron.aws.com/v1alphav1\"); a config meant for another driver must name that driver in `opaque.driver`",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "EfaConfig"}),
                "field `kind`: unsupported value \"EfaConfig\"; accepted values: \"NeuronConfig\", \"UltraServerConfig\"",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1"}),
                "field `kind`: missing; accepted values: \"NeuronConfig\", \"UltraServerConfig\"",
            ),
            (
                json!("lnc=2"),
                "parameters must be a JSON object, got a string",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 3}),
                "field `ultraserverMode`: value 3 is out of range; accepted values: 1, 2 or 4 (nodes of a Trn2 UltraServer used together)",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig"}),
                "field `ultraserverMode`: missing (required)",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 4, "logicalNeuronCore": 2}),
                "field `logicalNeuronCore`: unknown field; accepted fields: apiVersion, kind, ultraserverMode",
            ),
        ];
        for (input, want) in cases {
            let got = decode_config::<NeuronConfig>(&input).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_owned()), "input {input}");
        }
    }

    #[test]
    fn valid_configs() {
        for (input, want) in [
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}),
                None,
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}),
                Some(1),
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2}),
                Some(2),
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1alphav1", "kind": "NeuronConfig", "logicalNeuronCore": 2}),
                Some(2),
            ),
            (
                json!({"apiVersion": "resource.neuron.aws.com/v1alphav1", "kind": "NeuronConfig", "logicalNeuronCore": 1}),
                Some(1),
            ),
        ] {
            let c = decode_config::<NeuronConfig>(&input).unwrap();
            assert_eq!(c.logical_neuron_core, want, "{input}");
            assert_eq!(c.ultraserver_mode, None, "{input}");
        }
        for (api_version, mode) in [
            ("neuron.aws.com/v1", 4),
            ("neuron.aws.com/v1alphav1", 2),
            ("resource.neuron.aws.com/v1alphav1", 1),
        ] {
            let input = json!({"apiVersion": api_version, "kind": "UltraServerConfig", "ultraserverMode": mode});
            let c = decode_config::<NeuronConfig>(&input).unwrap();
            assert_eq!(
                c,
                NeuronConfig {
                    logical_neuron_core: None,
                    ultraserver_mode: Some(mode)
                },
                "{input}"
            );
        }
    }

    fn entry(
        source: &str,
        requests: Option<&[&str]>,
        parameters: serde_json::Value,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: requests.map(|r| r.iter().map(|s| s.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: crate::DRIVER_NAME.into(),
                parameters: RawExtension(parameters),
            }),
        }
    }

    /// An `UltraServerConfig` and a `NeuronConfig` on one request merge; a
    /// later entry of one kind replaces the earlier one of that kind whole.
    #[test]
    fn kinds_merge_per_request() {
        let lnc = |v: u32| json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": v});
        let us = |v: u32| json!({"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": v});
        let entries = vec![
            entry("FromClass", None, lnc(2)),
            entry("FromClaim", Some(&["node"]), us(4)),
            entry(
                "FromClaim",
                Some(&["node"]),
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"}),
            ),
            entry("FromClaim", Some(&["pair"]), us(4)),
            entry("FromClaim", Some(&["pair"]), us(2)),
        ];
        let resolved =
            decode_allocation_configs::<NeuronConfig>(crate::DRIVER_NAME, &entries).unwrap();
        let got = |request: &str| config_for_request(&resolved, request);
        assert_eq!(
            got("node"),
            Some(NeuronConfig {
                logical_neuron_core: None,
                ultraserver_mode: Some(4)
            }),
            "the claim's NeuronConfig replaces the class's whole; the UltraServerConfig stays"
        );
        assert_eq!(
            got("pair"),
            Some(NeuronConfig {
                logical_neuron_core: Some(2),
                ultraserver_mode: Some(2)
            }),
            "the class's LNC merges with the last UltraServerConfig of the request"
        );
        assert_eq!(
            got("chips"),
            Some(NeuronConfig {
                logical_neuron_core: Some(2),
                ultraserver_mode: None
            })
        );
    }
}
