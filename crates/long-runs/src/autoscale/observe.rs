//! Reading what Karpenter, the scheduler and KWOK did, from the API: one
//! poll of everything the run times (NodeClaims, the Node, the drivers'
//! pools, the pod), and Karpenter's events on a pod.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;

/// The NodeClaims of the cluster (karpenter.sh/v1).
pub fn nodeclaims(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "nodeclaims"),
    )
}

/// One NodeClaim as the run reports it.
#[derive(Debug, Clone, Default)]
pub struct ClaimView {
    pub name: String,
    pub candidate_types: Vec<String>,
    pub requested_dra_drivers: Option<String>,
    pub node: Option<String>,
    pub initialized: bool,
}

/// Every NodeClaim, oldest first.
pub async fn list_nodeclaims(client: &Client) -> Result<Vec<ClaimView>> {
    let mut list = nodeclaims(client)
        .list(&ListParams::default())
        .await
        .context("listing NodeClaims")?
        .items;
    list.sort_by_key(|o| o.metadata.creation_timestamp.clone());
    Ok(list.iter().map(claim_view).collect())
}

/// The fields of a NodeClaim the run reports.
pub fn claim_view(o: &DynamicObject) -> ClaimView {
    let spec = &o.data["spec"];
    let status = &o.data["status"];
    let candidate_types = spec["requirements"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["key"] == "node.kubernetes.io/instance-type")
        .flat_map(|r| r["values"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let initialized = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Initialized" && c["status"] == "True");
    ClaimView {
        name: o.metadata.name.clone().unwrap_or_default(),
        candidate_types,
        requested_dra_drivers: o
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("karpenter.sh/requested-dra-drivers"))
            .cloned(),
        node: status["nodeName"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        initialized,
    }
}

/// The drivers with a complete pool on `node` (all slices of the pool's
/// newest generation present), as Karpenter's initialization counts them.
pub async fn complete_pools(client: &Client, node: &str) -> Result<Vec<String>> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing ResourceSlices")?
        .items;
    let on_node: Vec<Value> = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
        .map(|s| serde_json::to_value(&s.spec).unwrap_or_default())
        .collect();
    Ok(complete_pool_drivers(&on_node))
}

/// [`complete_pools`] on slice specs (JSON).
pub fn complete_pool_drivers(specs: &[Value]) -> Vec<String> {
    // (driver, pool) → (generation, declared count, seen at that generation)
    let mut pools: BTreeMap<(String, String), (i64, i64, i64)> = BTreeMap::new();
    for s in specs {
        let key = (
            s["driver"].as_str().unwrap_or_default().to_string(),
            s["pool"]["name"].as_str().unwrap_or_default().to_string(),
        );
        let generation = s["pool"]["generation"].as_i64().unwrap_or(0);
        let count = s["pool"]["resourceSliceCount"].as_i64().unwrap_or(0);
        let entry = pools.entry(key).or_insert((generation, count, 0));
        if generation > entry.0 {
            *entry = (generation, count, 0);
        }
        if generation == entry.0 {
            entry.2 += 1;
        }
    }
    let mut drivers: Vec<String> = pools
        .into_iter()
        .filter(|(_, (_, count, seen))| *count > 0 && seen == count)
        .map(|((driver, _), _)| driver)
        .collect();
    drivers.dedup();
    drivers
}

/// The pod's node (once bound) and phase.
pub async fn pod_state(client: &Client, ns: &str, pod: &str) -> Result<(Option<String>, String)> {
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .with_context(|| format!("reading pod {ns}/{pod}"))?;
    let node = p.spec.and_then(|s| s.node_name);
    let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
    Ok((node, phase))
}

/// The devices allocated to the claims of `pod` (`driver/pool/device`).
pub async fn allocated_devices(client: &Client, ns: &str, pod: &str) -> Result<Vec<String>> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .context("listing ResourceClaims")?
        .items;
    let mut out = Vec::new();
    for c in claims {
        let owned = c
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Pod" && o.name == pod);
        if !owned {
            continue;
        }
        let results = c
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        out.extend(
            results
                .into_iter()
                .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device)),
        );
    }
    Ok(out)
}

/// Karpenter's last listed event on `pod` (`reason: message`), if any.
pub async fn karpenter_event(client: &Client, ns: &str, pod: &str) -> Result<Option<String>> {
    let events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .context("listing events")?
        .items;
    Ok(events
        .iter()
        .rfind(|e| {
            e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("karpenter")
                || e.reporting_component.as_deref() == Some("karpenter")
        })
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or("-"),
                e.message.as_deref().unwrap_or("").trim()
            )
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(driver: &str, generation: i64, count: i64) -> Value {
        json!({"driver": driver, "pool": {"name": "n", "generation": generation, "resourceSliceCount": count}})
    }

    #[test]
    fn a_pool_is_complete_with_every_slice_of_its_newest_generation() {
        let specs = [
            slice("efa.networking.k8s.aws", 1, 1),
            slice("neuron.aws.com", 2, 2),
            slice("neuron.aws.com", 1, 1),
        ];
        // Neuron: one of the two slices of generation 2 so far.
        assert_eq!(complete_pool_drivers(&specs), ["efa.networking.k8s.aws"]);
        let mut specs = specs.to_vec();
        specs.push(slice("neuron.aws.com", 2, 2));
        assert_eq!(
            complete_pool_drivers(&specs),
            ["efa.networking.k8s.aws", "neuron.aws.com"]
        );
    }

    #[test]
    fn a_nodeclaim_view_reads_candidates_annotation_node_and_initialized() {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "aws-dra-x", "annotations": {"karpenter.sh/requested-dra-drivers": "a,b"}},
            "spec": {"requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["trn2.48xlarge"]},
            ]},
            "status": {"nodeName": "kwok-x", "conditions": [{"type": "Initialized", "status": "True"}]},
        }))
        .unwrap();
        let v = claim_view(&o);
        assert_eq!(v.candidate_types, ["trn2.48xlarge"]);
        assert_eq!(v.requested_dra_drivers.as_deref(), Some("a,b"));
        assert_eq!(v.node.as_deref(), Some("kwok-x"));
        assert!(v.initialized);
    }
}
