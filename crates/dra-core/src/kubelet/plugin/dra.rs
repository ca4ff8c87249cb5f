//! The DRA plugin service in both API versions: checks what kubelet sent,
//! hands the claims to the prepare pipeline, and answers within a deadline.
//!
//! An empty `NodePrepareResources` (the liveness self-check sends one) is
//! answered at once: it has nothing to prepare, so it takes no lock and
//! reads no checkpoint, and a probe storm costs prepare nothing but the
//! gRPC round trip. Claim UIDs are checked ([`check_claim_uid`]) before
//! they can become a file name; one that is not a Kubernetes UID fails the
//! call with `INVALID_ARGUMENT`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::kubelet::plugin::claim_uid::check_claim_uid;
use crate::kubelet::proto::{dra_v1, dra_v1beta1};
use crate::prepare::driver::{ClaimRef, Driver};
use crate::prepare::metrics::PluginMetrics;
use crate::prepare::state::{ClaimPipeline, PipelineError};

pub(super) struct DraService<D: Driver> {
    pub(super) pipeline: Arc<ClaimPipeline<D>>,
    pub(super) metrics: PluginMetrics,
    /// Longest a prepare or unprepare may take before it is answered
    /// `DEADLINE_EXCEEDED`.
    pub(super) deadline: Duration,
}

fn pipeline_status(e: PipelineError) -> Status {
    tracing::error!(error = %e, "DRA call failed as a whole");
    Status::internal(e.to_string())
}

/// Every claim of a call has a Kubernetes UID, or the call fails as a
/// whole: kubelet never sends anything else, so whoever did is not kubelet.
fn check_uids<'a>(uids: impl IntoIterator<Item = &'a str>) -> Result<(), Status> {
    for uid in uids {
        check_claim_uid(uid).map_err(|why| {
            tracing::warn!(error = why, "DRA call refused: bad claim UID");
            Status::invalid_argument(why)
        })?;
    }
    Ok(())
}

/// `call`, or `DEADLINE_EXCEEDED` once `deadline` has passed (what is done
/// by then stays done: the pipeline commits whole groups or nothing).
async fn within<T>(
    what: &'static str,
    deadline: Duration,
    call: impl Future<Output = Result<T, PipelineError>>,
) -> Result<T, Status> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result.map_err(pipeline_status),
        Err(_) => {
            tracing::error!(
                call = what,
                ?deadline,
                "DRA call not finished within its deadline"
            );
            Err(Status::deadline_exceeded(format!(
                "{what} did not finish within {deadline:?}"
            )))
        }
    }
}

macro_rules! dra_service_version {
    ($pb:ident) => {
        impl From<$pb::Claim> for ClaimRef {
            fn from(c: $pb::Claim) -> Self {
                ClaimRef {
                    namespace: c.namespace,
                    name: c.name,
                    uid: c.uid,
                }
            }
        }

        // v1's Device has `share_id` (left unset), v1beta1's has not.
        #[allow(clippy::needless_update)]
        #[tonic::async_trait]
        impl<D: Driver> $pb::dra_plugin_server::DraPlugin for DraService<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<$pb::NodePrepareResourcesRequest>,
            ) -> Result<Response<$pb::NodePrepareResourcesResponse>, Status> {
                let request = request.into_inner();
                if request.claims.is_empty() {
                    return Ok(Response::new(Default::default()));
                }
                check_uids(request.claims.iter().map(|c| c.uid.as_str()))?;
                let _in_flight = self.metrics.in_flight("prepare");
                let claims = request.claims.into_iter().map(ClaimRef::from).collect();
                let answers = within(
                    "NodePrepareResources",
                    self.deadline,
                    self.pipeline.prepare(claims),
                )
                .await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let entry = match outcome {
                            Ok(devices) => $pb::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|d| $pb::Device {
                                        request_names: d.request_names,
                                        pool_name: d.pool,
                                        device_name: d.device,
                                        cdi_device_ids: d.cdi_device_ids,
                                        ..Default::default()
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => $pb::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, entry)
                    })
                    .collect();
                Ok(Response::new($pb::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$pb::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$pb::NodeUnprepareResourcesResponse>, Status> {
                let request = request.into_inner();
                if request.claims.is_empty() {
                    return Ok(Response::new(Default::default()));
                }
                check_uids(request.claims.iter().map(|c| c.uid.as_str()))?;
                let _in_flight = self.metrics.in_flight("unprepare");
                let claims = request.claims.into_iter().map(ClaimRef::from).collect();
                let answers = within(
                    "NodeUnprepareResources",
                    self.deadline,
                    self.pipeline.unprepare(claims),
                )
                .await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, outcome)| {
                        (
                            uid,
                            $pb::NodeUnprepareResourceResponse {
                                error: outcome.err().unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new($pb::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_service_version!(dra_v1);
dra_service_version!(dra_v1beta1);
