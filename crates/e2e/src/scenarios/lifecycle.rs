//! Scenarios about the life of a prepared claim: sharing (7), opaque config
//! (8), unprepare on delete (9), and a driver crash (10).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::json;

use super::allocate::{GONE, RUNNING, check_efa_view, check_neuron_view, node, visible_cores};
use super::kit;
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

/// Whether the driver on `node` holds `claim_uid` prepared: its checkpoint
/// entry and its CDI spec file.
pub(super) fn prepared(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
    claim_uid: &str,
) -> Result<(bool, bool)> {
    let in_checkpoint = tb
        .checkpoint(node, kind)?
        .is_some_and(|c| c.claims.contains_key(claim_uid));
    let has_cdi = tb
        .cdi_spec_files(node)?
        .iter()
        .any(|f| f.contains(claim_uid));
    Ok((in_checkpoint, has_cdi))
}

/// Waits until the claim has neither a checkpoint entry nor a CDI spec.
pub(super) async fn wait_unprepared(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
    uid: &str,
) -> Result<()> {
    kit::wait_for(
        tb,
        &format!("claim {uid} unprepared on {node}"),
        Duration::from_secs(60),
        || async { Ok((prepared(tb, node, kind, uid)? == (false, false)).then_some(())) },
    )
    .await
}

pub(super) fn uid(c: &ResourceClaim) -> String {
    c.metadata.uid.clone().unwrap_or_default()
}

/// Scenario 7: `examples/efa/shared-efa-claim.yaml`.
pub async fn shared_claim(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/shared-efa-claim.yaml"), None)?;
    kit::apply_all(tb, ns, &objs).await?;
    let a = kit::running(tb, ns, "shared-efa-a", RUNNING).await?;
    let b = kit::running(tb, ns, "shared-efa-b", RUNNING).await?;
    let node_a = a.spec.and_then(|s| s.node_name).unwrap_or_default();
    let node_b = b.spec.and_then(|s| s.node_name).unwrap_or_default();
    ensure!(node_a == node_b, "sharing pods on {node_a} and {node_b}");
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let claim = claims.get("shared-efa").await?;
    let reserved = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map_or(0, Vec::len);
    ensure!(reserved == 2, "claim reserved for {reserved} pods");
    let devs = kit::allocation(&claim);
    ensure!(devs.len() == 1, "allocated {devs:?}");
    let n = node(tb, &node_a)?;
    let ra = kit::probe(tb, ns, "shared-efa-a").await?;
    let rb = kit::probe(tb, ns, "shared-efa-b").await?;
    check_efa_view(&n, &devs, &ra)?;
    check_efa_view(&n, &devs, &rb)?;
    let claim_uid = uid(&claim);
    ensure!(
        prepared(tb, &n.name, DriverKind::Efa, &claim_uid)? == (true, true),
        "not prepared"
    );

    kit::delete_pods(tb, ns, &["shared-efa-a"], GONE).await?;
    // The kubelet unprepares only when the last user is gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        prepared(tb, &n.name, DriverKind::Efa, &claim_uid)? == (true, true),
        "claim unprepared while shared-efa-b still uses it"
    );
    kit::running(tb, ns, "shared-efa-b", Duration::from_secs(5)).await?;

    kit::delete_pods(tb, ns, &["shared-efa-b"], GONE).await?;
    wait_unprepared(tb, &n.name, DriverKind::Efa, &claim_uid).await?;
    Ok(())
}

