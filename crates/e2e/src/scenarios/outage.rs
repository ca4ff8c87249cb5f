//! Scenario 28: a node whose EFA driver starts while the API server is down
//! (a node rebooted during a control-plane outage), with an unprepare
//! pending across the outage.
//!
//! What it shows, on p5's EFA driver:
//!
//! 1. A pod with one EFA runs on p5; its claim has a checkpoint entry and a
//!    CDI spec. The pool's slices are noted.
//! 2. The driver is stopped (SIGTERM) and the pod deleted while the API
//!    server still runs: kubelet learns of the deletion (it can only learn
//!    of one from the API server), stops the container and fails to
//!    unprepare (no driver), so the unprepare is pending and the pod stays
//!    Terminating.
//! 3. The API server is stopped and the driver started again. With no API
//!    server, the driver serves kubelet: kubelet registers it
//!    (`aws_dra_plugin_registered 1`), `/readyz` answers 503 naming the API
//!    server and no longer the registration, `aws_dra_waiting_for` is 1 for
//!    `apiserver` only, and kubelet's retried NodeUnprepareResources removes
//!    the claim's checkpoint entry and CDI spec, from the checkpoint alone.
//! 4. The API server comes back. The same driver process (same pid, no
//!    restart) reads its Node, becomes ready and keeps its pool: the same
//!    slices with the same devices. kubelet finishes the deleted pod, and a
//!    new pod with an EFA on p5 runs, prepared by that process.
//!
//! Only a testbed that can stop its API server runs it (host processes on
//! the local cluster); the charts' and kind's skip it by name.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::allocate::{GONE, RUNNING};
use super::kit;
use super::lifecycle::{prepared, uid, wait_unprepared};
use super::registration::{REGISTRATION_WAIT, registered_on};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

const NODE: &str = "p5";
const EFA: DriverKind = DriverKind::Efa;

/// How long the driver may take to be ready once the API server is back:
/// its Node read is retried with a delay capped at 15 s.
const READY_AFTER: Duration = Duration::from_secs(60);

/// What `/readyz` says while the API server is the only thing awaited.
const WAITS_FOR_API: &str = "waiting for the API server";

pub async fn apiserver_outage(tb: &impl Testbed, ns: &str) -> Result<()> {
    let result = steps(tb, ns).await;
    // Whatever happened, leave p5's EFA driver running for the next
    // scenario (the API server itself is always started again).
    if !tb.driver_running(NODE, EFA) {
        tb.start_driver(NODE, EFA).await?;
    }
    result
}

