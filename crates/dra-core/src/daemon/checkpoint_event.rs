//! A Node event when the plugin's checkpoint turns out to be a newer
//! driver's (a rollback, or the old pod of a surge upgrade): no new claim
//! is prepared on this node until a driver that reads it runs, which an
//! operator must hear of where they look (`kubectl describe node`), beside
//! `/readyz` and `aws_dra_checkpoint_errors_total{reason="newer"}`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use crate::publish::node_event::{NODE_EVENT_NAMESPACE, NodeReporter};

/// Reason of the Node event.
pub(crate) const NEWER_CHECKPOINT_REASON: &str = "CheckpointOfNewerDriver";

/// Longest wait for the event's create (a courtesy; nothing waits for it).
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Posts one Warning event each time the checkpoint becomes a newer
/// driver's (`newer` turns from `None` to the refusal), until the plugin
/// stops. Best effort: a failure is logged, never retried.
pub(crate) async fn report_newer(
    client: kube::Client,
    reporter: NodeReporter<'_>,
    mut newer: watch::Receiver<Option<String>>,
) {
    let events: Api<CoreEvent> = Api::namespaced(client, NODE_EVENT_NAMESPACE);
    let mut reported = false;
    loop {
        let refusal = newer.borrow_and_update().clone();
        match refusal {
            Some(refusal) if !reported => {
                reported = true;
                let event = newer_event(&reporter, refusal);
                let params = PostParams::default();
                let create = events.create(&params, &event);
                match tokio::time::timeout(EVENT_TIMEOUT, create).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "could not create the Node event of the newer checkpoint")
                    }
                    Err(_) => {
                        tracing::warn!("creating the Node event of the newer checkpoint timed out")
                    }
                }
            }
            Some(_) => {}
            None => reported = false,
        }
        if newer.changed().await.is_err() {
            return;
        }
    }
}

fn newer_event(reporter: &NodeReporter<'_>, refusal: String) -> CoreEvent {
    reporter.warning(
        NEWER_CHECKPOINT_REASON,
        "RefusePrepare",
        refusal,
        k8s_openapi::jiff::Timestamp::now(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_names_the_node_and_says_why() {
        let reporter = NodeReporter {
            driver: "efa.networking.k8s.aws",
            node: "n1",
            node_uid: Some("uid-n1"),
        };
        let e = newer_event(&reporter, "checkpoint x has version 2".into());
        assert_eq!(e.reason.as_deref(), Some(NEWER_CHECKPOINT_REASON));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.name.as_deref(), Some("n1"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("uid-n1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.message.as_deref(), Some("checkpoint x has version 2"));
    }
}
