//! Scenario 31: EFAs shared by capacity (consumable capacity, Kubernetes
//! 1.36+), as `docs/efa.md` ("Sharing an EFA by capacity") tells an
//! operator to turn it on for one node pool: the Node label
//! `efa.networking.k8s.aws/sharing=capacity`, read when the driver starts.
//!
//! On p5 (100 Gbps per EFA) independent claims pinned to one EFA share it:
//! three that ask for nothing get the default quarter (25G) each, one that
//! asks for 23G is rounded up to the 5G step (25G); the adapter is then
//! full, and a fifth claim stays Pending with the scheduler's reason until
//! one of the four goes. The four are created one after another (see
//! `shared`) and are then all prepared on the node at once, each with its
//! own share of the same device in the driver's checkpoint. The
//! label is removed and the driver restarted before the scenario returns,
//! so later scenarios find exclusive EFAs again.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::allocate::{GONE, RUNNING};
use super::kit::{self, attr_str};
use crate::testbed::{DriverKind, Testbed};

const NODE: &str = "p5";
const SHARING_LABEL: &str = "efa.networking.k8s.aws/sharing";
/// A p5 EFA's bandwidth, the default share and what 23G rounds up to.
const ADAPTER: &str = "100G";
const SHARE: &str = "25G";
/// How long the republished slices may take after the driver restarts.
const REPUBLISHED: Duration = Duration::from_secs(60);

/// Scenario 31.
pub async fn shared_capacity(tb: &impl Testbed, ns: &str) -> Result<()> {
    set_sharing(tb, Some("capacity")).await?;
    let result = shared(tb, ns).await;
    let cleanup = async {
        kit::delete_all_pods(tb, ns, GONE).await?;
        set_sharing(tb, None).await
    }
    .await;
    result?;
    cleanup.context("turning EFA sharing off again on p5")
}

/// Labels (or unlabels) p5 and restarts its EFA driver, which reads the
/// label at start.
async fn set_sharing(tb: &impl Testbed, value: Option<&str>) -> Result<()> {
    let nodes: Api<Node> = Api::all(tb.client());
    let patch = json!({"metadata": {"labels": {SHARING_LABEL: value}}});
    nodes
        .patch(
            &kit::node_name(tb, NODE),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .with_context(|| format!("labelling {NODE} {SHARING_LABEL}={value:?}"))?;
    tb.stop_driver(NODE, DriverKind::Efa).await?;
    tb.start_driver(NODE, DriverKind::Efa).await?;
    let want_shared = value == Some("capacity");
    kit::wait_for(
        tb,
        &format!("{NODE}'s EFAs published shared={want_shared}"),
        REPUBLISHED,
        || async {
            let devices = kit::devices(tb, NODE, DriverKind::Efa).await?;
            let shared = devices.values().filter(|d| is_shared(d)).count();
            let done = if want_shared {
                shared == devices.len() && !devices.is_empty()
            } else {
                shared == 0
            };
            Ok(done.then_some(()))
        },
    )
    .await?;
    // Slices come before the kubelet knows the restarted driver: a pod
    // created in between fails its prepare ("not registered") and is only
    // retried at the kubelet's next periodic sync of the pod, 60-90 s later.
    super::registration::registered_on(
        tb,
        NODE,
        DriverKind::Efa,
        super::registration::REGISTRATION_WAIT,
    )
    .await
}

fn is_shared(d: &Device) -> bool {
    d.allow_multiple_allocations == Some(true)
        && d.capacity
            .as_ref()
            .and_then(|c| c.get("bandwidth"))
            .is_some_and(|c| c.value.0 == ADAPTER && c.request_policy.is_some())
}

/// A claim for exactly the EFA at `bdf`, asking for `bandwidth` or nothing.
fn claim(name: &str, bdf: &str, bandwidth: Option<&str>) -> Value {
    let mut request = json!({
        "deviceClassName": DriverKind::Efa.driver_name(),
        "selectors": [{"cel": {"expression": format!(
            "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"{bdf}\""
        )}}],
    });
    if let Some(b) = bandwidth {
        request["capacity"] = json!({"requests": {"bandwidth": b}});
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "efa", "exactly": request}]}},
    })
}

