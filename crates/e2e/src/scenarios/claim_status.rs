//! Scenario 29: claim device status. A ResourceClaim (not from a template)
//! with one Neuron chip and the EFA of its `devicegroup1_id` on trn2: while
//! its pod runs, each driver has written one `status.devices` entry per
//! device it prepared, `Ready=True` with the data the drivers document
//! (`docs/attributes.md`, "Claim device status"), as its own field manager;
//! once the pod is gone the entries are gone while the claim stays.

use std::time::Duration;

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::{Value, json};

use super::allocate::{GONE, RUNNING};
use super::kit;
use crate::testbed::{DriverKind, Testbed};

const NODE: &str = "trn2";
const CLAIM: &str = "chip-and-efa";
const POD: &str = "status-probe";
/// Status is written after prepare answers, with retries a second apart.
const STATUS_WAIT: Duration = Duration::from_secs(30);

/// Scenario 29.
pub async fn claim_device_status(tb: &impl Testbed, ns: &str) -> Result<()> {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": CLAIM},
        "spec": {"devices": {
            "requests": [
                {"name": "chip", "exactly": {"deviceClassName": DriverKind::Neuron.driver_name()}},
                {"name": "efa", "exactly": {"deviceClassName": DriverKind::Efa.driver_name()}},
            ],
            "constraints": [{"requests": ["chip", "efa"],
                "matchAttribute": "resource.aws.com/devicegroup1_id"}],
        }},
    });
    let pod = kit::pod_with_claim(tb, POD, None, Some(CLAIM), Some(NODE));
    kit::apply_all(tb, ns, &[claim, pod]).await?;
    kit::running(tb, ns, POD, RUNNING).await?;
    let api: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let object = kit::wait_for(tb, "a Ready entry per device", STATUS_WAIT, || async {
        let c = api.get(CLAIM).await?;
        let entries = entries(&c)?;
        let ready: Vec<(&str, &str, &str)> = entries
            .iter()
            .filter(|e| condition(e) == ("True", "Prepared"))
            .map(|e| (str_of(e, "driver"), str_of(e, "pool"), str_of(e, "device")))
            .collect();
        // Named in the timeout's message: which driver did not write.
        let missing: Vec<String> = kit::allocation(&c)
            .iter()
            .filter(|a| !ready.contains(&(a.driver.as_str(), a.pool.as_str(), a.device.as_str())))
            .map(|a| format!("{} {}/{}", a.driver, a.pool, a.device))
            .collect();
        if missing.is_empty() {
            Ok(Some(c))
        } else {
            Err(anyhow!(
                "no Ready entry yet for {missing:?}; entries: {entries:?}"
            ))
        }
    })
    .await?;
    let allocated = kit::allocation(&object);
    ensure!(allocated.len() == 2, "allocated {allocated:?}");
    for e in entries(&object)? {
        let (driver, device) = (str_of(&e, "driver"), str_of(&e, "device"));
        let a = allocated
            .iter()
            .find(|a| a.driver == driver && a.pool == str_of(&e, "pool") && a.device == device)
            .ok_or_else(|| anyhow!("entry {e} names no allocated device: {allocated:?}"))?;
        let data = &e["data"];
        if a.driver == DriverKind::Neuron.driver_name() {
            let chip = kit::neuron_index(device).ok_or_else(|| anyhow!("chip of {device}"))?;
            ensure!(
                data["chip"] == json!(chip)
                    && data["deviceNode"] == json!(format!("/dev/neuron{chip}"))
                    && data["logicalNeuronCore"].is_u64()
                    && data["visibleCores"].is_string()
                    && data["cores"].as_array().is_some_and(|c| !c.is_empty()),
                "{device}: data {data}"
            );
        } else {
            let bdf = kit::efa_bdf(device).ok_or_else(|| anyhow!("bdf of {device}"))?;
            ensure!(
                data["pciBusID"] == json!(bdf)
                    && data["rdmaDevice"].as_str().is_some_and(|r| !r.is_empty())
                    && data["uverbsDevice"]
                        .as_str()
                        .is_some_and(|u| u.starts_with("/dev/infiniband/uverbs"))
                    && data["portState"] == json!("ACTIVE"),
                "{device}: data {data}"
            );
        }
    }
    // Each driver applies its own entries as its own field manager.
    let managers: Vec<String> = object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager.clone())
        .collect();
    for kind in [DriverKind::Neuron, DriverKind::Efa] {
        ensure!(
            managers.iter().any(|m| m == kind.driver_name()),
            "no status field manager {}: {managers:?}",
            kind.driver_name()
        );
    }

    kit::delete_pods(tb, ns, &[POD], GONE).await?;
    kit::wait_for(tb, "the entries cleared", STATUS_WAIT, || async {
        let c = api
            .get_opt(CLAIM)
            .await?
            .ok_or_else(|| anyhow!("claim gone"))?;
        Ok(entries(&c)?.is_empty().then_some(()))
    })
    .await?;
    api.delete(CLAIM, &Default::default()).await?;
    Ok(())
}

fn entries(c: &ResourceClaim) -> Result<Vec<Value>> {
    let devices = c.status.as_ref().and_then(|s| s.devices.clone());
    Ok(serde_json::from_value(serde_json::to_value(
        devices.unwrap_or_default(),
    )?)?)
}

fn condition(e: &Value) -> (&str, &str) {
    let ready = e["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    ready.map_or(("", ""), |c| {
        (
            c["status"].as_str().unwrap_or(""),
            c["reason"].as_str().unwrap_or(""),
        )
    })
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}
