//! Not running next to the classic Neuron device plugin.
//!
//! The device plugin advertises whole chips as `aws.amazon.com/neuron` and
//! cores as `aws.amazon.com/neuroncore`. With both on one node the same chip
//! could be given to a device-plugin pod and to a DRA claim. The check itself
//! is `dra-core`'s (it reads the Node's `status.allocatable` at start-up and
//! refuses unless `--allow-device-plugin-coexistence`); this module names the
//! resources and phrases the refusal.

use k8s_openapi::api::core::v1::Node;

/// Extended resources of the classic Neuron device plugin.
pub const DEVICE_PLUGIN_RESOURCES: &[&str] =
    &["aws.amazon.com/neuron", "aws.amazon.com/neuroncore"];

/// `Some(message)` when the node has the device plugin's resources and
/// coexistence was not allowed.
pub fn refusal(node: &Node, allow_coexistence: bool) -> Option<String> {
    let present = dra_core::node::device_plugin_resources_present(node, DEVICE_PLUGIN_RESOURCES);
    if present.is_empty() {
        return None;
    }
    if allow_coexistence {
        tracing::warn!(resources = ?present, "the classic Neuron device plugin is active on this node; chips may be handed out twice (--allow-device-plugin-coexistence)");
        return None;
    }
    Some(format!(
        "the classic Neuron device plugin is active on this node (allocatable has {}); remove it or start with --allow-device-plugin-coexistence",
        present.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(res: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                allocatable: Some(
                    res.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn refuses_only_with_plugin_resources() {
        assert_eq!(refusal(&node(&[("cpu", "4")]), false), None);
        assert_eq!(
            refusal(&node(&[("aws.amazon.com/neuron", "0")]), false),
            None
        );
        let msg = refusal(&node(&[("aws.amazon.com/neuroncore", "128")]), false).unwrap();
        assert!(
            msg.contains("aws.amazon.com/neuroncore")
                && msg.contains("--allow-device-plugin-coexistence"),
            "{msg}"
        );
        assert_eq!(
            refusal(&node(&[("aws.amazon.com/neuron", "16")]), true),
            None
        );
        assert_eq!(
            refusal(&node(&[("vpc.amazonaws.com/efa", "16")]), false),
            None
        );
    }
}
