//! Serving kubelet before the API server has answered.
//!
//! The daemon binds kubelet's sockets from local state (the first scan,
//! the checkpoint) before it contacts the API server, so a node that boots
//! during a control-plane outage still has a plugin: unprepare runs from
//! the checkpoint alone and health reaches kubelet. What needs the cluster
//! waits for the first answer (the Node read, retried forever with
//! [`NODE_READ_BACKOFF`]): the refusal to run beside the classic device
//! plugin, the Node's labels and the API probe that the scan may use, and so
//! publishing and prepare. Until then a prepare is answered, per claim, with
//! an error that says so ([`ApiServerGate`] in front of the claim source);
//! kubelet retries a failed prepare on its own.

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;

use crate::prepare::claims::{ClaimSource, ClaimSourceError};
use crate::publish::BackoffConfig;

/// How the Node read at start is retried: 0.5 s doubling to at most 15 s
/// (each delay drawn from the upper half of that window). A driver notices
/// the API server's return within 15 s; a fleet of 1,000 nodes waiting for
/// it sends about 70-130 reads a second, each refused at once while it is
/// down.
pub(crate) const NODE_READ_BACKOFF: BackoffConfig = BackoffConfig {
    initial: std::time::Duration::from_millis(500),
    max: std::time::Duration::from_secs(15),
};

/// Opened once the API server has answered and the scan has what it said;
/// closed until then.
#[derive(Debug, Clone)]
pub(crate) struct ApiServerGate {
    open: Arc<watch::Sender<bool>>,
}

impl Default for ApiServerGate {
    fn default() -> Self {
        Self {
            open: Arc::new(watch::channel(false).0),
        }
    }
}

impl ApiServerGate {
    /// Lets prepares through from now on.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }

    /// Whether [`Self::open`] was called.
    pub(crate) fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// `claims`, refused while the gate is closed.
    pub(crate) fn guard(&self, claims: Arc<dyn ClaimSource>) -> GatedClaims {
        GatedClaims {
            gate: self.clone(),
            claims,
        }
    }
}

/// The message of a prepare refused before the API server answered.
pub(crate) const NOT_YET: &str = "the API server has not answered this driver since it started \
     (it keeps retrying; unprepare works meanwhile); prepare is retried by kubelet";

/// A claim source that refuses every read until its gate opens.
pub(crate) struct GatedClaims {
    gate: ApiServerGate,
    claims: Arc<dyn ClaimSource>,
}

impl ClaimSource for GatedClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        if !self.gate.is_open() {
            let refused = ClaimSourceError {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                message: NOT_YET.to_owned(),
            };
            return Box::pin(async move { Err(refused) });
        }
        self.claims.get(namespace, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::claims::InMemoryClaimSource;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[tokio::test]
    async fn claims_are_refused_until_the_gate_opens_and_read_after() {
        let store = InMemoryClaimSource::new();
        store.insert(ResourceClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("c".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let gate = ApiServerGate::default();
        let claims = gate.guard(Arc::new(store.clone()));
        let refused = claims.get("ns", "c").await.expect_err("gate closed");
        assert!(refused.to_string().contains("ns/c"), "{refused}");
        assert!(refused.message.contains("API server has not answered"));
        assert_eq!(store.get_count(), 0, "nothing is asked while closed");
        gate.open();
        assert!(claims.get("ns", "c").await.unwrap().is_some());
        assert_eq!(store.get_count(), 1);
    }

    #[test]
    fn the_node_read_backoff_is_capped_at_fifteen_seconds() {
        let mut backoff = crate::publish::Backoff::new(NODE_READ_BACKOFF);
        let delays: Vec<_> = (0..12).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] <= std::time::Duration::from_millis(500));
        assert!(
            delays
                .iter()
                .all(|d| *d <= std::time::Duration::from_secs(15)),
            "{delays:?}"
        );
        assert!(
            delays[8..]
                .iter()
                .all(|d| *d >= std::time::Duration::from_millis(7500))
        );
    }
}
