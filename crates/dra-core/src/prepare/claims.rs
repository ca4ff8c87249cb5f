//! Where prepare reads `ResourceClaim`s from.
//!
//! Production reads the API server through `kube`; tests use the in-memory
//! source. Unprepare never reads claims (the claim may be gone by then).

#[cfg(any(test, feature = "testing"))]
use std::collections::HashMap;
#[cfg(any(test, feature = "testing"))]
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

/// A failed claim lookup (not "not found", which is `Ok(None)`).
#[derive(Debug, thiserror::Error)]
#[error("reading ResourceClaim {namespace}/{name}: {message}")]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct ClaimSourceError {
    pub namespace: String,
    pub name: String,
    pub message: String,
}

/// Reads one claim by namespace and name.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub trait ClaimSource: Send + Sync + 'static {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>>;
}

/// Reads claims from the API server.
#[derive(Clone)]
pub(crate) struct KubeClaimSource {
    client: kube::Client,
}

impl KubeClaimSource {
    /// Give it the publisher's client: its connection speaks HTTP/2
    /// (`crate::daemon::client`), so the claim GETs multiplex onto the
    /// connection the publisher's watch keeps open, and a prepare never
    /// opens one. (Over HTTP/1.1 the watch held its connection and a GET
    /// that found no idle one paid a TCP and TLS handshake inside kubelet's
    /// call, or 40 ms more when Nagle's algorithm met a delayed ACK.)
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl ClaimSource for KubeClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            api.get_opt(name).await.map_err(|e| ClaimSourceError {
                namespace: namespace.to_string(),
                name: name.to_string(),
                message: e.to_string(),
            })
        })
    }
}

/// Claims held in memory, keyed by namespace and name.
#[derive(Clone, Default)]
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct InMemoryClaimSource {
    claims: Arc<Mutex<HashMap<(String, String), ResourceClaim>>>,
    gets: Arc<std::sync::atomic::AtomicUsize>,
}

#[cfg(any(test, feature = "testing"))]
impl InMemoryClaimSource {
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a claim (keyed by its metadata namespace and name).
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        if let Ok(mut claims) = self.claims.lock() {
            claims.insert(key, claim);
        }
    }

    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn remove(&self, namespace: &str, name: &str) {
        if let Ok(mut claims) = self.claims.lock() {
            claims.remove(&(namespace.to_string(), name.to_string()));
        }
    }

    /// How many lookups were made (tests assert unprepare makes none).
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn get_count(&self) -> usize {
        self.gets.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(any(test, feature = "testing"))]
impl ClaimSource for InMemoryClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let found = self
            .claims
            .lock()
            .map(|c| c.get(&(namespace.to_string(), name.to_string())).cloned())
            .map_err(|_| ClaimSourceError {
                namespace: namespace.to_string(),
                name: name.to_string(),
                message: "in-memory claim store poisoned".to_string(),
            });
        Box::pin(async move { found })
    }
}
