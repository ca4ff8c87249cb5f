//! Clash events: each clash with another driver's slices is logged, counted
//! and reported as a Node event once when it starts (or takes more of our
//! devices), and logged once when it ends. What a clash is, is decided in
//! [`crate::publish::clash`]; this part only tells people about it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::jiff::Timestamp;

use super::api::PoolApi;
use super::config::PublisherConfig;
use crate::publish::clash::{ClashSource, Clashes, Withheld};
use crate::publish::node_event::NodeReporter;

/// Reason of the Node event when a clash starts.
pub(crate) const CLASH_EVENT_REASON: &str = "DevicesPublishedByAnotherDriver";

/// Longest wait for the Node event's create: the event is a courtesy, the
/// pool must not wait for it.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most device names spelled out in a log line or an event message.
const NAMES_SHOWN: usize = 16;

/// The clashes seen so far, so that each is logged and reported once.
#[derive(Debug, Default)]
pub(super) struct ClashReport {
    active: BTreeMap<ClashSource, BTreeSet<String>>,
    /// Every `other_driver` label set so far, so that an ended clash reads 0.
    labels: BTreeSet<String>,
    pub(super) withheld: Withheld,
}

impl ClashReport {
    /// Takes the new clashes in: logs each one that started (or now takes
    /// more of our devices) and each one that ended, sets the gauge, and
    /// returns the started ones (for the Node event).
    pub(super) fn update(
        &mut self,
        clashes: &Clashes,
        config: &PublisherConfig,
    ) -> Vec<(ClashSource, BTreeSet<String>)> {
        let now = clashes.by_source();
        let mut started = Vec::new();
        for (source, devs) in &now {
            let known = self.active.get(source);
            if known.is_some_and(|k| devs.is_subset(k)) {
                continue;
            }
            tracing::warn!(
                driver = %config.driver_name,
                node = %config.node_name,
                other_driver = %source.driver,
                other_slice = %source.slice,
                pool_withdrawn = clashes.pool_withdrawn(),
                devices = %names(devs),
                "another driver publishes our devices on this node; not publishing them while it does"
            );
            started.push((source.clone(), devs.clone()));
        }
        for (source, devs) in &self.active {
            if !now.contains_key(source) {
                tracing::info!(
                    driver = %config.driver_name,
                    node = %config.node_name,
                    other_driver = %source.driver,
                    other_slice = %source.slice,
                    devices = %names(devs),
                    "the other driver's slice is gone; publishing these devices again"
                );
            }
        }
        let counts = clashes.count_by_driver();
        self.labels.extend(counts.keys().cloned());
        for label in &self.labels {
            let n = counts.get(label).copied().unwrap_or(0);
            config
                .metrics
                .withheld_devices
                .with_label_values(&[label.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.active = now;
        started
    }
}

/// `a, b, c` (and how many more).
fn names(devices: &BTreeSet<String>) -> String {
    let mut out: Vec<&str> = devices
        .iter()
        .take(NAMES_SHOWN)
        .map(String::as_str)
        .collect();
    let more = devices.len().saturating_sub(NAMES_SHOWN);
    let more = format!("and {more} more");
    if devices.len() > NAMES_SHOWN {
        out.push(&more);
    }
    out.join(", ")
}

/// The Node event of a clash that started. Best effort: a failure is
/// logged, never retried (the warning in the log and the gauge remain).
pub(super) async fn node_event(
    api: &impl PoolApi,
    config: &PublisherConfig,
    source: &ClashSource,
    devices: &BTreeSet<String>,
    pool_withdrawn: bool,
) {
    let event = clash_event(config, source, devices, pool_withdrawn, Timestamp::now());
    match tokio::time::timeout(EVENT_TIMEOUT, api.post_event(&event)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::warn!(%error, "could not create the Node event of the clash"),
        Err(_) => tracing::warn!("creating the Node event of the clash timed out"),
    }
}

pub(super) fn clash_event(
    config: &PublisherConfig,
    source: &ClashSource,
    devices: &BTreeSet<String>,
    pool_withdrawn: bool,
    now: Timestamp,
) -> CoreEvent {
    let what = if pool_withdrawn {
        format!(
            "ResourceSlice {} of driver {} on this node was not written by this driver (same driver and pool name); \
             all {} devices of this driver are withdrawn ({})",
            source.slice,
            source.driver,
            config.driver_name,
            names(devices)
        )
    } else {
        format!(
            "driver {} publishes devices of driver {} on this node (ResourceSlice {}); not publishing {} \
             while it does, so that no device is allocated twice",
            source.driver,
            config.driver_name,
            source.slice,
            names(devices)
        )
    };
    NodeReporter {
        driver: &config.driver_name,
        node: &config.node_name,
        node_uid: config.node_owner.as_ref().map(|o| o.uid.as_str()),
    }
    .warning(CLASH_EVENT_REASON, "WithholdDevices", what, now)
}
