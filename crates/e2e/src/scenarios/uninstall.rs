//! Scenario 22: what happens to a node's slices when its driver goes away
//! for good (`helm uninstall`, or the node leaving the DaemonSet's
//! selector). The driver stops gracefully (SIGTERM) and does not delete its
//! slices, on purpose: a graceful stop is also every rolling update and
//! restart, where the next instance serves the same pool and deleting would
//! make the scheduler lose the node's devices for a moment (s01 asserts that
//! a restart writes nothing). kubelet does not delete them either (measured:
//! still there 180 s after the stop, Kubernetes 1.37.2). They go with the
//! Node object (owner reference) or by hand, as `docs/install.md` says.
//!
//! Asserted here: after a graceful stop the slices stay, unchanged, for
//! [`KEPT_FOR`]; the cleanup command of `docs/install.md` (delete the
//! node's slices of the driver) removes them; the driver, started again,
//! publishes them again.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::kit;
use crate::testbed::{DriverKind, Testbed};

/// How long the slices are watched after the stop.
const KEPT_FOR: Duration = Duration::from_secs(40);

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
                "{driver} slices of {node} changed {:.1} s after a graceful stop: {before:?} -> {now:?} (docs/install.md says they stay)",
                stopped.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // docs/install.md: kubectl delete resourceslices --field-selector
        // spec.nodeName=<node>,spec.driver=<driver>
        let api: Api<ResourceSlice> = Api::all(tb.client());
        let selector = format!(
            "spec.nodeName={},spec.driver={driver}",
            kit::node_name(tb, node)
        );
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&selector),
        )
        .await?;
        let left = kit::slices(tb, node, kind).await?;
        ensure!(
            left.is_empty(),
            "{} slices left after the cleanup",
            left.len()
        );
        eprintln!(
            "aws-dra-e2e: {driver} slices of {node} unchanged {:.0} s after a graceful stop; gone after the documented cleanup",
            KEPT_FOR.as_secs_f64()
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
