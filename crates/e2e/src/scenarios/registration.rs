//! Waiting for the kubelet's registration of a driver, for the scenarios
//! and the demo: a complete pool in the API comes first, and a pod that
//! reaches the kubelet before the registration fails its prepare and waits
//! for the kubelet's next periodic sync of the pod (kubernetes#139836).

use std::time::{Duration, Instant};

use anyhow::Result;

use super::kit;
use crate::testbed::{DriverKind, Testbed};

/// How long the scenarios give a started driver to be registered.
pub const REGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// Waits, at most `within`, until kubelet has registered the driver `kind`
/// on `node` (`aws_dra_plugin_registered 1` on the driver's `/metrics`).
pub async fn registered_on(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
    within: Duration,
) -> Result<()> {
    kit::wait_for(
        tb,
        &format!("kubelet registration of {} on {node}", kind.binary()),
        within,
        || async {
            let metrics = tb.driver_metrics(node, kind).await?;
            Ok(metrics
                .lines()
                .any(|l| l.trim() == "aws_dra_plugin_registered 1")
                .then_some(()))
        },
    )
    .await
}

/// Waits, at most `within` in all, until the kubelet of every node has
/// registered each of the node's drivers; returns how many that is. The
/// scenario harness calls it once after bring-up and the demo before it
/// applies the examples, so the first pod does not wait a minute for a
/// driver the kubelet did not know yet.
pub async fn all_registered(tb: &impl Testbed, within: Duration) -> Result<usize> {
    let deadline = Instant::now() + within;
    let mut count = 0;
    for node in tb.nodes() {
        for kind in &node.drivers {
            let left = deadline.saturating_duration_since(Instant::now());
            registered_on(tb, &node.name, *kind, left).await?;
            count += 1;
        }
    }
    Ok(count)
}