async fn steps(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), Some(NODE))?;
    let template: Vec<_> = objs
        .into_iter()
        .filter(|o| o["kind"] == "ResourceClaimTemplate")
        .collect();
    kit::apply_all(tb, ns, &template).await?;
    let pod = |name: &str| kit::pod_with_claim(tb, name, Some("single-efa"), None, Some(NODE));

    // 1. A pod holding an EFA; the pool as it is.
    kit::apply_all(tb, ns, &[pod("before")]).await?;
    kit::running(tb, ns, "before", RUNNING).await?;
    let claim = uid(&kit::pod_claims(tb, ns, "before")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("pod before has no claim"))?);
    ensure!(
        prepared(tb, NODE, EFA, &claim)? == (true, true),
        "claim {claim} of pod before is not prepared on {NODE}"
    );
    let pool_before = pool(tb).await?;

    // 2. An unprepare kubelet cannot do yet.
    tb.stop_driver(NODE, EFA).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    pods.delete("before", &Default::default()).await?;
    kit::wait_for(
        tb,
        "kubelet to stop the deleted pod's container",
        Duration::from_secs(60),
        || async {
            let pod = kit::get_pod(tb, ns, "before").await?.ok_or_else(|| {
                anyhow!("pod before is gone while its driver is stopped: who unprepared it?")
            })?;
            Ok(containers_terminated(&pod).then_some(()))
        },
    )
    .await?;
    ensure!(
        prepared(tb, NODE, EFA, &claim)? == (true, true),
        "claim {claim} changed on {NODE} while its driver was stopped"
    );

    // 3. The outage: the driver starts and serves kubelet without the API server.
    let stopping = Instant::now();
    let (pid, during) = tb
        .with_api_server_stopped(during_outage(tb, &claim))
        .await
        .context("stopping or starting the API server")??;
    let back = Instant::now();
    let down_ms = stopping.elapsed().as_millis();

    // 4. The API server is back: the same process catches up.
    kit::wait_for(tb, "efa-driver on p5 ready", READY_AFTER, || async {
        let (status, _) = tb.driver_readyz(NODE, EFA).await?;
        Ok((status == 200).then_some(()))
    })
    .await?;
    let ready_ms = back.elapsed().as_millis();
    let metrics = tb.driver_metrics(NODE, EFA).await?;
    for what in ["apiserver", "kubelet_registration", "first_publish"] {
        let value = kit::gauge(&metrics, "aws_dra_waiting_for", &format!("what=\"{what}\""));
        ensure!(
            value == Some(0.0),
            "aws_dra_waiting_for{{what=\"{what}\"}} is {value:?} once ready"
        );
    }
    let pool_after = pool(tb).await?;
    let devices = |p: &BTreeMap<String, Slice>| -> BTreeMap<String, Vec<String>> {
        p.iter()
            .map(|(name, s)| (name.clone(), s.devices.clone()))
            .collect()
    };
    ensure!(
        devices(&pool_after) == devices(&pool_before),
        "p5's EFA slices differ after the outage: before {:?}, after {:?}",
        devices(&pool_before),
        devices(&pool_after)
    );
    let rewritten = pool_after
        .iter()
        .filter(|(name, s)| pool_before.get(*name).map(|b| &b.version) != Some(&s.version))
        .count();
    kit::wait_for(tb, "pod before gone", GONE, || async {
        Ok(kit::get_pod(tb, ns, "before")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    kit::apply_all(tb, ns, &[pod("after")]).await?;
    kit::running(tb, ns, "after", RUNNING).await?;
    let new_pod_ms = back.elapsed().as_millis();
    let after_claim = uid(&kit::pod_claims(tb, ns, "after")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("pod after has no claim"))?);
    ensure!(
        prepared(tb, NODE, EFA, &after_claim)? == (true, true),
        "claim {after_claim} of pod after is not prepared on {NODE}"
    );
    let pid_now = tb.driver_process_id(NODE, EFA);
    ensure!(
        pid_now == Some(pid),
        "efa-driver on p5 restarted after the outage: pid {pid} then {pid_now:?}; {}",
        tb.logs_hint()
    );
    eprintln!(
        "aws-dra-e2e: s28 driver started during the outage: registered by kubelet {} ms, \
         the pending unprepare done {} ms after its start; API server down {down_ms} ms \
         (stop, outage, start, /readyz); \
         driver ready {ready_ms} ms and a new pod Running {new_pod_ms} ms after the API \
         server was back; {} of {} slices rewritten; one driver process throughout (pid {pid})",
        during.registered_ms,
        during.unprepared_ms,
        rewritten,
        pool_after.len()
    );
    kit::delete_pods(tb, ns, &["after"], GONE).await?;
    wait_unprepared(tb, NODE, EFA, &after_claim).await
}

/// The figures of the outage itself.
struct DuringOutage {
    registered_ms: u128,
    unprepared_ms: u128,
}

/// Starts the driver and checks what it does with no API server; returns
/// its pid.
async fn during_outage(tb: &impl Testbed, claim: &str) -> Result<(i32, DuringOutage)> {
    tb.spawn_driver(NODE, EFA).await?;
    let started = Instant::now();
    let pid = tb
        .driver_process_id(NODE, EFA)
        .ok_or_else(|| anyhow!("efa-driver on p5 is not running after its start"))?;
    registered_on(tb, NODE, EFA, REGISTRATION_WAIT).await?;
    let registered_ms = started.elapsed().as_millis();
    let waits_only_for_api = || async {
        let (status, body) = tb.driver_readyz(NODE, EFA).await?;
        ensure!(
            status == 503 && body.contains(WAITS_FOR_API) && !body.contains("registration"),
            "/readyz of efa-driver on p5 without an API server: {status} {body:?}"
        );
        let metrics = tb.driver_metrics(NODE, EFA).await?;
        let gauge =
            |what: &str| kit::gauge(&metrics, "aws_dra_waiting_for", &format!("what=\"{what}\""));
        ensure!(
            gauge("apiserver") == Some(1.0) && gauge("kubelet_registration") == Some(0.0),
            "aws_dra_waiting_for without an API server: apiserver {:?}, kubelet_registration {:?}",
            gauge("apiserver"),
            gauge("kubelet_registration")
        );
        anyhow::Ok(())
    };
    waits_only_for_api().await?;
    wait_unprepared(tb, NODE, EFA, claim).await?;
    let unprepared_ms = started.elapsed().as_millis();
    // Still the same process, still waiting only for the API server.
    waits_only_for_api().await?;
    ensure!(
        tb.driver_process_id(NODE, EFA) == Some(pid),
        "efa-driver on p5 restarted during the outage; {}",
        tb.logs_hint()
    );
    let figures = DuringOutage {
        registered_ms,
        unprepared_ms,
    };
    Ok((pid, figures))
}

/// A slice of the pool: its devices and resourceVersion.
struct Slice {
    devices: Vec<String>,
    version: Option<String>,
}

/// p5's EFA slices by name.
async fn pool(tb: &impl Testbed) -> Result<BTreeMap<String, Slice>> {
    Ok(kit::slices(tb, NODE, EFA)
        .await?
        .into_iter()
        .map(|s| {
            let mut devices: Vec<String> = (s.spec.devices.unwrap_or_default())
                .into_iter()
                .map(|d| d.name)
                .collect();
            devices.sort();
            let slice = Slice {
                devices,
                version: s.metadata.resource_version,
            };
            (s.metadata.name.unwrap_or_default(), slice)
        })
        .collect())
}

/// Whether every container of the pod has terminated, as kubelet reports it.
fn containers_terminated(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    !statuses.is_empty()
        && statuses
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
}
