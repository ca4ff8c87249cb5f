//! Shadow nodes: Node objects that no kubelet serves, each carrying a copy
//! of one real node's ResourceSlices, for scenarios that need the real
//! kube-scheduler's allocations in bulk but never a running pod.
//!
//! A pod the scheduler binds to a shadow node is allocated its claims
//! exactly as on the real node (same devices, same attributes, same
//! capacities: the slices are copied as raw JSON, so fields newer than our
//! API types survive), but no kubelet prepares it, starts it or tears it
//! down. Deleting it takes one API call with a zero grace period. On the
//! CI machine that turns the CEL differential's 262 pods from minutes of
//! kubelet and driver work (and a slower cluster for every scenario beside
//! it) into scheduler work only.
//!
//! The copies differ from the originals in three things only: the slice's
//! name, `spec.nodeName` (the shadow node) and `spec.pool.name` (prefixed,
//! so that no pool has two owners). Each copy is owned by its shadow node,
//! so deleting the node lets the garbage collector remove whatever a failed
//! scenario left behind.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::kit;
use crate::testbed::Testbed;

/// The label every shadow node and slice carries; a pod selects shadow
/// nodes with it.
pub const LABEL: &str = "e2e.aws-dra.dev/shadow";

/// The prefix of a shadow node's name, and of its pools' names.
const PREFIX: &str = "shadow-";

fn slices_api(tb: &impl Testbed) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    Api::all_with(tb.client(), &ApiResource::from_gvk(&gvk))
}

/// The shadow nodes made by [`create`]: real node name → shadow node name.
#[derive(Debug, Default)]
pub struct Shadows {
    pub nodes: BTreeMap<String, String>,
    pub slices: usize,
}

/// What makes pod `pod` schedulable on shadow nodes only: the node selector
/// and a toleration of every taint (the node lifecycle controller marks a
/// node without kubelet unreachable after its grace period).
pub fn pin_to_shadows(pod: &mut Value) {
    pod["spec"]["nodeSelector"] = json!({ LABEL: "true" });
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
}

/// One shadow node for every node that has node-local ResourceSlices now,
/// with a copy of each of those slices.
pub async fn create(tb: &impl Testbed) -> Result<Shadows> {
    let slices = slices_api(tb)
        .list(&ListParams::default())
        .await
        .context("listing ResourceSlices to copy")?;
    let nodes: Api<Node> = Api::all(tb.client());
    let mut shadows = Shadows::default();
    let mut owners: BTreeMap<String, Value> = BTreeMap::new();
    for slice in slices.items {
        if slice.labels().contains_key(LABEL) {
            continue;
        }
        let Some(real) = slice.data["spec"]["nodeName"].as_str().map(str::to_string) else {
            continue;
        };
        if !owners.contains_key(&real) {
            let shadow = format!("{PREFIX}{real}");
            let node = create_node(&nodes, &shadow, &BTreeMap::new()).await?;
            owners.insert(real.clone(), node);
            shadows.nodes.insert(real.clone(), shadow);
        }
        let shadow = &shadows.nodes[&real];
        let mut spec = slice.data["spec"].clone();
        spec["nodeName"] = json!(shadow);
        let pool = spec["pool"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        spec["pool"]["name"] = json!(format!("{PREFIX}{pool}"));
        let name = format!(
            "{PREFIX}{}",
            slice.metadata.name.as_deref().unwrap_or("slice")
        );
        let copy: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "labels": { LABEL: "true" },
                "ownerReferences": [owners[&real]],
            },
            "spec": spec,
        }))?;
        slices_api(tb)
            .create(&PostParams::default(), &copy)
            .await
            .with_context(|| format!("creating shadow ResourceSlice {name}"))?;
        shadows.slices += 1;
    }
    Ok(shadows)
}

/// Shadow node `name` with `labels` (besides the shadow label and the
/// hostname), carrying a copy of every slice that driver `driver` publishes
/// for real node `real`, for each `(real, driver)` of `sources`. Each copy's
/// pool is named after the shadow node, as our drivers name theirs after
/// their node, so that many shadows of one real node keep their pools
/// apart. Returns how many slices it copied.
pub async fn create_from(
    tb: &impl Testbed,
    name: &str,
    labels: &BTreeMap<String, String>,
    sources: &[(&str, &str)],
) -> Result<usize> {
    let all = slices_api(tb)
        .list(&ListParams::default())
        .await
        .context("listing ResourceSlices to copy")?;
    let nodes: Api<Node> = Api::all(tb.client());
    let owner = create_node(&nodes, name, labels).await?;
    let mut copied = 0;
    for (real, driver) in sources {
        let of_source = all.items.iter().filter(|s| {
            !s.labels().contains_key(LABEL)
                && s.data["spec"]["nodeName"] == *real
                && s.data["spec"]["driver"] == *driver
        });
        for slice in of_source {
            let mut spec = slice.data["spec"].clone();
            spec["nodeName"] = json!(name);
            spec["pool"]["name"] = json!(name);
            let slice_name = format!(
                "{name}-{}",
                slice.metadata.name.as_deref().unwrap_or("slice")
            );
            let copy: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {
                    "name": slice_name,
                    "labels": { LABEL: "true" },
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }))?;
            slices_api(tb)
                .create(&PostParams::default(), &copy)
                .await
                .with_context(|| format!("creating shadow ResourceSlice {slice_name}"))?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// Creates Node `name` (no kubelet behind it) with `labels`, room for many
/// pods and a Ready condition; returns an owner reference to it.
async fn create_node(
    nodes: &Api<Node>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Value> {
    let mut all = json!({LABEL: "true", "kubernetes.io/hostname": name});
    for (k, v) in labels {
        all[k] = json!(v);
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all},
    }))?;
    let created = nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating shadow node {name}"))?;
    let resources = json!({"cpu": "1000", "memory": "4Ti", "pods": "1000"});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "ShadowNode",
                    "message": "no kubelet: an e2e shadow node"}],
            }})),
        )
        .await
        .with_context(|| format!("setting the status of shadow node {name}"))?;
    Ok(json!({
        "apiVersion": "v1", "kind": "Node", "name": name,
        "uid": created.metadata.uid.unwrap_or_default(),
    }))
}

/// Removes every pod of `ns` at once (zero grace period: no kubelet will
/// confirm), then the shadow slices and nodes. Safe to call after a
/// partial [`create`].
pub async fn remove(tb: &impl Testbed, ns: &str, timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods.delete_collection(&now, &ListParams::default())
        .await
        .with_context(|| format!("deleting the pods of {ns}"))?;
    kit::wait_for(tb, &format!("the pods of {ns} gone"), timeout, || async {
        Ok(pods
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    let shadow = ListParams::default().labels(&format!("{LABEL}=true"));
    slices_api(tb)
        .delete_collection(&DeleteParams::default(), &shadow)
        .await
        .context("deleting the shadow ResourceSlices")?;
    let nodes: Api<Node> = Api::all(tb.client());
    nodes
        .delete_collection(&DeleteParams::default(), &shadow)
        .await
        .context("deleting the shadow nodes")?;
    Ok(())
}
