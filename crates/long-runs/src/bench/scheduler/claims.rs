//! The claims and pods of the bench: each pod its own ResourceClaim (made
//! before the pods, so that the time to bind is the scheduler's and not the
//! claim controller's), shaped as the examples write them
//! (`examples/gpu-efa`, `examples/neuron`, `examples/aws-neuron`).

use serde_json::{Value, json};

/// The drivers the claims ask for (the shapes publish under these names).
pub const EFA_DRIVER: &str = "efa.networking.k8s.aws";
pub const NEURON_DRIVER: &str = "neuron.aws.com";
pub const GPU_DRIVER: &str = "gpu.nvidia.com";

/// What one pod asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// One GPU and `efas` EFAs on its PCIe root (p5: 4 per root).
    GpuWithEfas { efas: u32 },
    /// `chips` connected Neuron chips and `efas` EFAs of the same device
    /// group (`resource.aws.com/devicegroup<chips>_id`).
    NeuronWithEfas { chips: u32, efas: u32 },
    /// The whole-node device of a Trn2 UltraServer node, 4-node mode.
    UltraServerNode,
}

impl ClaimKind {
    /// A DNS label naming the kind (pods and claims are named after it).
    pub fn name(self) -> String {
        match self {
            ClaimKind::GpuWithEfas { efas } => format!("gpu-{efas}efa"),
            ClaimKind::NeuronWithEfas { chips, efas } => format!("neuron{chips}-{efas}efa"),
            ClaimKind::UltraServerNode => "us-node".into(),
        }
    }

    /// The ResourceClaim `name` of this kind.
    pub fn claim(self, name: &str) -> Value {
        let exactly = |class: &str, count: u32| json!({"deviceClassName": class, "count": count});
        let (requests, constraints, config) = match self {
            ClaimKind::GpuWithEfas { efas } => (
                json!([
                    {"name": "gpu", "exactly": exactly(GPU_DRIVER, 1)},
                    {"name": "efas", "exactly": exactly(EFA_DRIVER, efas)},
                ]),
                json!([{"requests": ["gpu", "efas"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
                json!([]),
            ),
            ClaimKind::NeuronWithEfas { chips, efas } => (
                json!([
                    {"name": "neurons", "exactly": exactly(NEURON_DRIVER, chips)},
                    {"name": "efas", "exactly": exactly(EFA_DRIVER, efas)},
                ]),
                json!([{
                    "requests": ["neurons", "efas"],
                    "matchAttribute": format!("resource.aws.com/devicegroup{chips}_id"),
                }]),
                json!([]),
            ),
            ClaimKind::UltraServerNode => {
                let mut node = exactly(NEURON_DRIVER, 1);
                node["selectors"] = json!([{"cel": {
                    "expression": "device.attributes[\"neuron.aws.com\"].resourceType == \"neuron_node\""
                }}]);
                (
                    json!([{"name": "node", "exactly": node}]),
                    json!([]),
                    json!([{"requests": ["node"], "opaque": {"driver": NEURON_DRIVER, "parameters": {
                        "apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": 4,
                    }}}]),
                )
            }
        };
        let mut devices = json!({"requests": requests});
        if constraints.as_array().is_some_and(|c| !c.is_empty()) {
            devices["constraints"] = constraints;
        }
        if config.as_array().is_some_and(|c| !c.is_empty()) {
            devices["config"] = config;
        }
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": devices},
        })
    }
}

/// Pod `name` with its own claim `claim`: on the bench's shadow nodes only
/// (`selector`: label `key=value`), tolerating every taint (the node
/// lifecycle controller marks nodes without a kubelet unreachable). It is
/// never run: no kubelet serves its node.
pub fn pod(name: &str, claim: &str, selector: (&str, &str)) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {selector.0: selector.1},
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "devices", "resourceClaimName": claim}],
            "containers": [{
                "name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "devices"}]},
            }],
        },
    })
}

#[cfg(test)]
#[path = "claims_tests.rs"]
mod tests;
