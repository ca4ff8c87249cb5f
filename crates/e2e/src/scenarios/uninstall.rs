//! Scenario 23: what happens to a node's slices when its driver goes away
//! for good (`helm uninstall`, or the node leaving the DaemonSet's
//! selector). The driver stops gracefully (SIGTERM) and does not delete its
//! slices, on purpose: a graceful stop is also every rolling update and
//! restart, where the next instance serves the same pool and deleting would
//! make the scheduler lose the node's devices for a moment (s01 asserts that
//! a restart writes nothing). The kubelet deletes them: when a DRA plugin
//! unregisters and does not come back within its wiping delay (30 s in
//! 1.37), it wipes that driver's slices of its node.
//!
//! Asserted here: after a graceful stop the slices stay, unchanged, for
//! [`KEPT_FOR`] (a restart within that window finds them); then they are
//! gone within [`GONE_BY`] of the stop (the kubelet's wipe); the driver,
//! started again, publishes them again.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::kit;
use crate::testbed::{DriverKind, Testbed};

/// How long the slices must stay unchanged after the stop (below the
/// kubelet's 30 s wiping delay).
const KEPT_FOR: Duration = Duration::from_secs(20);
/// By when, after the stop, the kubelet must have wiped them.
const GONE_BY: Duration = Duration::from_secs(60);

fn versions(slices: &[ResourceSlice]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = slices
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

pub async fn slices_after_stop(tb: &impl Testbed, _ns: &str) -> Result<()> {
    let (node, kind) = ("trn2", DriverKind::Efa);
    let driver = kind.driver_name();
    let before = versions(&kit::slices(tb, node, kind).await?);
    ensure!(
        !before.is_empty(),
        "{node} has no {driver} slices to begin with"
    );
    tb.stop_driver(node, kind).await?;
    let stopped = Instant::now();
    let result = async {
        while stopped.elapsed() < KEPT_FOR {
            let now = versions(&kit::slices(tb, node, kind).await?);
            ensure!(
                now == before,
                "{driver} slices of {node} changed {:.1} s after a graceful stop, before the kubelet's wiping delay: {before:?} -> {now:?}",
                stopped.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let gone = kit::wait_for(
            tb,
            &format!("the kubelet's wipe of {driver} slices of {node}"),
            GONE_BY.saturating_sub(stopped.elapsed()),
            || async { Ok(kit::slices(tb, node, kind).await?.is_empty().then_some(())) },
        )
        .await;
        gone?;
        eprintln!(
            "aws-dra-e2e: {driver} slices of {node} unchanged {:.0} s after a graceful stop; wiped by the kubelet {:.1} s after it",
            KEPT_FOR.as_secs_f64(),
            stopped.elapsed().as_secs_f64()
        );
        Ok(())
    }
    .await;
    // Whatever happened, the next scenarios need the driver and its slices.
    tb.start_driver(node, kind).await?;
    result?;
    kit::wait_for(
        tb,
        &format!("{driver} slices of {node} published again"),
        Duration::from_secs(60),
        || async { Ok((!kit::slices(tb, node, kind).await?.is_empty()).then_some(())) },
    )
    .await?;
    Ok(())
}
