//! Not running next to the classic Neuron device plugin.
//!
//! The device plugin advertises whole chips as `aws.amazon.com/neuron` (or
//! `aws.amazon.com/neurondevice`) and cores as `aws.amazon.com/neuroncore`. With both on one node the same chip
//! could be given to a device-plugin pod and to a DRA claim. The check itself
//! is `dra-core`'s runtime (it reads the Node's `status.allocatable` at
//! start-up and refuses unless `--allow-device-plugin-coexistence`); this
//! module names the resources it looks for.

/// Extended resources of the classic Neuron device plugin.
pub const DEVICE_PLUGIN_RESOURCES: &[&str] = &[
    "aws.amazon.com/neuron",
    "aws.amazon.com/neurondevice",
    "aws.amazon.com/neuroncore",
];

#[cfg(test)]
mod tests {
    use super::*;
    use dra_core::device_plugin_resources_present;
    use k8s_openapi::api::core::v1::{Node, NodeStatus};
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
    fn detects_either_device_plugin_resource_and_nothing_else() {
        let present = |res| device_plugin_resources_present(&node(res), DEVICE_PLUGIN_RESOURCES);
        assert!(present(&[("cpu", "4")]).is_empty());
        assert!(present(&[("vpc.amazonaws.com/efa", "16")]).is_empty());
        // kubelet leaves a removed plugin's resource at 0: not active.
        assert!(present(&[("aws.amazon.com/neuron", "0")]).is_empty());
        assert_eq!(
            present(&[("aws.amazon.com/neuroncore", "128")]),
            vec!["aws.amazon.com/neuroncore".to_string()]
        );
        assert_eq!(
            present(&[("aws.amazon.com/neuron", "16")]),
            vec!["aws.amazon.com/neuron".to_string()]
        );
        assert_eq!(
            present(&[("aws.amazon.com/neurondevice", "16")]),
            vec!["aws.amazon.com/neurondevice".to_string()]
        );
    }
}
