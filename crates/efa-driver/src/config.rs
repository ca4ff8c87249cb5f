//! `EfaConfig`: the opaque per-claim configuration of this driver.
//!
//! It has no knobs yet, on purpose: everything a container needs from an EFA
//! (its verbs node, `rdma_cm`, the device list) follows from the allocation,
//! and the tuning people do for EFA (libfabric `FI_*`, NCCL `NCCL_*`
//! variables) belongs in the pod spec, where it is visible and versioned with
//! the workload. The type still exists so that a claim naming it is checked
//! strictly: `dra-core` verifies `apiVersion`/`kind` and rejects any other
//! field with an error that names it, instead of ignoring a typo.

use dra_core::DriverConfig;

/// `apiVersion: efa.networking.k8s.aws/v1`, `kind: EfaConfig`, no fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EfaConfig {}

impl DriverConfig for EfaConfig {
    const API_VERSIONS: &'static [&'static str] = &["efa.networking.k8s.aws/v1"];
    const KIND: &'static str = "EfaConfig";
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_core::decode_config;
    use serde_json::json;

    #[test]
    fn strict_decoding() {
        assert_eq!(
            decode_config::<EfaConfig>(
                &json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"})
            ),
            Ok(EfaConfig {})
        );
        let cases: &[(serde_json::Value, &str)] = &[
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig", "interfaces": 2}),
                "field `interfaces`: unknown field; accepted fields: apiVersion, kind",
            ),
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v2", "kind": "EfaConfig"}),
                "field `apiVersion`: unsupported value \"efa.networking.k8s.aws/v2\"; accepted values: \"efa.networking.k8s.aws/v1\"",
            ),
            (
                json!({"apiVersion": "neuron.aws.com/v1", "kind": "EfaConfig"}),
                "field `apiVersion`: \"neuron.aws.com/v1\" is not an apiVersion of this driver (accepted values: \"efa.networking.k8s.aws/v1\"); a config meant for another driver must name that driver in `opaque.driver`",
            ),
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "NeuronConfig"}),
                "field `kind`: unsupported value \"NeuronConfig\"; accepted values: \"EfaConfig\"",
            ),
            (
                json!({"apiVersion": "efa.networking.k8s.aws/v1"}),
                "field `kind`: missing; accepted values: \"EfaConfig\"",
            ),
            (
                json!({"kind": "EfaConfig"}),
                "field `apiVersion`: missing; accepted values: \"efa.networking.k8s.aws/v1\"",
            ),
            (
                json!("EfaConfig"),
                "parameters must be a JSON object, got a string",
            ),
        ];
        for (input, want) in cases {
            let got = decode_config::<EfaConfig>(input).map_err(|e| e.to_string());
            assert_eq!(got, Err(want.to_string()), "input {input}");
        }
    }
}
