//! Reading Kubernetes manifests (rendered charts, `examples/`) and checking
//! that they are what the API server will accept field for field.
//!
//! Each object is deserialized into its k8s-openapi type and serialized back;
//! every field of the original must survive the round trip unchanged. The
//! k8s-openapi types ignore unknown fields, so this is what catches a
//! misspelt or misplaced field (`deviceClass` for `deviceClassName`, a field
//! of v1beta1 in a v1 object) that would otherwise be dropped silently.
//! Limits: it checks structure and types, not server-side validation rules
//! (CEL compilation, name formats); that is the API server's job in the e2e.

use anyhow::{Context, Result, bail};
use k8s_openapi::api;
use serde_json::Value;

mod lws;
mod workloads;

/// Parses a multi-document YAML stream into JSON values, dropping empty
/// documents (Helm emits them for templates that render nothing).
pub fn parse(yaml: &str) -> Result<Vec<Value>> {
    let docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple(yaml).map_err(|e| anyhow::anyhow!("invalid YAML: {e}"))?;
    Ok(docs
        .into_iter()
        .flatten()
        .filter(|v| !v.is_null())
        .collect())
}

/// `kind/name` of an object, for messages.
pub fn id(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(obj: &Value) -> Result<Value> {
    let typed: T = serde_json::from_value(obj.clone())
        .with_context(|| format!("{} does not match its API type", id(obj)))?;
    Ok(serde_json::to_value(typed)?)
}

/// Checks that `obj` is a known Kubernetes type and that none of its fields
/// is unknown to that type. Custom resources we ship (ServiceMonitor) are
/// accepted by kind only; a LeaderWorkerSet (an example's) is checked
/// field by field, its pod templates as pods (`lws.rs`).
pub fn check_typed(obj: &Value) -> Result<()> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    // Newer than our k8s-openapi types: checked by hand (`workloads.rs`).
    if (api_version, kind) == ("v1", "Pod")
        && let Some(rest) = workloads::without_scheduling_group(obj).with_context(|| id(obj))?
    {
        return check_typed(&rest);
    }
    if (api_version, kind) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") {
        roundtrip::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(&obj["metadata"])?;
        return lws::check_leader_worker_set(obj, |t| {
            let mut pod = t.clone();
            pod["apiVersion"] = "v1".into();
            pod["kind"] = "Pod".into();
            check_typed(&pod)
        })
        .with_context(|| id(obj));
    }
    if (api_version, kind) == ("scheduling.k8s.io/v1beta1", "PodGroup") {
        roundtrip::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(&obj["metadata"])?;
        return workloads::check_pod_group(obj).with_context(|| id(obj));
    }
    let back = match (api_version, kind) {
        ("v1", "ServiceAccount") => roundtrip::<api::core::v1::ServiceAccount>(obj)?,
        ("v1", "Service") => roundtrip::<api::core::v1::Service>(obj)?,
        ("v1", "Pod") => roundtrip::<api::core::v1::Pod>(obj)?,
        ("v1", "Namespace") => roundtrip::<api::core::v1::Namespace>(obj)?,
        ("apps/v1", "DaemonSet") => roundtrip::<api::apps::v1::DaemonSet>(obj)?,
        ("apps/v1", "Deployment") => roundtrip::<api::apps::v1::Deployment>(obj)?,
        ("batch/v1", "Job") => roundtrip::<api::batch::v1::Job>(obj)?,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            roundtrip::<api::rbac::v1::ClusterRole>(obj)?
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            roundtrip::<api::rbac::v1::ClusterRoleBinding>(obj)?
        }
        ("rbac.authorization.k8s.io/v1", "Role") => roundtrip::<api::rbac::v1::Role>(obj)?,
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            roundtrip::<api::rbac::v1::RoleBinding>(obj)?
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            roundtrip::<api::admissionregistration::v1::ValidatingAdmissionPolicy>(obj)?
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            roundtrip::<api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>(obj)?
        }
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            roundtrip::<api::networking::v1::NetworkPolicy>(obj)?
        }
        ("resource.k8s.io/v1", "DeviceClass") => roundtrip::<api::resource::v1::DeviceClass>(obj)?,
        ("resource.k8s.io/v1", "ResourceClaim") => {
            roundtrip::<api::resource::v1::ResourceClaim>(obj)?
        }
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            roundtrip::<api::resource::v1::ResourceClaimTemplate>(obj)?
        }
        ("monitoring.coreos.com/v1", "ServiceMonitor") => return Ok(()),
        _ => bail!(
            "{}: unexpected apiVersion/kind {api_version}/{kind}",
            id(obj)
        ),
    };
    let mut lost = Vec::new();
    lost_fields(obj, &back, String::new(), &mut lost);
    if !lost.is_empty() {
        bail!(
            "{}: fields unknown to {api_version} {kind} (misspelt or misplaced?): {}",
            id(obj),
            lost.join(", ")
        );
    }
    Ok(())
}

/// Paths of `orig` that are absent or different in `back`.
fn lost_fields(orig: &Value, back: &Value, path: String, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(bv) => lost_fields(v, bv, p, out),
                    None if v.is_null() => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                lost_fields(x, y, format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path} ({a} became {b})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_empty_documents() {
        let objs = parse("---\n# Source: x\n---\nkind: A\n---\n\n---\nkind: B\n").unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[1]["kind"], "B");
    }

    #[test]
    fn check_typed_accepts_a_correct_claim_and_names_a_misspelt_field() {
        let good = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": "efa.networking.k8s.aws", "count": 2}}]}}
        });
        check_typed(&good).unwrap();
        let mut bad = good.clone();
        bad["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "x".into();
        let err = check_typed(&bad).unwrap_err().to_string();
        assert!(
            err.contains(".spec.devices.requests[0].exactly.deviceClass"),
            "{err}"
        );
        // v1beta1 shape (no `exactly`) in a v1 object.
        let mut beta = good.clone();
        beta["spec"]["devices"]["requests"][0] = serde_json::json!({
            "name": "r", "deviceClassName": "efa.networking.k8s.aws"});
        assert!(check_typed(&beta).is_err());
    }

    #[test]
    fn check_typed_rejects_unknown_kinds() {
        let obj = serde_json::json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "metadata": {"name": "c"}});
        assert!(check_typed(&obj).is_err());
    }
}
