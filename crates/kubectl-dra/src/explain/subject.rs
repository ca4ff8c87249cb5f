//! What is explained: a ResourceClaim, or each claim of a pod (its direct
//! claims, the claims generated from its templates, and the claim the
//! scheduler makes for DRA-served extended resources).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec,
};

use super::Scope;
use crate::inventory::Inventory;
use crate::world::claim_key;

/// One claim (or claim-to-be) to explain.
#[derive(Debug, Clone)]
pub struct Subject {
    /// How the report names it.
    pub label: String,
    /// `namespace/name` of the claim object, when there is one.
    pub key: Option<String>,
    pub spec: ResourceClaimSpec,
    pub allocation: Option<AllocationResult>,
    pub reserved_for: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SubjectError {
    #[error("ResourceClaim {0} not found (pass it with --from-file, or check -n)")]
    ClaimNotFound(String),
    #[error("Pod {0} not found (pass it with --from-file, or check -n)")]
    PodNotFound(String),
    #[error("pod {pod} refers to ResourceClaimTemplate {template}, which is not in the input")]
    TemplateNotFound { pod: String, template: String },
}

fn from_claim(claim: &ResourceClaim, label: String) -> Subject {
    let status = claim.status.as_ref();
    Subject {
        label,
        key: Some(claim_key(claim)),
        spec: claim.spec.clone(),
        allocation: status.and_then(|s| s.allocation.clone()),
        reserved_for: status
            .and_then(|s| s.reserved_for.as_ref())
            .map(|r| {
                r.iter()
                    .map(|c| format!("{} {}", c.resource, c.name))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub fn subjects_for_claim(
    inv: &Inventory,
    namespace: &str,
    name: &str,
) -> Result<Vec<Subject>, SubjectError> {
    let claim = inv
        .claim(namespace, name)
        .ok_or_else(|| SubjectError::ClaimNotFound(format!("{namespace}/{name}")))?;
    Ok(vec![from_claim(
        claim,
        format!("ResourceClaim {namespace}/{name}"),
    )])
}

/// The subjects of a pod, and the node it is bound to, if any.
pub fn subjects_for_pod(
    inv: &Inventory,
    namespace: &str,
    name: &str,
) -> Result<(Vec<Subject>, Scope), SubjectError> {
    let pod_key = format!("{namespace}/{name}");
    let pod: &Pod = inv
        .pod(namespace, name)
        .ok_or_else(|| SubjectError::PodNotFound(pod_key.clone()))?;
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let scope = Scope {
        node: spec.node_name.clone().filter(|n| !n.is_empty()),
        allowed: spec
            .node_selector
            .as_ref()
            .filter(|s| !s.is_empty())
            .map(|selector| allowed_nodes(inv, selector)),
    };
    let mut subjects = Vec::new();
    for pod_claim in spec.resource_claims.iter().flatten() {
        if let Some(claim_name) = &pod_claim.resource_claim_name {
            let claim = inv
                .claim(namespace, claim_name)
                .ok_or_else(|| SubjectError::ClaimNotFound(format!("{namespace}/{claim_name}")))?;
            subjects.push(from_claim(
                claim,
                format!(
                    "pod claim {:?}: ResourceClaim {namespace}/{claim_name}",
                    pod_claim.name
                ),
            ));
        } else if let Some(template_name) = &pod_claim.resource_claim_template_name {
            let generated = status
                .resource_claim_statuses
                .iter()
                .flatten()
                .find(|s| s.name == pod_claim.name)
                .and_then(|s| s.resource_claim_name.clone());
            if let Some(claim) = generated.as_deref().and_then(|g| inv.claim(namespace, g)) {
                subjects.push(from_claim(
                    claim,
                    format!(
                        "pod claim {:?}: ResourceClaim {namespace}/{} (from template {template_name})",
                        pod_claim.name,
                        generated.as_deref().unwrap_or_default()
                    ),
                ));
                continue;
            }
            let template = inv.template(namespace, template_name).ok_or_else(|| {
                SubjectError::TemplateNotFound {
                    pod: pod_key.clone(),
                    template: template_name.clone(),
                }
            })?;
            subjects.push(Subject {
                label: format!(
                    "pod claim {:?}: the claim template {namespace}/{template_name} would create (not created yet)",
                    pod_claim.name
                ),
                key: None,
                spec: template.spec.spec.clone(),
                allocation: None,
                reserved_for: vec![],
            });
        }
    }
    if let Some(s) = extended_resources(inv, namespace, &pod_key, &spec, &status) {
        subjects.push(s);
    }
    Ok((subjects, scope))
}

/// Nodes whose labels match a pod's nodeSelector. Without Node objects in the
/// input, only `kubernetes.io/hostname` can be resolved (to that node name).
fn allowed_nodes(
    inv: &Inventory,
    selector: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    if inv.nodes.is_empty() {
        return selector
            .get("kubernetes.io/hostname")
            .filter(|_| selector.len() == 1)
            .map(|h| vec![h.clone()])
            .unwrap_or_default();
    }
    inv.nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.clone().unwrap_or_default();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// Whether the pod's node serves `resource` itself: the scheduler gives an
/// extended resource through DRA only on nodes whose `status.allocatable`
/// lacks it or lists 0; a non-zero quantity is a device plugin's, and the
/// pod bound there got it from the node, not from a claim.
fn served_by_node(inv: &Inventory, node: Option<&str>, resource: &str) -> bool {
    let Some(node) = node else { return false };
    inv.nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(|n| {
            n.status
                .as_ref()?
                .allocatable
                .as_ref()?
                .get(resource)
                .cloned()
        })
        // A quantity with a suffix (`1k`) is not 0 either.
        .is_some_and(|q| q.0.trim().parse::<f64>().map_or(true, |v| v > 0.0))
}

/// Extended resources (`resources.requests`) that a DeviceClass serves,
/// either by `extendedResourceName` or the implicit
/// `deviceclass.resource.kubernetes.io/<class>`.
fn extended_resources(
    inv: &Inventory,
    namespace: &str,
    pod_key: &str,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> Option<Subject> {
    if let Some(name) = status
        .extended_resource_claim_status
        .as_ref()
        .map(|s| s.resource_claim_name.clone())
        && let Some(claim) = inv.claim(namespace, &name)
    {
        return Some(from_claim(
            claim,
            format!("extended resources of pod {pod_key}: ResourceClaim {namespace}/{name}"),
        ));
    }
    let mut requests = Vec::new();
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for (ci, container) in containers.enumerate() {
        let Some(wanted) = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref().or(r.limits.as_ref()))
        else {
            continue;
        };
        for (ri, (resource, quantity)) in wanted.iter().enumerate() {
            let class = inv.classes.iter().find(|c| {
                let name = c.metadata.name.as_deref().unwrap_or_default();
                c.spec.extended_resource_name.as_deref() == Some(resource.as_str())
                    || resource.strip_prefix("deviceclass.resource.kubernetes.io/") == Some(name)
            });
            let Some(class) = class else { continue };
            if served_by_node(inv, spec.node_name.as_deref(), resource) {
                continue;
            }
            let count = quantity.0.parse::<i64>().unwrap_or(1);
            requests.push(DeviceRequest {
                name: format!("container-{ci}-request-{ri}"),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: class.metadata.name.clone().unwrap_or_default(),
                    count: Some(count),
                    allocation_mode: Some("ExactCount".to_string()),
                    ..Default::default()
                }),
                first_available: None,
            });
        }
    }
    if requests.is_empty() {
        return None;
    }
    Some(Subject {
        label: format!(
            "extended resources of pod {pod_key} (DRA-served; the scheduler makes this claim)"
        ),
        key: None,
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        },
        allocation: None,
        reserved_for: vec![],
    })
}
