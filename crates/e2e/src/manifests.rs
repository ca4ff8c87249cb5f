//! Kubernetes manifests as the suite uses them: YAML streams (rendered
//! charts, `examples/`) parsed into JSON objects and applied server-side.
//!
//! Server-side apply sends each object as the user wrote it, so the API
//! server validates every field (CEL compiles, names, enums) exactly as
//! `kubectl apply --server-side` would. The resource behind each `kind` is
//! looked up through discovery, so any built-in type works.

use std::path::Path;

use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use kube::{Api, Client};
use serde_json::Value;

use local_cluster::error::{Error, Result, io};

/// The test GPU driver's DeviceClass, ServiceAccount and RBAC.
pub const GPU_TEST_MANIFEST: &str = include_str!("../manifests/gpu-test-driver.yaml");

/// Field manager of everything the suite applies.
pub const FIELD_MANAGER: &str = "aws-dra-e2e";

/// Parses a multi-document YAML stream, dropping empty documents (Helm
/// emits them for templates that render nothing).
pub fn parse(what: &str, yaml: &str) -> Result<Vec<Value>> {
    let docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple(yaml).map_err(|e| Error::Manifest {
            what: what.to_string(),
            message: format!("invalid YAML: {e}"),
        })?;
    Ok(docs
        .into_iter()
        .flatten()
        .filter(|v| v.is_object())
        .collect())
}

/// Reads and parses one manifest file.
pub fn read(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    parse(&path.display().to_string(), &text)
}

/// `Kind/name` of an object, for messages.
pub fn id(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn gvk(obj: &Value) -> Result<GroupVersionKind> {
    let bad = |message: &str| Error::Manifest {
        what: id(obj),
        message: message.to_string(),
    };
    let api_version = obj["apiVersion"]
        .as_str()
        .ok_or_else(|| bad("no apiVersion"))?;
    let kind = obj["kind"].as_str().ok_or_else(|| bad("no kind"))?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Ok(GroupVersionKind::gvk(group, version, kind))
}

/// The dynamic API of `obj`'s resource, namespaced to `namespace` (or the
/// object's own, or `default`) when the resource is namespaced.
async fn api_for(
    client: &Client,
    obj: &Value,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let gvk = gvk(obj)?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| Error::Kube {
            action: format!("discovering the resource of {}", id(obj)),
            source,
        })?;
    Ok(match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = namespace
                .or_else(|| obj["metadata"]["namespace"].as_str())
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    })
}

/// Server-side applies `obj` (forcing ownership of conflicting fields).
pub async fn apply(client: &Client, obj: &Value, namespace: Option<&str>) -> Result<DynamicObject> {
    apply_with(client, obj, namespace, false).await
}

/// As [`apply`] with `dryRun=All`: the API server validates and admits the
/// object (defaulting, schema, admission policies) but stores nothing.
pub async fn apply_dry_run(
    client: &Client,
    obj: &Value,
    namespace: Option<&str>,
) -> Result<DynamicObject> {
    apply_with(client, obj, namespace, true).await
}

async fn apply_with(
    client: &Client,
    obj: &Value,
    namespace: Option<&str>,
    dry_run: bool,
) -> Result<DynamicObject> {
    let api = api_for(client, obj, namespace).await?;
    let name = obj["metadata"]["name"]
        .as_str()
        .ok_or_else(|| Error::Manifest {
            what: id(obj),
            message: "no metadata.name".into(),
        })?;
    let mut obj = obj.clone();
    if let Some(ns) = namespace
        && let Some(meta) = obj["metadata"].as_object_mut()
        && meta.contains_key("namespace")
    {
        meta.insert("namespace".into(), Value::String(ns.to_string()));
    }
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(name, &params, &Patch::Apply(&obj))
        .await
        .map_err(|source| Error::Kube {
            action: format!(
                "applying{} {}",
                if dry_run { " (dry run)" } else { "" },
                id(&obj)
            ),
            source,
        })
}

/// Deletes `obj` if it exists (foreground, so pods are gone when it returns
/// their deletion was accepted; callers wait for disappearance themselves).
pub async fn delete(client: &Client, obj: &Value, namespace: Option<&str>) -> Result<()> {
    let api = api_for(client, obj, namespace).await?;
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            action: format!("deleting {}", id(obj)),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_drops_empty_documents_and_keeps_order() {
        let yaml = "---\n# only a comment\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n---\n---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: b\n";
        let objs = parse("t", yaml).unwrap();
        let ids: Vec<String> = objs.iter().map(id).collect();
        assert_eq!(ids, ["Pod/a", "DeviceClass/b"]);
        assert!(parse("t", "a: [").is_err());
    }

    #[test]
    fn gvk_splits_core_and_grouped_versions() {
        let core = gvk(&serde_json::json!({"apiVersion": "v1", "kind": "Pod"})).unwrap();
        assert_eq!((core.group.as_str(), core.version.as_str()), ("", "v1"));
        let dra =
            gvk(&serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}))
                .unwrap();
        assert_eq!(
            (dra.group.as_str(), dra.version.as_str(), dra.kind.as_str()),
            ("resource.k8s.io", "v1", "ResourceClaim")
        );
        assert!(gvk(&serde_json::json!({"kind": "Pod"})).is_err());
    }
}
