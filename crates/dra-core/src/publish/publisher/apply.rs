//! Applying a reconcile's actions: in order, stopping at the first failure
//! (the next reconcile recomputes from what is known then), one log line
//! per action.
//!
//! Each successful write goes into [`OwnWrites`], so that the next reconcile
//! sees it before the watch does. A create refused because the slice
//! already exists (an earlier create whose answer was lost to a timeout, a
//! view that does not show it yet) and an update refused as a conflict (the
//! view's version is old) are not written again blindly: the slice is read
//! back, what the read finds goes into [`OwnWrites`], and the reconcile
//! runs again at once on that.

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::Instant;

use super::api::PoolApi;
use super::config::PublishMetrics;
use super::settle::OwnWrites;
use super::taints::taints_dropped;
use crate::publish::reconcile::SliceAction;

/// How a round of writes ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Applied {
    /// Every action succeeded. `taints_dropped`: a write sent device
    /// taints and the stored object has none.
    Done { taints_dropped: bool },
    /// A write was refused because the view was behind; the slice has been
    /// read back: reconcile again now.
    ReadBack,
    /// A call failed: retry after the backoff.
    Failed,
}

/// Did the server refuse a write because the object is not what the view
/// showed (already exists, or another version)?
fn refused_as_stale(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Applies `actions` in order; see the module doc.
pub(super) async fn apply(
    api: &impl PoolApi,
    actions: Vec<SliceAction>,
    own: &mut OwnWrites,
    metrics: &PublishMetrics,
) -> Applied {
    let mut dropped = false;
    for action in actions {
        let verb = action.verb();
        let name = action.slice_name().to_owned();
        let (generation, devices) = match &action {
            SliceAction::Create(s) | SliceAction::Update(s) => (
                s.spec.pool.generation,
                s.spec.devices.as_ref().map_or(0, Vec::len),
            ),
            SliceAction::Delete { .. } => (0, 0),
        };
        let result = match action {
            SliceAction::Create(s) => api.create(&s).await.map(|stored| {
                dropped |= taints_dropped(&s, &stored);
                own.wrote(&stored, Instant::now());
            }),
            SliceAction::Update(s) => api.replace(&s).await.map(|stored| {
                dropped |= taints_dropped(&s, &stored);
                own.wrote(&stored, Instant::now());
            }),
            SliceAction::Delete { name, uid } => api
                .delete(&name, uid.clone())
                .await
                .map(|()| own.deleted(&name, uid, Instant::now())),
        };
        match result {
            Ok(()) => {
                metrics.slice_writes.with_label_values(&[verb]).inc();
                tracing::info!(action = verb, slice = %name, generation, devices, "resourceslice written");
            }
            Err(error) if verb != "delete" && refused_as_stale(&error) => {
                metrics.publish_errors.with_label_values(&[verb]).inc();
                tracing::info!(action = verb, slice = %name, %error, "resourceslice is not as our view shows; reading it back");
                return read_back(api, &name, own, metrics).await;
            }
            Err(error) => {
                metrics.publish_errors.with_label_values(&[verb]).inc();
                tracing::warn!(action = verb, slice = %name, %error, "resourceslice write failed");
                return Applied::Failed;
            }
        }
    }
    Applied::Done {
        taints_dropped: dropped,
    }
}

/// Reads `name` back after a refused write and keeps what it finds.
async fn read_back(
    api: &impl PoolApi,
    name: &str,
    own: &mut OwnWrites,
    metrics: &PublishMetrics,
) -> Applied {
    match api.get(name).await {
        Ok(Some(found)) => {
            own.wrote(&found, Instant::now());
            Applied::ReadBack
        }
        Ok(None) => {
            own.deleted(name, None, Instant::now());
            Applied::ReadBack
        }
        Err(error) => {
            metrics.publish_errors.with_label_values(&["get"]).inc();
            tracing::warn!(slice = %name, %error, "resourceslice read failed");
            Applied::Failed
        }
    }
}

/// Reads back the own writes the watch has not shown within their time
/// (see [`super::settle`]); `seen` is the watch's view. Stops at the first
/// failed read.
pub(super) async fn check_unsettled(
    api: &impl PoolApi,
    own: &mut OwnWrites,
    seen: &[std::sync::Arc<ResourceSlice>],
    metrics: &PublishMetrics,
) -> Result<(), ()> {
    for name in own.due(Instant::now()) {
        match api.get(&name).await {
            Ok(found) => {
                let current = seen
                    .iter()
                    .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
                own.read_back(&name, found, current.map(|s| &**s), Instant::now());
            }
            Err(error) => {
                metrics.publish_errors.with_label_values(&["get"]).inc();
                tracing::warn!(slice = %name, %error, "resourceslice read failed");
                return Err(());
            }
        }
    }
    Ok(())
}
