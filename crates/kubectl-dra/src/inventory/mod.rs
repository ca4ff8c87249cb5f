//! The objects an explanation needs, from files or from the API server.
//!
//! Offline input is whatever support staff get in a bundle: `kubectl get …
//! -o yaml|json` dumps (single objects, `List`s, multi-document YAML) and
//! our drivers' `discover` output (a `List` of ResourceSlices). Objects of
//! other kinds are counted and ignored, so a whole `kubectl get all` dump
//! can be passed as is.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaint, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::Value;

/// Everything loaded, by kind.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    pub claims: Vec<ResourceClaim>,
    pub templates: Vec<ResourceClaimTemplate>,
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    /// DeviceTaintRules: taints an administrator puts on devices without
    /// touching their slices.
    pub taint_rules: Vec<TaintRule>,
    /// Objects of kinds we do not use.
    pub ignored: usize,
}

/// What the scheduler takes from a `DeviceTaintRule`: which devices
/// (driver, pool, device; an unset field matches every value) and the taint.
/// Read from any `resource.k8s.io` version (GA `v1` in 1.37, `v1beta2`,
/// `v1alpha3`): the fields used here are the same in all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintRule {
    pub name: String,
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub device: Option<String>,
    pub taint: DeviceTaint,
}

impl TaintRule {
    /// `None` when the object has no usable taint.
    pub fn from_value(value: &Value) -> Option<TaintRule> {
        let spec = value.get("spec")?;
        let field = |name: &str| {
            spec.pointer(&format!("/deviceSelector/{name}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        Some(TaintRule {
            name: value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            driver: field("driver"),
            pool: field("pool"),
            device: field("device"),
            taint: serde_json::from_value(spec.get("taint")?.clone()).ok()?,
        })
    }

    pub fn selects(&self, driver: &str, pool: &str, device: &str) -> bool {
        self.driver.as_deref().is_none_or(|d| d == driver)
            && self.pool.as_deref().is_none_or(|p| p == pool)
            && self.device.as_deref().is_none_or(|d| d == device)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not JSON or YAML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: {kind} {name:?} does not match the resource.k8s.io/v1 schema: {source}")]
    Schema {
        path: PathBuf,
        kind: String,
        name: String,
        source: serde_json::Error,
    },
    #[error(
        "{path}: {kind} {name:?} has apiVersion {api_version}; kubectl-dra reads resource.k8s.io/v1"
    )]
    Version {
        path: PathBuf,
        kind: String,
        name: String,
        api_version: String,
    },
}

impl Inventory {
    pub fn from_files(paths: &[PathBuf]) -> Result<Self, InventoryError> {
        let mut inventory = Inventory::default();
        for path in paths {
            let text = std::fs::read_to_string(path).map_err(|source| InventoryError::Read {
                path: path.clone(),
                source,
            })?;
            inventory.add_text(path, &text)?;
        }
        Ok(inventory)
    }

