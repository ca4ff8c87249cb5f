//! Labels a driver keeps on its own Node, from what its scans find (the
//! Neuron driver: a Trn2 UltraServer node's ids, which LeaderWorkerSet's
//! `exclusive-topology` and node affinities key on).
//!
//! The driver names the label keys it manages
//! ([`crate::DeviceInventory::NODE_LABELS`]) and, after each scan, the
//! values it wants ([`crate::DeviceInventory::node_labels`]); a managed key
//! without a value is removed. Nothing else on the Node is touched: each
//! change is one JSON merge patch that names only managed keys, sent only
//! when the wanted labels differ from those last seen on the Node (read
//! at start-up), so a driver at rest makes no API call. A failed patch is
//! retried with backoff until it succeeds or the wanted labels change.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::publish::{Backoff, BackoffConfig};

/// The labels wanted on the Node after a scan: managed key → value.
pub(crate) type NodeLabels = BTreeMap<String, String>;

/// The managed keys among `labels`, with their values.
pub(crate) fn managed_subset(labels: &BTreeMap<String, String>, managed: &[&str]) -> NodeLabels {
    labels
        .iter()
        .filter(|(k, _)| managed.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The merge patch that takes the Node's managed labels from `current` to
/// `wanted`, or `None` when they already agree. Keys outside `managed` are
/// ignored in both.
pub(crate) fn label_patch(
    current: &NodeLabels,
    wanted: &NodeLabels,
    managed: &[&str],
) -> Option<serde_json::Value> {
    let wanted = managed_subset(wanted, managed);
    let current = managed_subset(current, managed);
    if wanted == current {
        return None;
    }
    let mut labels = serde_json::Map::new();
    for key in current.keys().filter(|k| !wanted.contains_key(*k)) {
        labels.insert(key.clone(), serde_json::Value::Null);
    }
    for (key, value) in &wanted {
        if current.get(key) != Some(value) {
            labels.insert(key.clone(), serde_json::Value::String(value.clone()));
        }
    }
    Some(serde_json::json!({ "metadata": { "labels": labels } }))
}

/// Keeps the Node's managed labels equal to the latest value of `wanted`
/// until `shutdown`. `current` is what the Node carried at start-up.
pub(crate) async fn run(
    client: kube::Client,
    node: String,
    managed: &'static [&'static str],
    current: NodeLabels,
    mut wanted: watch::Receiver<NodeLabels>,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let mut current = managed_subset(&current, managed);
    let mut backoff = Backoff::new(BackoffConfig::default());
    loop {
        let target = wanted.borrow_and_update().clone();
        let mut retry = None;
        if let Some(patch) = label_patch(&current, &target, managed) {
            match api
                .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(%node, labels = ?managed_subset(&target, managed), "Node labels updated");
                    current = managed_subset(&target, managed);
                    backoff = Backoff::new(BackoffConfig::default());
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(%node, %error, retry_in_ms = delay.as_millis() as u64, "updating Node labels failed");
                    retry = Some(delay);
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = wanted.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = async {
                match retry {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANAGED: &[&str] = &["x.example.com/a", "x.example.com/b"];

    fn labels(pairs: &[(&str, &str)]) -> NodeLabels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn patches_only_managed_keys_that_differ() {
        let node = labels(&[("kubernetes.io/hostname", "n1"), ("x.example.com/a", "1")]);
        assert_eq!(
            label_patch(&node, &labels(&[("x.example.com/a", "1")]), MANAGED),
            None,
            "already there"
        );
        assert_eq!(
            label_patch(
                &node,
                &labels(&[("x.example.com/a", "2"), ("x.example.com/b", "3")]),
                MANAGED
            ),
            Some(
                serde_json::json!({"metadata": {"labels": {"x.example.com/a": "2", "x.example.com/b": "3"}}})
            )
        );
        assert_eq!(
            label_patch(&node, &NodeLabels::new(), MANAGED),
            Some(serde_json::json!({"metadata": {"labels": {"x.example.com/a": null}}})),
            "a managed label no longer wanted is removed"
        );
        assert_eq!(
            label_patch(
                &NodeLabels::new(),
                &labels(&[("other.example.com/c", "1")]),
                MANAGED
            ),
            None,
            "keys the driver does not manage are never written"
        );
    }
}