async fn shared(tb: &impl Testbed, ns: &str) -> Result<()> {
    let devices = kit::devices(tb, NODE, DriverKind::Efa).await?;
    let (device, published) = devices
        .iter()
        .next()
        .ok_or_else(|| anyhow!("{NODE} publishes no EFA"))?;
    let bdf = attr_str(published, "resource.kubernetes.io/pciBusID")
        .ok_or_else(|| anyhow!("{device} has no pciBusID"))?;

    // Four claims fill the adapter: 3 x the default 25G, and 23G -> 25G.
    let fits = [
        ("share-1", None),
        ("share-2", None),
        ("share-3", None),
        ("share-4", Some("23G")),
    ];
    // One at a time, each Running before the next is created: kube-scheduler
    // (1.37.2) can count a share it is still binding twice for a moment, and
    // the pod it turns away then waits up to 5 minutes (docs/efa.md, "Shares
    // created at once"). A 2-core CI runner hit that.
    for (name, bandwidth) in fits {
        let pod = kit::pod_with_claim(tb, name, None, Some(name), Some(NODE));
        kit::apply_all(tb, ns, &[claim(name, &bdf, bandwidth), pod]).await?;
        kit::running(tb, ns, name, RUNNING).await?;
    }
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let mut shares = BTreeMap::new();
    for (name, _) in fits {
        let c = claims.get(name).await?;
        let results = c
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        ensure!(
            results.len() == 1 && results[0].device == *device,
            "claim {name} should hold a share of {device}, got {results:?}"
        );
        let r = &results[0];
        let consumed = r
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get("bandwidth"))
            .map(|q| q.0.clone());
        ensure!(
            consumed.as_deref() == Some(SHARE),
            "claim {name} consumed {consumed:?} of {device}'s bandwidth, expected {SHARE}"
        );
        let share = r
            .share_id
            .clone()
            .ok_or_else(|| anyhow!("claim {name}'s result has no shareID: {r:?}"))?;
        shares.insert(share, name);
    }
    ensure!(
        shares.len() == fits.len(),
        "the four claims do not have four distinct shareIDs: {shares:?}"
    );

    // Prepared for all four at once, each with its own share.
    let checkpoint = tb
        .checkpoint(NODE, DriverKind::Efa)?
        .ok_or_else(|| anyhow!("{NODE}'s EFA driver has no checkpoint"))?;
    let mut recorded: Vec<String> = checkpoint
        .claims
        .values()
        .flat_map(|c| c.devices.iter())
        .filter(|d| d.device == *device)
        .flat_map(|d| d.share_ids.iter().cloned())
        .collect();
    recorded.sort();
    let want: Vec<String> = shares.keys().cloned().collect();
    ensure!(
        recorded == want,
        "the checkpoint records shares {recorded:?} of {device}, the allocations {want:?}"
    );

    // The adapter is full: the next claim waits, and the scheduler says so.
    let pod = kit::pod_with_claim(tb, "share-5", None, Some("share-5"), Some(NODE));
    kit::apply_all(tb, ns, &[claim("share-5", &bdf, None), pod]).await?;
    let (reason, message, _) = kit::stays_pending(tb, ns, "share-5").await?;
    ensure!(
        reason == "Unschedulable",
        "a fifth share of the full {device}: the scheduler said {reason}: {message}"
    );
    println!("    share-5 waits: {reason}: {message}");

    // One share goes: the waiting claim gets its place on the same EFA.
    kit::delete_pods(tb, ns, &["share-1"], GONE).await?;
    claims
        .delete("share-1", &Default::default())
        .await
        .context("deleting claim share-1")?;
    kit::running(tb, ns, "share-5", RUNNING)
        .await
        .context("the waiting share after one of the four went")?;
    let got = kit::pod_devices(tb, ns, "share-5").await?;
    ensure!(
        got.len() == 1 && got[0].device == *device,
        "share-5 got {got:?}, not a share of {device}"
    );
    Ok(())
}
