//! A claim's `status.devices` entries of one driver, and the apply body
//! that carries them: pure, so that what is written is tested without an
//! API server.
//!
//! What the API server would refuse is left out here rather than failing
//! the whole apply: `data` over 10 KiB, a `networkData` with an interface
//! name over 256 or a hardware address over 128 characters, a condition
//! message over 32 KiB (cut).

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::prepare::driver::ClaimRef;
use crate::prepare::driver::{DeviceStatus, NetworkData};

/// The API's limit on an entry's `data`, as JSON.
pub(crate) const MAX_DATA_BYTES: usize = 10 * 1024;
/// The API's limits on `networkData`.
pub(crate) const MAX_INTERFACE_NAME: usize = 256;
pub(crate) const MAX_HARDWARE_ADDRESS: usize = 128;
/// The API's limit on a condition's message.
pub(crate) const MAX_MESSAGE: usize = 32 * 1024;

/// The condition type every entry carries.
pub(crate) const READY: &str = "Ready";
/// Its reasons.
pub(crate) const REASON_PREPARED: &str = "Prepared";
pub(crate) const REASON_UNHEALTHY: &str = "Unhealthy";

/// One prepared device (or share of one) of a claim, as its entry says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Slot {
    pub(crate) pool: String,
    pub(crate) device: String,
    pub(crate) share_id: Option<String>,
    /// The driver's `data`/`networkData`, when it gave any.
    pub(crate) report: Option<DeviceStatus>,
    pub(crate) healthy: bool,
    /// What failed, when unhealthy.
    pub(crate) health_message: String,
    /// When `healthy` last changed (or the entry was first written).
    pub(crate) since: Timestamp,
}

/// The entry of one slot.
pub(crate) fn entry(driver: &str, generation: Option<i64>, slot: &Slot) -> AllocatedDeviceStatus {
    let (status, reason, message) = if slot.healthy {
        (
            "True",
            REASON_PREPARED,
            "prepared; the device is healthy".to_owned(),
        )
    } else {
        let what: String = slot.health_message.chars().take(MAX_MESSAGE - 64).collect();
        (
            "False",
            REASON_UNHEALTHY,
            format!("the device is unhealthy: {what}"),
        )
    };
    let condition = Condition {
        type_: READY.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: Time(slot.since),
        observed_generation: generation,
    };
    let report = slot.report.as_ref();
    AllocatedDeviceStatus {
        driver: driver.to_owned(),
        pool: slot.pool.clone(),
        device: slot.device.clone(),
        share_id: slot.share_id.clone(),
        conditions: Some(vec![condition]),
        data: report.and_then(|r| data(&slot.device, &r.data)),
        network_data: report
            .and_then(|r| r.network.as_ref())
            .and_then(|n| network(&slot.device, n)),
    }
}

fn data(device: &str, data: &serde_json::Map<String, Value>) -> Option<RawExtension> {
    if data.is_empty() {
        return None;
    }
    let value = Value::Object(data.clone());
    let size = value.to_string().len();
    if size > MAX_DATA_BYTES {
        tracing::warn!(
            device,
            bytes = size,
            limit = MAX_DATA_BYTES,
            "device status data over the API's limit; left out"
        );
        return None;
    }
    Some(RawExtension(value))
}

fn network(device: &str, n: &NetworkData) -> Option<NetworkDeviceData> {
    if n.interface_name.len() > MAX_INTERFACE_NAME
        || n.hardware_address.len() > MAX_HARDWARE_ADDRESS
    {
        tracing::warn!(device, ?n, "networkData over the API's limits; left out");
        return None;
    }
    let some = |s: &String| (!s.is_empty()).then(|| s.clone());
    Some(NetworkDeviceData {
        interface_name: some(&n.interface_name),
        hardware_address: some(&n.hardware_address),
        ips: (!n.ips.is_empty()).then(|| n.ips.clone()),
    })
}

/// The apply body for a claim: our entries; none clears them (the field
/// manager then owns nothing in `status.devices`). It names the claim's UID,
/// so that the API server refuses it for another claim of the same name
/// (see [`crate::prepare::status::api`]).
pub(crate) fn apply_body(
    driver: &str,
    claim: &ClaimRef,
    generation: Option<i64>,
    slots: &[Slot],
) -> Value {
    let mut body = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
    });
    if !slots.is_empty() {
        let devices: Vec<AllocatedDeviceStatus> =
            slots.iter().map(|s| entry(driver, generation, s)).collect();
        body["status"] = json!({ "devices": devices });
    }
    body
}
