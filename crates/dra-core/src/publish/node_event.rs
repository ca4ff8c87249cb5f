//! Warning events about this node, as the driver reports them: a clash with
//! another driver's slices ([`crate::publish::publisher`]), a checkpoint
//! written by a newer driver (`daemon::runtime`). One shape for all, so that
//! the RBAC rule and the admission policy that allow them (namespace
//! `default`, the node as the involved object) cover every one.

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// Where Node events go: the namespace kubelet uses for its own Node events
/// (a Node has none; `kubectl describe node` finds them there).
pub(crate) const NODE_EVENT_NAMESPACE: &str = "default";

/// The driver on one node, as the reporter of its events.
#[derive(Debug, Clone)]
pub(crate) struct NodeReporter<'a> {
    pub(crate) driver: &'a str,
    pub(crate) node: &'a str,
    /// The Node's UID, when read.
    pub(crate) node_uid: Option<&'a str>,
}

impl NodeReporter<'_> {
    /// A Warning event on the Node, counted once, at `now`.
    pub(crate) fn warning(
        &self,
        reason: &str,
        action: &str,
        message: String,
        now: Timestamp,
    ) -> CoreEvent {
        let node = self.node.to_owned();
        CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{node}.")),
                namespace: Some(NODE_EVENT_NAMESPACE.to_owned()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                uid: self.node_uid.map(str::to_owned),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some("Warning".into()),
            action: Some(action.into()),
            source: Some(EventSource {
                component: Some(self.driver.to_owned()),
                host: Some(node.clone()),
            }),
            reporting_component: Some(self.driver.to_owned()),
            reporting_instance: Some(node),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Default::default()
        }
    }
}
