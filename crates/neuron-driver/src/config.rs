//! The opaque configuration of a Neuron claim: `NeuronConfig`.
//!
//! ```yaml
//! apiVersion: neuron.aws.com/v1
//! kind: NeuronConfig
//! logicalNeuronCore: 1   # or 2; optional
//! ```
//!
//! `dra-core` decodes it strictly (unknown fields, wrong types, another
//! `apiVersion`/`kind` are errors naming the field). [`DriverConfig::validate`]
//! rejects values that no chip accepts; whether 2 is allowed depends on the
//! allocated chip and is checked at prepare time ([`crate::lnc`]).

use dra_core::{DriverConfig, InvalidValue};
use serde::Deserialize;

/// `apiVersion` of [`NeuronConfig`].
pub const API_VERSION: &str = "neuron.aws.com/v1";
/// `kind` of [`NeuronConfig`].
pub const KIND: &str = "NeuronConfig";

/// What every chip and the 8-core chips accept, for messages.
pub const ACCEPTED_LNC: &str =
    "1 (every chip), 2 (only chips with 8 physical cores: Trainium2, Trainium3)";

/// Per-claim Neuron settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NeuronConfig {
    /// Physical NeuronCores fused into one logical core; `None`: the
    /// instance's default (2 on Trainium2/3, 1 elsewhere).
    #[serde(default)]
    pub logical_neuron_core: Option<u32>,
}

impl DriverConfig for NeuronConfig {
    const API_VERSIONS: &'static [&'static str] = &[API_VERSION];
    const KIND: &'static str = KIND;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_core::config::decode_config;
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
                "field `apiVersion`: unsupported value \"neuron.aws.com/v2\"; accepted values: \"neuron.aws.com/v1\"",
            ),
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"}),
                "field `apiVersion`: \"efa.networking.k8s.aws/v1\" is not an apiVersion of this driver (accepted values: \"neuron.aws.com/v1\"); a config meant for another driver must name that driver in `opaque.driver`",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "EfaConfig"}),
                "field `kind`: unsupported value \"EfaConfig\"; accepted values: \"NeuronConfig\"",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1"}),
                "field `kind`: missing; accepted values: \"NeuronConfig\"",
            ),
            (
                json!("lnc=2"),
                "parameters must be a JSON object, got a string",
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
        ] {
            let c = decode_config::<NeuronConfig>(&input).unwrap();
            assert_eq!(c.logical_neuron_core, want, "{input}");
        }
    }
}
