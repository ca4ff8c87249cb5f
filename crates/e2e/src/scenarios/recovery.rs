//! Scenario 34: a damaged checkpoint under a running pod. The EFA driver on
//! p5 is stopped, its checkpoint cut in half, and started again: it rebuilds
//! the running claim from its CDI spec and attributes file (confirmed by the
//! API server), removes neither, and a restart of the pod's container (which
//! needs both: the spec bind-mounts the file) succeeds.

use std::time::Duration;

use anyhow::{Result, anyhow, ensure};

use super::allocate::{GONE, RUNNING};
use super::kit;
use super::lifecycle::{prepared, uid, wait_unprepared};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, NodeDir, Testbed};

const NODE: &str = "p5";

/// The claim's files on the node: CDI specs and attributes files named for it.
fn claim_files(tb: &impl Testbed, claim_uid: &str) -> Result<(Vec<String>, Vec<String>)> {
    let of = |files: Vec<String>| -> Vec<String> {
        files
            .into_iter()
            .filter(|f| f.contains(claim_uid))
            .collect()
    };
    Ok((
        of(tb.cdi_spec_files(NODE)?),
        of(tb.node_dir_files(NODE, NodeDir::DeviceAttributes)?),
    ))
}

pub async fn damaged_checkpoint(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), Some(NODE))?;
    let template: Vec<_> = objs
        .into_iter()
        .filter(|o| o["kind"] == "ResourceClaimTemplate")
        .collect();
    kit::apply_all(tb, ns, &template).await?;
    let mut pod = kit::pod_with_claim(tb, "steady", Some("single-efa"), None, Some(NODE));
    // kubelet restarts the container in place (the pod and its claim stay).
    pod["spec"]["restartPolicy"] = "Always".into();
    kit::apply_all(tb, ns, &[pod]).await?;
    let running = kit::running(tb, ns, "steady", RUNNING).await?;
    let (first_id, restarts) =
        kit::first_container(&running).ok_or_else(|| anyhow!("no container status"))?;
    let claim = kit::pod_claims(tb, ns, "steady")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("steady has no claim"))?;
    let claim_uid = uid(&claim);
    let files = claim_files(tb, &claim_uid)?;
    ensure!(
        files.0.len() == 1 && files.1.len() == 1,
        "claim {claim_uid} should have one CDI spec and one attributes file: {files:?}"
    );

    tb.stop_driver(NODE, DriverKind::Efa).await?;
    tb.damage_checkpoint(NODE, DriverKind::Efa)?;
    ensure!(
        tb.checkpoint(NODE, DriverKind::Efa).is_err(),
        "the cut checkpoint still parses"
    );
    tb.start_driver(NODE, DriverKind::Efa).await?;
    super::registration::registered_on(
        tb,
        NODE,
        DriverKind::Efa,
        super::registration::REGISTRATION_WAIT,
    )
    .await?;
    // Recovered before anything was answered: recorded again, files kept.
    kit::wait_for(
        tb,
        &format!("claim {claim_uid} recorded again"),
        Duration::from_secs(30),
        || async {
            Ok(tb
                .checkpoint(NODE, DriverKind::Efa)
                .ok()
                .flatten()
                .filter(|c| c.claims.contains_key(&claim_uid)))
        },
    )
    .await?;
    ensure!(
        prepared(tb, NODE, DriverKind::Efa, &claim_uid)? == (true, true),
        "claim {claim_uid} not recovered"
    );
    let after = claim_files(tb, &claim_uid)?;
    ensure!(after == files, "files changed: {files:?} -> {after:?}");
    let metrics = tb.driver_metrics(NODE, DriverKind::Efa).await?;
    ensure!(
        kit::gauge(
            &metrics,
            "aws_dra_checkpoint_errors_total",
            "reason=\"corrupt\""
        ) == Some(1.0),
        "the damaged checkpoint is not counted"
    );

    // The container dies; kubelet starts it again through the same spec.
    tb.kill_container(NODE, &first_id).await?;
    let restarted = kit::wait_for(tb, "steady's container restarted", RUNNING, || async {
        let p = kit::get_pod(tb, ns, "steady").await?;
        let Some(p) = p else { return Ok(None) };
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .is_some_and(|c| c.ready);
        Ok(kit::first_container(&p).filter(|(id, n)| ready && *id != first_id && *n > restarts))
    })
    .await?;
    eprintln!(
        "s34: steady's container restarted on the recovered claim ({} restarts)",
        restarted.1
    );

    kit::delete_pods(tb, ns, &["steady"], GONE).await?;
    wait_unprepared(tb, NODE, DriverKind::Efa, &claim_uid).await?;
    ensure!(
        claim_files(tb, &claim_uid)? == (vec![], vec![]),
        "files of claim {claim_uid} left after its unprepare"
    );
    Ok(())
}