/// Scenario 8: `examples/neuron/neuron-lnc-per-claim.yaml`, then LNC 3.
pub async fn lnc(tb: &impl Testbed, ns: &str) -> Result<()> {
    let trn2 = node(tb, "trn2")?;
    let objs = kit::example(
        tb,
        &examples_dir().join("neuron/neuron-lnc-per-claim.yaml"),
        Some("trn2"),
    )?;
    kit::apply_all(tb, ns, &objs).await?;
    kit::running(tb, ns, "neuron-4-chips-lnc1", RUNNING).await?;
    let devs = kit::pod_devices(tb, ns, "neuron-4-chips-lnc1").await?;
    let report = kit::probe(tb, ns, "neuron-4-chips-lnc1").await?;
    let idx = check_neuron_view(&devs, &report)?;
    ensure!(idx.len() == 4, "allocated {devs:?}");
    ensure!(
        report
            .env
            .get("NEURON_LOGICAL_NC_CONFIG")
            .map(String::as_str)
            == Some("1"),
        "NEURON_LOGICAL_NC_CONFIG={:?}",
        report.env.get("NEURON_LOGICAL_NC_CONFIG")
    );
    let want = visible_cores(&trn2, &idx, 1)?;
    ensure!(
        report.env.get("NEURON_RT_VISIBLE_CORES") == Some(&want),
        "NEURON_RT_VISIBLE_CORES={:?}, want {want} (8 logical cores per Trainium2 chip at LNC 1)",
        report.env.get("NEURON_RT_VISIBLE_CORES")
    );

    // LNC 3: the scheduler allocates (it does not read opaque config), the
    // driver refuses at prepare and the kubelet reports our message.
    let mut bad = objs
        .iter()
        .find(|o| o["kind"] == "ResourceClaimTemplate")
        .cloned()
        .ok_or_else(|| anyhow!("example has no template"))?;
    bad["metadata"]["name"] = json!("neuron-4-chips-lnc3");
    bad["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] =
        json!(3);
    kit::apply_all(tb, ns, &[bad]).await?;
    let pod = kit::pod_with_claim(
        tb,
        "neuron-lnc3",
        Some("neuron-4-chips-lnc3"),
        None,
        Some("trn2"),
    );
    kit::apply_all(tb, ns, &[pod]).await?;
    let want_msg = "field `logicalNeuronCore`: value 3 is out of range";
    let message = kit::wait_for(
        tb,
        "FailedPrepareDynamicResources on neuron-lnc3",
        Duration::from_secs(90),
        || async {
            Ok(kit::events(tb, ns, "neuron-lnc3")
                .await?
                .into_iter()
                .find(|(r, _)| r == "FailedPrepareDynamicResources")
                .map(|(_, m)| m))
        },
    )
    .await?;
    ensure!(
        message.contains(want_msg),
        "event message {message:?} lacks {want_msg:?}"
    );
    let p = kit::get_pod(tb, ns, "neuron-lnc3")
        .await?
        .ok_or_else(|| anyhow!("pod vanished"))?;
    let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
    ensure!(phase == "Pending", "pod with LNC 3 is {phase}");

    kit::delete_pods(tb, ns, &["neuron-4-chips-lnc1", "neuron-lnc3"], GONE).await?;
    Ok(())
}

/// Scenario 9: `examples/efa/single-efa.yaml`, deleted.
pub async fn delete_unprepares(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), Some("p5"))?;
    kit::apply_all(tb, ns, &objs).await?;
    kit::running(tb, ns, "single-efa", RUNNING).await?;
    let claim = kit::pod_claims(tb, ns, "single-efa")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no claim"))?;
    let claim_uid = uid(&claim);
    ensure!(
        prepared(tb, "p5", DriverKind::Efa, &claim_uid)? == (true, true),
        "claim {claim_uid} not in checkpoint + CDI: cdi files {:?}",
        tb.cdi_spec_files("p5")?
    );
    kit::delete_pods(tb, ns, &["single-efa"], GONE).await?;
    wait_unprepared(tb, "p5", DriverKind::Efa, &claim_uid).await?;
    // The generated claim goes with its pod.
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let name = claim.metadata.name.clone().unwrap_or_default();
    kit::wait_for(
        tb,
        &format!("claim {name} deleted"),
        Duration::from_secs(60),
        || async { Ok(claims.get_opt(&name).await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

/// How long pods that failed to prepare while the driver was down may take.
const AFTER_RESTART: Duration = Duration::from_secs(240);

/// Scenario 10: SIGKILL the EFA driver on p5 while pods come and go.
pub async fn driver_crash(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), Some("p5"))?;
    let template: Vec<_> = objs
        .into_iter()
        .filter(|o| o["kind"] == "ResourceClaimTemplate")
        .collect();
    kit::apply_all(tb, ns, &template).await?;
    let pod = |name: &str| kit::pod_with_claim(tb, name, Some("single-efa"), None, Some("p5"));
    kit::apply_all(tb, ns, &[pod("steady"), pod("leaving")]).await?;
    let steady = kit::running(tb, ns, "steady", RUNNING).await?;
    kit::running(tb, ns, "leaving", RUNNING).await?;
    let steady_id =
        kit::first_container(&steady).ok_or_else(|| anyhow!("steady has no container status"))?;
    let leaving_claim = uid(&kit::pod_claims(tb, ns, "leaving")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no claim"))?);

    tb.kill_driver("p5", DriverKind::Efa)?;
    // Under a supervisor (kubelet, for a DaemonSet pod) the driver comes
    // back by itself within about a second: the pods below then race its
    // restart instead of finding it dead, and the restart is what is tested.
    let supervised = tb.restarts_crashed_drivers();
    if !supervised {
        kit::wait_for(
            tb,
            "efa-driver on p5 dead",
            Duration::from_secs(10),
            || async { Ok((!tb.driver_running("p5", DriverKind::Efa)).then_some(())) },
        )
        .await?;
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(tb.client(), ns);
    pods.delete("leaving", &Default::default()).await?;
    kit::apply_all(tb, ns, &[pod("new-1"), pod("new-2")]).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for n in ["new-1", "new-2"].into_iter().filter(|_| !supervised) {
        let p = kit::get_pod(tb, ns, n)
            .await?
            .ok_or_else(|| anyhow!("{n} vanished"))?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(
            phase != "Running",
            "{n} is Running while its driver is dead"
        );
    }

    tb.start_driver("p5", DriverKind::Efa).await?;
    // The kubelet retries a failed prepare only at its next periodic sync
    // of the pod (syncFrequency, 1 min, plus up to half of it as jitter):
    // it does not count the failure as a sync error, so its 10 s error
    // backoff does not apply (kubernetes#139836). Left alone, pods that
    // failed while the driver was down start 60–90 s after it is back (the
    // chaos runs measure that). Here, once the kubelet has registered the
    // restarted driver, a pod still waiting is updated (an annotation), as
    // an operator would: an update makes the kubelet sync the pod at once,
    // and the prepare it retries must succeed. The update is repeated every
    // few seconds while a pod still waits, as a precaution: an update the
    // kubelet syncs before its DRA manager holds the new connection would
    // fail its retry too and leave the pod to the periodic sync again (not
    // seen so far; s10's slow CI runs are not explained by it, see
    // docs/e2e.md).
    super::registration::registered_on(
        tb,
        "p5",
        DriverKind::Efa,
        super::registration::REGISTRATION_WAIT,
    )
    .await?;
    let nudging = Instant::now();
    for attempt in 1.. {
        let mut waiting = 0;
        for n in ["new-1", "new-2"] {
            if !is_running(tb, ns, n).await? {
                waiting += 1;
                nudge(tb, ns, n, attempt).await?;
            }
        }
        if waiting == 0 || nudging.elapsed() > AFTER_RESTART {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    kit::running(tb, ns, "new-1", AFTER_RESTART).await?;
    kit::running(tb, ns, "new-2", AFTER_RESTART).await?;
    kit::wait_for(tb, "pod leaving gone", GONE, || async {
        Ok(kit::get_pod(tb, ns, "leaving")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    wait_unprepared(tb, "p5", DriverKind::Efa, &leaving_claim).await?;
    let steady_now = kit::running(tb, ns, "steady", Duration::from_secs(5)).await?;
    ensure!(
        kit::first_container(&steady_now) == Some(steady_id.clone()),
        "steady's container changed: {:?} → {:?}",
        steady_id,
        kit::first_container(&steady_now)
    );

    // No device is handed to two claims: not by the scheduler, not in the
    // driver's checkpoint; the checkpoint holds exactly the live claims.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut live = BTreeSet::new();
    let p5 = node(tb, "p5")?;
    for name in ["steady", "new-1", "new-2"] {
        let devs = kit::pod_devices(tb, ns, name).await?;
        for d in &devs {
            if let Some(other) = owner.insert(d.device.clone(), name.to_string()) {
                bail!("{} allocated to {other} and {name}", d.device);
            }
        }
        check_efa_view(&p5, &devs, &kit::probe(tb, ns, name).await?)?;
        for c in kit::pod_claims(tb, ns, name).await? {
            live.insert(uid(&c));
        }
    }
    let cp = tb
        .checkpoint("p5", DriverKind::Efa)?
        .ok_or_else(|| anyhow!("no checkpoint on p5"))?;
    let in_cp: BTreeSet<String> = cp
        .claims
        .iter()
        .filter(|(_, c)| c.namespace == ns)
        .map(|(uid, _)| uid.clone())
        .collect();
    ensure!(
        in_cp == live,
        "checkpoint holds {in_cp:?} of {ns}, live claims {live:?}"
    );
    let mut seen = BTreeSet::new();
    for (claim, c) in &cp.claims {
        for d in &c.devices {
            ensure!(
                seen.insert(d.device.clone()),
                "{} prepared twice (again for {claim})",
                d.device
            );
        }
    }

    kit::delete_pods(tb, ns, &["steady", "new-1", "new-2"], GONE).await?;
    Ok(())
}

async fn is_running(tb: &impl Testbed, ns: &str, name: &str) -> Result<bool> {
    let pod = kit::get_pod(tb, ns, name).await?;
    Ok(pod.and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running"))
}

/// Updates the pod (an annotation that names the attempt: an unchanged
/// value would be no update) so that the kubelet syncs it now instead of at
/// its next periodic sync.
async fn nudge(tb: &impl Testbed, ns: &str, name: &str, attempt: u32) -> Result<()> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(tb.client(), ns);
    let patch = json!({"metadata": {"annotations": {
        "e2e.aws-dra.dev/nudged": format!("kubernetes#139836, attempt {attempt}"),
    }}});
    pods.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    tracing::info!(
        pod = name,
        attempt,
        "updated to make the kubelet retry its prepare now"
    );
    Ok(())
}
