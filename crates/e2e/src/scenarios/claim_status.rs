//! Scenario 29: claim device status. A ResourceClaim (not from a template)
//! with one Neuron chip and the EFA of its `devicegroup1_id` on trn2: while
//! its pod runs, each driver has written one `status.devices` entry per
//! device it prepared, `Ready=True` with the data the drivers document
//! (`docs/attributes.md`, "Claim device status"), as its own field manager;
//! the EFA driver's credentials cannot rewrite the Neuron driver's entry
//! (the chart's RBAC and admission policy); the claim and its pod deleted
//! and recreated at once under the same names on the same node: the new
//! claim has exactly its own entries, and keeps them (every status apply
//! is guarded by the claim's UID, writes are ordered per claim name); once
//! the pod is gone the entries are gone while the claim stays.

use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::allocate::{GONE, RUNNING};
use super::kit;
use crate::testbed::{DriverKind, Testbed};

const NODE: &str = "trn2";
const CLAIM: &str = "chip-and-efa";
const POD: &str = "status-probe";
/// Status is written after prepare answers, with retries a second apart.
const STATUS_WAIT: Duration = Duration::from_secs(30);
/// How long the recreated claim's entries are watched for a late write of
/// the old claim (a status write's first four retries come within 15 s).
const LATE_WRITES: Duration = Duration::from_secs(16);

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
    kit::apply_all(tb, ns, &[claim.clone(), pod.clone()]).await?;
    kit::running(tb, ns, POD, RUNNING).await?;
    let api: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let object = ready_entries(tb, &api).await?;
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

    forged_entry_refused(tb, ns, &allocated).await?;
    recreated_keeps_its_own_entries(tb, ns, &[claim, pod]).await?;

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

/// Waits until the claim has a `Ready=True` entry for every device of its
/// allocation, and returns it.
async fn ready_entries(tb: &impl Testbed, api: &Api<ResourceClaim>) -> Result<ResourceClaim> {
    kit::wait_for(tb, "a Ready entry per device", STATUS_WAIT, || async {
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
    .await
}

/// The claim and its pod deleted at once, and recreated under the same
/// names on the same node as soon as the claim is gone: the old claim's
/// clear (at its unprepare) races the new claim's prepare. The new claim
/// (another UID) ends with exactly one `Ready` entry per device of its own
/// allocation, and still has exactly those after [`LATE_WRITES`].
async fn recreated_keeps_its_own_entries(
    tb: &impl Testbed,
    ns: &str,
    objects: &[Value],
) -> Result<()> {
    let api: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    let old_uid = api.get(CLAIM).await?.metadata.uid;
    pods.delete(POD, &DeleteParams::default()).await?;
    api.delete(CLAIM, &DeleteParams::default()).await?;
    kit::wait_for(tb, "the old claim and its pod gone", GONE, || async {
        let gone = pods.get_opt(POD).await?.is_none() && api.get_opt(CLAIM).await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    kit::apply_all(tb, ns, objects).await?;
    kit::running(tb, ns, POD, RUNNING).await?;
    let object = ready_entries(tb, &api).await?;
    ensure!(
        object.metadata.uid != old_uid,
        "the claim was not recreated: UID {old_uid:?}"
    );
    let own = |c: &ResourceClaim| -> Result<()> {
        let mut want: Vec<(String, String, String)> = kit::allocation(c)
            .into_iter()
            .map(|a| (a.driver, a.pool, a.device))
            .collect();
        want.sort();
        let entries = entries(c)?;
        let mut have: Vec<(String, String, String)> = entries
            .iter()
            .filter(|e| condition(e) == ("True", "Prepared"))
            .map(|e| {
                let s = |k: &str| str_of(e, k).to_owned();
                (s("driver"), s("pool"), s("device"))
            })
            .collect();
        have.sort();
        ensure!(
            have == want && entries.len() == want.len(),
            "the recreated claim's entries are not exactly its own Ready ones: allocated {want:?}, entries {entries:?}"
        );
        Ok(())
    };
    own(&object)?;
    tokio::time::sleep(LATE_WRITES).await;
    own(&api.get(CLAIM).await?)
}

/// The chart's RBAC and admission policy against the real API server: the
/// EFA driver's own credentials on the node may not rewrite the Neuron
/// driver's entry of the same claim (before 1.36 the policy refuses it,
/// since then the API server's per-driver check against the chart's RBAC
/// does first); the entry stays as its driver wrote it.
async fn forged_entry_refused(
    tb: &impl Testbed,
    ns: &str,
    allocated: &[kit::Allocated],
) -> Result<()> {
    let neuron = DriverKind::Neuron.driver_name();
    let chip = allocated
        .iter()
        .find(|a| a.driver == neuron)
        .ok_or_else(|| anyhow!("no Neuron device in {allocated:?}"))?;
    let as_efa =
        crate::client_from_kubeconfig(&tb.driver_kubeconfig(NODE, DriverKind::Efa)?).await?;
    let forged = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": ns},
        "status": {"devices": [{
            "driver": neuron, "pool": chip.pool, "device": chip.device,
            "conditions": [{"type": "Ready", "status": "False", "reason": "Forged",
                "message": "written with the EFA driver's credentials",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }]},
    });
    let params = PatchParams::apply("e2e-forged").force();
    let answer = Api::<ResourceClaim>::namespaced(as_efa, ns)
        .patch_status(CLAIM, &params, &Patch::Apply(&forged))
        .await;
    match answer {
        // Refused by the chart's admission policy (its message), or since
        // 1.36 first by the API server's per-driver check against the
        // chart's RBAC (a forbidden field: no resourceclaims/driver grant
        // for the Neuron driver's name).
        Err(kube::Error::Api(status))
            if matches!(status.code, 403 | 422)
                && (status
                    .message
                    .contains("may only write the status.devices entries")
                    || status.message.contains("resourceclaims/driver")) => {}
        other => bail!("the EFA driver wrote the Neuron driver's entry: {other:?}"),
    }
    let c = Api::<ResourceClaim>::namespaced(tb.client(), ns)
        .get(CLAIM)
        .await?;
    let entries = entries(&c)?;
    let kept = entries
        .iter()
        .find(|e| str_of(e, "driver") == neuron && str_of(e, "device") == chip.device);
    ensure!(
        kept.is_some_and(|e| condition(e) == ("True", "Prepared")),
        "the Neuron entry changed: {entries:?}"
    );
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
