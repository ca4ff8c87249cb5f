//! The API calls the publisher makes, as one small trait, so that the loop
//! runs unchanged against the API server ([`KubeApi`]) and against an
//! in-memory double in its tests.
//!
//! Every create and update names our field manager: the mark by which
//! [`crate::publish::clash::is_ours`] knows our slices.

use std::future::Future;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use crate::publish::clash::FIELD_MANAGER;

pub(crate) use crate::publish::node_event::NODE_EVENT_NAMESPACE;

/// The publisher's requests. Each returns what the server answered; errors
/// are kube's, so that the callers can tell a conflict from an outage.
pub(crate) trait PoolApi {
    /// POST a slice; the stored object on success.
    fn create(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = kube::Result<ResourceSlice>> + Send;
    /// PUT a slice (its `resourceVersion` is the precondition); the stored
    /// object on success.
    fn replace(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = kube::Result<ResourceSlice>> + Send;
    /// DELETE a slice, with a UID precondition when one is known. A slice
    /// already gone is a success: that is what was asked.
    fn delete(
        &self,
        name: &str,
        uid: Option<String>,
    ) -> impl Future<Output = kube::Result<()>> + Send;
    /// GET a slice by name (a consistent read); `None` when there is none.
    fn get(&self, name: &str) -> impl Future<Output = kube::Result<Option<ResourceSlice>>> + Send;
    /// POST a Node event.
    fn post_event(&self, event: &CoreEvent) -> impl Future<Output = kube::Result<()>> + Send;
}

/// [`PoolApi`] on the API server.
#[derive(Clone)]
pub(super) struct KubeApi {
    slices: Api<ResourceSlice>,
    events: Api<CoreEvent>,
}

impl KubeApi {
    pub(super) fn new(client: kube::Client) -> Self {
        Self {
            events: Api::namespaced(client.clone(), NODE_EVENT_NAMESPACE),
            slices: Api::all(client),
        }
    }

    /// The slices of every node, for the watch.
    pub(super) fn slices(&self) -> Api<ResourceSlice> {
        self.slices.clone()
    }
}

fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    }
}

impl PoolApi for KubeApi {
    async fn create(&self, slice: &ResourceSlice) -> kube::Result<ResourceSlice> {
        self.slices.create(&write_params(), slice).await
    }

    async fn replace(&self, slice: &ResourceSlice) -> kube::Result<ResourceSlice> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        self.slices.replace(name, &write_params(), slice).await
    }

    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.slices.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn get(&self, name: &str) -> kube::Result<Option<ResourceSlice>> {
        self.slices.get_opt(name).await
    }

    async fn post_event(&self, event: &CoreEvent) -> kube::Result<()> {
        self.events
            .create(&PostParams::default(), event)
            .await
            .map(drop)
    }
}
