//! What the drivers wrote about an allocated claim's devices
//! (`status.devices`, KEP-4817): per entry its device, the `Ready`
//! condition, and the keys of `data` and `networkData` with short values,
//! so that one look says whether each driver prepared its devices and what
//! it reports, without the claim's YAML.

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use serde::Serialize;
use serde_json::Value;

use crate::world::World;

/// A value longer than this is cut in the text (JSON output keeps it all).
const VALUE_CHARS: usize = 40;

/// One `status.devices` entry, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatusEntry {
    pub driver: String,
    pub pool: String,
    pub device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The `Ready` condition: `True`, `False`, `Unknown`; `None` when the
    /// entry has no such condition.
    pub ready: Option<String>,
    pub reason: String,
    pub message: String,
    /// `data` as the driver wrote it (an object, usually).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub data: Value,
    /// `networkData`: interface name, hardware address, IPs.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub network: Value,
}

/// The entries of the claim `key` (`namespace/name`), in the claim's order.
pub fn of_claim(world: &World, key: Option<&str>) -> Vec<DeviceStatusEntry> {
    let Some((namespace, name)) = key.and_then(|k| k.split_once('/')) else {
        return Vec::new();
    };
    let Some(claim) = world.inventory.claim(namespace, name) else {
        return Vec::new();
    };
    let devices = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    devices.into_iter().flatten().map(entry).collect()
}

fn entry(d: &AllocatedDeviceStatus) -> DeviceStatusEntry {
    let ready = d.conditions.iter().flatten().find(|c| c.type_ == "Ready");
    DeviceStatusEntry {
        driver: d.driver.clone(),
        pool: d.pool.clone(),
        device: d.device.clone(),
        share_id: d.share_id.clone(),
        ready: ready.map(|c| c.status.clone()),
        reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        message: ready.map(|c| c.message.clone()).unwrap_or_default(),
        data: d.data.as_ref().map_or(Value::Null, |r| r.0.clone()),
        network: d
            .network_data
            .as_ref()
            .and_then(|n| serde_json::to_value(n).ok())
            .unwrap_or(Value::Null),
    }
}

/// The text lines of the entries (indented by the caller).
pub fn lines(entries: &[DeviceStatusEntry]) -> Vec<String> {
    let mut out = Vec::new();
    for e in entries {
        let share = e
            .share_id
            .as_deref()
            .map(|s| format!(" share {s}"))
            .unwrap_or_default();
        let ready = match &e.ready {
            Some(status) if e.message.is_empty() => format!("Ready={status} ({})", e.reason),
            Some(status) => format!("Ready={status} ({}: {})", e.reason, e.message),
            None => "no Ready condition".to_owned(),
        };
        out.push(format!(
            "{} {}/{}{share}: {ready}",
            e.driver, e.pool, e.device
        ));
        if let Some(data) = compact(&e.data) {
            out.push(format!("  data: {data}"));
        }
        if let Some(network) = compact(&e.network) {
            out.push(format!("  networkData: {network}"));
        }
    }
    out
}

/// `key=value, ...` of an object (values as compact JSON, strings bare,
/// long ones cut); anything else as compact JSON; `None` when empty.
fn compact(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::Object(map) if map.is_empty() => None,
        Value::Object(map) => Some(
            map.iter()
                .map(|(k, v)| format!("{k}={}", short(v)))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        other => Some(short(other)),
    }
}

fn short(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() <= VALUE_CHARS {
        return text;
    }
    let cut: String = text.chars().take(VALUE_CHARS - 1).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests;
