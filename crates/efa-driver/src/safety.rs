//! Never serve EFAs next to the classic EFA device plugin.
//!
//! The device plugin advertises `vpc.amazonaws.com/efa` as an integer count
//! and hands EFAs to pods on its own; if this driver published the same EFAs,
//! one adapter could be given to two pods. The check itself (the Node's
//! `status.allocatable` has the resource with a quantity above zero, and
//! `--allow-device-plugin-coexistence` was not given) runs in
//! `dra_core::runtime` with [`DEVICE_PLUGIN_RESOURCES`]; [`check`] is the
//! same decision for a Node already fetched, with this driver's message.

use k8s_openapi::api::core::v1::Node;

/// Extended resources of the classic EFA device plugin.
pub const DEVICE_PLUGIN_RESOURCES: &[&str] = &["vpc.amazonaws.com/efa"];

/// The device plugin is active on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {node} advertises {resources:?} from the classic EFA device plugin; serving the same EFAs \
     through DRA would hand them out twice. Remove the aws-efa-k8s-device-plugin DaemonSet from this \
     node (and let the kubelet drop the resource), or pass --allow-device-plugin-coexistence if the \
     two manage disjoint EFAs"
)]
pub struct CoexistenceError {
    pub node: String,
    pub resources: Vec<String>,
}

/// `Err` when the device plugin is active and coexistence was not allowed.
pub fn check(node: &Node, allow_coexistence: bool) -> Result<(), CoexistenceError> {
    let resources = dra_core::node::device_plugin_resources_present(node, DEVICE_PLUGIN_RESOURCES);
    if resources.is_empty() || allow_coexistence {
        if !resources.is_empty() {
            tracing::warn!(
                ?resources,
                "classic EFA device plugin active; coexistence allowed by flag"
            );
        }
        return Ok(());
    }
    Err(CoexistenceError {
        node: node.metadata.name.clone().unwrap_or_default(),
        resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(
                    allocatable
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// (allocatable, --allow-device-plugin-coexistence, may start)
    type Case<'a> = (&'a [(&'a str, &'a str)], bool, bool);

    #[test]
    fn refuses_only_when_the_plugin_is_active() {
        let cases: &[Case<'_>] = &[
            (&[("cpu", "8")], false, true),
            (&[("vpc.amazonaws.com/efa", "32")], false, false),
            (&[("vpc.amazonaws.com/efa", "32")], true, true),
            // The kubelet keeps the resource at 0 after the plugin left.
            (&[("vpc.amazonaws.com/efa", "0")], false, true),
            (&[("aws.amazon.com/neuron", "16")], false, true),
        ];
        for (alloc, allow, ok) in cases {
            let got = check(&node(alloc), *allow);
            assert_eq!(got.is_ok(), *ok, "{alloc:?} allow={allow}");
            if let Err(e) = got {
                let msg = e.to_string();
                assert!(
                    msg.contains("vpc.amazonaws.com/efa") && msg.contains("n1"),
                    "{msg}"
                );
            }
        }
    }
}
