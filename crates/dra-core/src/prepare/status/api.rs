//! Where claim status is written: server-side apply to a claim's `status`
//! subresource (production), or a recorder (tests); and the counter of
//! writes.

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
                Ok(Err(kube::Error::Api(status))) => Err(classify(status.code, status.message)),
                Ok(Err(e)) => Err(ApplyError::Transient(e.to_string())),
            }
        })
    }
}

/// An API server's answer code as an [`ApplyError`].
pub(crate) fn classify(code: u16, message: String) -> ApplyError {
    match code {
        404 => ApplyError::Gone,
        408 | 429 | 500..=599 => ApplyError::Transient(format!("{code}: {message}")),
        _ => ApplyError::Refused(format!("{code}: {message}")),
    }
}

/// `aws_dra_plugin_claim_status_writes_total{result}`: `applied`,
/// `failed` (given up after the retries, or refused), `dropped` (queue
/// full).
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
                 (refused, or given up after the retries), dropped (queue full).",
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
