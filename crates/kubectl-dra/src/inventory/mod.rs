//! The objects an explanation needs, from files or from the API server.
//!
//! Offline input is whatever support staff get in a bundle: `kubectl get …
//! -o yaml|json` dumps (single objects, `List`s, multi-document YAML) and
//! our drivers' `discover` output (a `List` of ResourceSlices). Objects of
//! other kinds are counted and ignored, so a whole `kubectl get all` dump
//! can be passed as is.
//!
//! ResourceSlices are kept in the compact form of [`crate::slices`], and a
//! JSON file is read object by object (`document`): a 1,000-node dump is
//! ~77 MB of JSON, and holding it as one `serde_json::Value` tree (then a
//! copy of its items, then the typed objects) took 3.4 GiB.

mod document;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaint, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::Value;

use crate::slices::{Interner, Slice};

/// Everything loaded, by kind.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    pub slices: Vec<Slice>,
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
    /// The strings the slices share (each stored once).
    pub strings: Interner,
}

/// How many objects of each kind an inventory held at some point, to undo
/// what a failed read added.
#[derive(Debug, Clone, Copy)]
struct Mark {
    slices: usize,
    classes: usize,
    claims: usize,
    templates: usize,
    pods: usize,
    nodes: usize,
    taint_rules: usize,
    ignored: usize,
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
        let mark = self.mark();
        match document::add_json(self, path, text) {
            document::Read::Json(result) => return result,
            document::Read::Again => {
                self.rewind(mark);
                if let Ok(value) = serde_json::from_str::<Value>(text) {
                    return self.add_value(path, value);
                }
            }
            // Not JSON: what was read of it is dropped, and it is read as YAML.
            document::Read::NotJson => self.rewind(mark),
        }
        let documents: Vec<Value> =
            serde_saphyr::from_multiple::<Value>(text).map_err(|e| InventoryError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        for document in documents {
            self.add_value(path, document)?;
        }
        Ok(())
    }

    /// Adds a ResourceSlice read from the API server.
    pub fn add_slice(&mut self, slice: &ResourceSlice) {
        self.slices.push(Slice::from_api(slice, &mut self.strings));
    }

    fn mark(&self) -> Mark {
        Mark {
            slices: self.slices.len(),
            classes: self.classes.len(),
            claims: self.claims.len(),
            templates: self.templates.len(),
            pods: self.pods.len(),
            nodes: self.nodes.len(),
            taint_rules: self.taint_rules.len(),
            ignored: self.ignored,
        }
    }

    fn rewind(&mut self, mark: Mark) {
        self.slices.truncate(mark.slices);
        self.classes.truncate(mark.classes);
        self.claims.truncate(mark.claims);
        self.templates.truncate(mark.templates);
        self.pods.truncate(mark.pods);
        self.nodes.truncate(mark.nodes);
        self.taint_rules.truncate(mark.taint_rules);
        self.ignored = mark.ignored;
    }

    fn add_value(&mut self, path: &Path, mut value: Value) -> Result<(), InventoryError> {
        if value.is_null() {
            return Ok(()); // an empty YAML document
        }
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if kind.ends_with("List")
            && let Some(Value::Array(items)) = value.get_mut("items")
        {
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for mut item in std::mem::take(items) {
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
            "ResourceSlice" => {
                let slice: ResourceSlice = serde_json::from_value(value).map_err(schema)?;
                self.add_slice(&slice);
            }
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

    /// Whether every pool has all the slices of its newest generation that
    /// it says it has.
    pub fn pools_complete(&self) -> bool {
        let mut pools: HashMap<(&str, &str), (i64, i64, i64)> = HashMap::new();
        for slice in &self.slices {
            let entry = pools
                .entry((&slice.driver, &slice.pool))
                .or_insert((i64::MIN, 0, 0));
            if slice.generation > entry.0 {
                *entry = (slice.generation, slice.resource_slice_count, 1);
            } else if slice.generation == entry.0 {
                entry.2 += 1;
            }
        }
        pools.values().all(|(_, want, have)| want <= have)
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
mod tests;
