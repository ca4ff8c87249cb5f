//! Waiting for the kubelet's registration of a driver, for the scenarios
//! and the demo: a complete pool in the API comes first, and a pod that
//! reaches the kubelet before the registration fails its prepare and waits
//! for the kubelet's next periodic sync of the pod (kubernetes#139836).

use std::time::Duration;

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
