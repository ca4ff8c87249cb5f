//! Every metric a driver process registers, in one registry, each vector
//! with one child so that `gather` lists it: what the metric naming rule
//! ([`super::metric_names`]) and the generated metrics reference of the
//! docs (`cargo xtask docs`) read. The registrations are the ones
//! [`super::runtime::run`], [`super::runner::serve_until`] and the ops
//! server make; the docs
//! check counts the metric constructors in the source against what this
//! registers, so a metric registered elsewhere and not here fails CI.

use prometheus::Registry;

use crate::daemon::ops::Readiness;
use crate::daemon::ops::slots::OpsMetrics;
use crate::daemon::ready::StartupWaits;
use crate::daemon::rescan::RescanMetrics;
use crate::prepare::metrics::PluginMetrics;
use crate::prepare::status::StatusMetrics;
use crate::publish::publisher::PublishMetrics;

/// Registers in `registry` every metric dra-core's runtime registers, the
/// rescan metrics under `prefix` (`aws_dra_efa`), each vector with a child.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
pub fn register_every_metric(registry: &Registry, prefix: &str) -> Result<(), prometheus::Error> {
    let plugin = PluginMetrics::register(registry)?;
    plugin.claim_done("prepare", true, 0.01);
    drop(plugin.in_flight("prepare"));
    plugin.registration(false);
    plugin.release_wait_done(true);
    plugin.checkpoint_error("corrupt");
    plugin.commit_group(3);
    let publish = PublishMetrics::register(registry)?;
    publish.publish_errors.with_label_values(&["create"]).inc();
    publish.slice_writes.with_label_values(&["create"]).inc();
    publish
        .validation_issues
        .with_label_values(&["dropped", "too_long"])
        .inc();
    publish
        .withheld_devices
        .with_label_values(&["other.example.com"])
        .set(0);
    // Sets `what` for every wait itself.
    StartupWaits::register(registry, Readiness::default())?;
    StatusMetrics::register(registry)?.write("applied");
    // Its children exist from the start.
    OpsMetrics::register(registry)?;
    register_rescan_metrics(registry, prefix)
}

/// The rescan metrics under `prefix`, each vector with a child: what
/// every binary registers under its own prefix.
pub(crate) fn register_rescan_metrics(
    registry: &Registry,
    prefix: &str,
) -> Result<(), prometheus::Error> {
    let rescan = RescanMetrics::register(registry, prefix)?;
    rescan.rescans_total.with_label_values(&["start"]).inc();
    rescan
        .devices_by_health
        .with_label_values(&["healthy"])
        .set(1);
    rescan.health_transitions.with_label_values(&["x"]).inc();
    Ok(())
}
