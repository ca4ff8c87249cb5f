//! Lookups of the driver's own Node object.
//!
//! The publisher needs the Node's UID for the owner reference on its slices,
//! and the drivers refuse to start next to the classic device plugin for the
//! same hardware (it would hand the same device out twice). Both read the Node
//! once at start-up. The GET is retried with capped backoff for as long as it
//! takes: a node rebooted during a control-plane outage must come up serving
//! kubelet from local state and catch up when the API server is back, not
//! crash-loop (the daemon serves kubelet meanwhile, see `daemon::runtime`).

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::publish::{Backoff, BackoffConfig, NodeOwner};

/// The Node's owner reference could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    /// The Node has no UID (not a stored object).
    #[error("Node {0:?} has no metadata.uid")]
    NoUid(String),
}

/// GETs the Node `name`, retrying every failure with capped exponential
/// backoff and jitter until it succeeds; `failed` is called with the number
/// of failures so far after each one (the daemon counts them). Dropping
/// the future stops it.
pub(crate) async fn get_node(
    client: &kube::Client,
    name: &str,
    backoff: BackoffConfig,
    mut failed: impl FnMut(u64),
) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let mut delays = Backoff::new(backoff);
    let mut failures = 0u64;
    loop {
        match api.get(name).await {
            Ok(node) => {
                if failures > 0 {
                    tracing::info!(
                        node = name,
                        failures,
                        "read the Node: the API server answers"
                    );
                }
                return node;
            }
            Err(error) => {
                failures += 1;
                failed(failures);
                let delay = delays.next_delay();
                tracing::warn!(node = name, attempt = failures, %error, retry_in_ms = delay.as_millis() as u64, "reading Node failed; serving kubelet from local state and retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The owner for the node's slices (name + UID).
pub(crate) fn node_owner(node: &Node) -> Result<NodeOwner, NodeError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    match &node.metadata.uid {
        Some(uid) if !uid.is_empty() => Ok(NodeOwner {
            name,
            uid: uid.clone(),
        }),
        _ => Err(NodeError::NoUid(name)),
    }
}

/// Which of `resource_names` (extended resources of a classic device plugin,
/// e.g. `vpc.amazonaws.com/efa`) the Node currently advertises in
/// `status.allocatable` with a quantity above zero. The kubelet keeps a
/// resource at `0` after its device plugin went away, so zero does not count.
/// Returned in the order of `resource_names`.
pub fn device_plugin_resources_present(node: &Node, resource_names: &[&str]) -> Vec<String> {
    let Some(allocatable) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) else {
        return Vec::new();
    };
    resource_names
        .iter()
        .filter(|name| {
            allocatable
                .get(**name)
                // An unparsable quantity is treated as present: refusing to start
                // is the safe side of a double allocation.
                .is_some_and(|q| {
                    k8s_quantity::Quantity::parse(&q.0).map_or(true, |v| v.is_positive())
                })
        })
        .map(|name| (*name).to_owned())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A Node named `n1` (uid `u-1`) with this `status.allocatable`.
    pub(crate) fn node(allocatable: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                uid: Some("u-1".into()),
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

    #[test]
    fn device_plugin_detection_table() {
        let efa = ["vpc.amazonaws.com/efa"];
        let neuron = ["aws.amazon.com/neuron", "aws.amazon.com/neuroncore"];
        let cases: Vec<(&str, Node, &[&str], Vec<&str>)> = vec![
            ("no status", Node::default(), &efa, vec![]),
            (
                "plain node",
                node(&[("cpu", "96"), ("memory", "1Ti")]),
                &efa,
                vec![],
            ),
            (
                "efa plugin",
                node(&[("cpu", "96"), ("vpc.amazonaws.com/efa", "32")]),
                &efa,
                vec!["vpc.amazonaws.com/efa"],
            ),
            (
                "efa plugin gone (zero)",
                node(&[("vpc.amazonaws.com/efa", "0")]),
                &efa,
                vec![],
            ),
            (
                "garbage quantity counts",
                node(&[("vpc.amazonaws.com/efa", "??")]),
                &efa,
                vec!["vpc.amazonaws.com/efa"],
            ),
            (
                "neuron cores only",
                node(&[("aws.amazon.com/neuroncore", "128")]),
                &neuron,
                vec!["aws.amazon.com/neuroncore"],
            ),
            (
                "both neuron",
                node(&[
                    ("aws.amazon.com/neuroncore", "128"),
                    ("aws.amazon.com/neuron", "16"),
                ]),
                &neuron,
                vec!["aws.amazon.com/neuron", "aws.amazon.com/neuroncore"],
            ),
            (
                "efa on neuron check",
                node(&[("vpc.amazonaws.com/efa", "8")]),
                &neuron,
                vec![],
            ),
        ];
        for (name, n, wanted, want) in cases {
            assert_eq!(device_plugin_resources_present(&n, wanted), want, "{name}");
        }
    }

    /// An API server that never comes: the read goes on retrying (the old
    /// code gave up after 8 attempts, about two minutes) with delays capped
    /// as configured, and never returns an error.
    #[tokio::test(start_paused = true)]
    async fn the_node_is_read_until_the_api_server_answers() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = closed.local_addr().unwrap();
        drop(closed);
        let config = kube::Config::new(format!("http://{address}").parse().unwrap());
        // The process's TLS provider, as the daemon's client sets it: alone
        // (a filtered run) no other test has installed one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_from(config).unwrap();
        let failures = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = failures.clone();
        let backoff = BackoffConfig {
            initial: std::time::Duration::from_millis(500),
            max: std::time::Duration::from_secs(15),
        };
        let read = get_node(&client, "n1", backoff, move |n| {
            counted.store(n, std::sync::atomic::Ordering::SeqCst)
        });
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(600), read).await;
        assert!(outcome.is_err(), "the read returned without an API server");
        // 600 s of delays of at most 15 s: at least 40 attempts.
        let failures = failures.load(std::sync::atomic::Ordering::SeqCst);
        assert!(failures >= 40, "{failures} attempts");
    }

    #[test]
    fn owner_from_node() {
        let owner = node_owner(&node(&[])).expect("has uid");
        assert_eq!(
            owner,
            NodeOwner {
                name: "n1".into(),
                uid: "u-1".into()
            }
        );
        assert!(matches!(
            node_owner(&Node::default()),
            Err(NodeError::NoUid(_))
        ));
    }
}
