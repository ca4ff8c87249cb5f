//! Where claim status is written: server-side apply to a claim's `status`
//! subresource (production), or a recorder (tests); and the counter of
//! writes.
//!
//! Every apply body names the claim's UID (`metadata.uid`,
//! [`crate::prepare::status::entry::apply_body`]): the precondition that it
//! still is the claim we prepared. The API server has no precondition field
//! for a patch, but an apply to an object whose UID differs would change an
//! immutable field, which it refuses (422 `Invalid`, cause `metadata.uid`;
//! `BeforeUpdate` in the apiserver's `registry/rest/update.go`), before
//! anything is written; the status strategy keeps the UID of the request
//! (`ResetObjectMetaForStatus` does not reset it), and the field manager
//! does not own `metadata.uid`, so naming it costs nothing when it matches.
//! Where no object has that name the status subresource answers 404 (it
//! never creates one); an apply to a main resource that may create answers
//! 409 `uid mismatch` instead, also read as [`ApplyError::Stale`]. Seen
//! against kube-apiserver 1.34.4 and 1.37.2: the old claim's clear and set
//! on a claim recreated under its name answered 422 and left its entries
//! as they were; the same clear without the UID removed them.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use prometheus::{IntCounterVec, Opts, Registry};

/// Bound of one apply request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why one apply failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ApplyError {
    /// The claim is gone (404): nothing to write, nothing to clear.
    #[error("the claim is gone")]
    Gone,
    /// A claim of that name exists but with another UID: ours was deleted
    /// and the name reused. Its entries went with it; this write is not
    /// for the new claim.
    #[error("the claim under this name is another one (another UID)")]
    Stale,
    /// The API server refused it for good (forbidden, invalid: e.g. the
    /// device was deallocated meanwhile); retrying would not help.
    #[error("refused: {0}")]
    Refused(String),
    /// Worth another try (timeout, connection, 5xx, throttling).
    #[error("{0}")]
    Transient(String),
}

/// Applies a claim's status as this driver's field manager.
pub(crate) trait StatusApi: Send + Sync + 'static {
    fn apply<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), ApplyError>>;
}

/// Server-side apply through `kube`, field manager = the driver name.
pub(crate) struct KubeStatusApi {
    client: kube::Client,
    field_manager: String,
}

impl KubeStatusApi {
    pub(crate) fn new(client: kube::Client, field_manager: &str) -> Self {
        Self {
            client,
            field_manager: field_manager.to_owned(),
        }
    }
}

impl StatusApi for KubeStatusApi {
    fn apply<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        body: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), ApplyError>> {
        Box::pin(async move {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
            // Forced: the entries keyed by our driver name are ours alone,
            // whoever touched them last (kubectl edit, an earlier version).
            let params = PatchParams::apply(&self.field_manager).force();
            let patch = Patch::Apply(body);
            let call = api.patch_status(name, &params, &patch);
            match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
                Err(_) => Err(ApplyError::Transient(format!(
                    "no answer within {REQUEST_TIMEOUT:?}"
                ))),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(status))) => Err(classify_status(&status)),
                Ok(Err(e)) => Err(ApplyError::Transient(e.to_string())),
            }
        })
    }
}

/// An API server's refusal as an [`ApplyError`]: one whose cause is
/// `metadata.uid` is [`ApplyError::Stale`].
pub(crate) fn classify_status(status: &kube::core::Status) -> ApplyError {
    let uid_cause = status
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"));
    if uid_cause && status.code == 422 {
        return ApplyError::Stale;
    }
    classify(status.code, status.message.clone())
}

/// An API server's answer code (and message, for the UID refusals that
/// come without causes) as an [`ApplyError`].
pub(crate) fn classify(code: u16, message: String) -> ApplyError {
    match code {
        404 => ApplyError::Gone,
        409 if message.contains("uid mismatch") => ApplyError::Stale,
        422 if message.contains("metadata.uid") => ApplyError::Stale,
        408 | 429 | 500..=599 => ApplyError::Transient(format!("{code}: {message}")),
        _ => ApplyError::Refused(format!("{code}: {message}")),
    }
}

/// `aws_dra_plugin_claim_status_writes_total{result}`: `applied`,
/// `failed` (given up after the retries, or refused), `dropped` (queue
/// full), `gone` (no claim of that name), `stale` (the name is another
/// claim's now).
#[derive(Clone)]
pub(crate) struct StatusMetrics {
    writes: IntCounterVec,
}

impl StatusMetrics {
    pub(crate) fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let writes = IntCounterVec::new(
            Opts::new(
                "aws_dra_plugin_claim_status_writes_total",
                "Writes of claim device status (status.devices), by result: applied, failed \
                 (refused, or given up after the retries), dropped (queue full), gone (the \
                 claim was deleted), stale (the claim was deleted and its name reused: the \
                 write, guarded by the claim's UID, is not applied to the new claim).",
            ),
            &["result"],
        )?;
        registry.register(Box::new(writes.clone()))?;
        Ok(Self { writes })
    }

    pub(crate) fn write(&self, result: &str) {
        self.writes.with_label_values(&[result]).inc();
    }

    #[cfg(test)]
    pub(crate) fn count(&self, result: &str) -> u64 {
        self.writes.with_label_values(&[result]).get()
    }
}