    /// Adds the objects of one file's text (JSON, or YAML with any number of documents).
    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<(), InventoryError> {
        let documents: Vec<Value> = match serde_json::from_str::<Value>(text) {
            Ok(v) => vec![v],
            Err(_) => {
                serde_saphyr::from_multiple::<Value>(text).map_err(|e| InventoryError::Syntax {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
            }
        };
        for document in documents {
            self.add_value(path, document)?;
        }
        Ok(())
    }

    fn add_value(&mut self, path: &Path, value: Value) -> Result<(), InventoryError> {
        if value.is_null() {
            return Ok(()); // an empty YAML document
        }
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if kind.ends_with("List")
            && let Some(Value::Array(items)) = value.get("items")
        {
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for mut item in items.clone() {
                // `kubectl get -o json` of one kind may leave kind out of the items.
                if let (Some(k), Some(obj)) = (item_kind, item.as_object_mut()) {
                    obj.entry("kind")
                        .or_insert_with(|| Value::String(k.to_string()));
                }
                self.add_value(path, item)?;
            }
            return Ok(());
        }
        let api_version = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let is_resource = matches!(
            kind.as_str(),
            "ResourceSlice" | "DeviceClass" | "ResourceClaim" | "ResourceClaimTemplate"
        );
        if is_resource && !api_version.is_empty() && api_version != "resource.k8s.io/v1" {
            return Err(InventoryError::Version {
                path: path.to_path_buf(),
                kind,
                name,
                api_version,
            });
        }
        let schema = |source| InventoryError::Schema {
            path: path.to_path_buf(),
            kind: kind.clone(),
            name: name.clone(),
            source,
        };
        match kind.as_str() {
            "ResourceSlice" => self
                .slices
                .push(serde_json::from_value(value).map_err(schema)?),
            "DeviceClass" => self
                .classes
                .push(serde_json::from_value(value).map_err(schema)?),
            "ResourceClaim" => self
                .claims
                .push(serde_json::from_value(value).map_err(schema)?),
            "ResourceClaimTemplate" => self
                .templates
                .push(serde_json::from_value(value).map_err(schema)?),
            "Pod" => self
                .pods
                .push(serde_json::from_value(value).map_err(schema)?),
            "Node" => self
                .nodes
                .push(serde_json::from_value(value).map_err(schema)?),
            "DeviceTaintRule" => match TaintRule::from_value(&value) {
                Some(rule) => self.taint_rules.push(rule),
                None => self.ignored += 1,
            },
            _ => self.ignored += 1,
        }
        Ok(())
    }

    pub fn claim(&self, namespace: &str, name: &str) -> Option<&ResourceClaim> {
        self.claims.iter().find(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    pub fn template(&self, namespace: &str, name: &str) -> Option<&ResourceClaimTemplate> {
        self.templates.iter().find(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.iter().find(|c| {
            c.metadata.name.as_deref() == Some(name)
                && c.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    pub fn class(&self, name: &str) -> Option<&DeviceClass> {
        self.classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_multi_documents_and_discover_output() {
        let mut inv = Inventory::default();
        let discover = include_str!("../tests/fixtures/trn1-neuron.yaml");
        inv.add_text(Path::new("trn1-neuron.yaml"), discover)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.slices.len(), 1);
        assert_eq!(inv.slices[0].spec.devices.as_ref().map(Vec::len), Some(16));

        let multi = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: a}\nspec: {}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
        inv.add_text(Path::new("multi.yaml"), multi)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.classes.len(), 1);
        assert_eq!(inv.ignored, 1);

        let json_list = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimList","items":[{"metadata":{"name":"x","namespace":"ns"},"spec":{}}]}"#;
        inv.add_text(Path::new("l.json"), json_list)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(inv.claim("ns", "x").is_some());
    }

    #[test]
    fn rejects_other_api_versions_and_bad_schema_by_name() {
        let mut inv = Inventory::default();
        let beta = "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata: {name: old}\nspec: {}\n";
        let err = inv
            .add_text(Path::new("b.yaml"), beta)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("old") && e.contains("v1beta1")));
        let bad = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: bad}\nspec: {devices: {requests: 3}}\n";
        let err = inv
            .add_text(Path::new("c.yaml"), bad)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("\"bad\"")));
    }

    #[test]
    fn reads_device_taint_rules_of_any_version() {
        let mut inv = Inventory::default();
        let rule = "apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\nmetadata: {name: maint}\nspec:\n  deviceSelector: {driver: efa.networking.k8s.aws, pool: p5, device: efa-0}\n  taint: {key: example.com/maintenance, value: x, effect: NoSchedule}\n---\napiVersion: resource.k8s.io/v1alpha3\nkind: DeviceTaintRule\nmetadata: {name: all-efa}\nspec:\n  deviceSelector: {driver: efa.networking.k8s.aws}\n  taint: {key: k, effect: NoExecute}\n";
        inv.add_text(Path::new("r.yaml"), rule)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inv.taint_rules.len(), 2);
        let maint = &inv.taint_rules[0];
        assert_eq!(maint.name, "maint");
        assert_eq!(maint.taint.key, "example.com/maintenance");
        assert!(maint.selects("efa.networking.k8s.aws", "p5", "efa-0"));
        assert!(!maint.selects("efa.networking.k8s.aws", "p5", "efa-1"));
        assert!(!maint.selects("efa.networking.k8s.aws", "trn2", "efa-0"));
        assert!(inv.taint_rules[1].selects("efa.networking.k8s.aws", "trn2", "efa-9"));
        assert!(!inv.taint_rules[1].selects("neuron.aws.com", "trn2", "efa-9"));
    }
}
