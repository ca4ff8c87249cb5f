//! The publisher task: keeps the node's pool in the API server equal to the
//! driver's current devices.
//!
//! It lists and watches the slices of its node, of every driver (field
//! selector `spec.nodeName=<node>`), into a reflector store, and runs
//! [`reconcile`] on its own slices only ([`super::clash::own_slices`]) when
//! the devices change, when a watch event arrives (someone else edited or
//! deleted a slice: drift repair; another driver published on the node) and
//! when a retry is due. The other drivers' slices are what the clash check
//! ([`super::clash`]) needs: before each reconcile it withholds the devices
//! another publisher already has (the whole pool when another writer uses
//! our driver name). Watching the node's slices of all drivers costs no
//! extra API call: it is the same single watch with a wider selector, and a
//! node carries a handful of slices. The task only awaits the API server
//! and its inputs, so it never blocks the kubelet-facing part of the
//! process; it ends when `shutdown` completes.
//!
//! The loop is thin; each of its jobs is a part of its own:
//!
//! * [`schedule`]: when a reconcile runs; API errors are retried with
//!   capped exponential backoff and jitter, writes from 1 s up to 2 min, the
//!   watch from 0.5 s up to 5 s ([`BackoffConfig::WATCH`]), and the watch's
//!   return after an outage cuts a write's grown backoff short;
//! * [`settle`]: write settling. The reconcile sees the watch's view with
//!   the publisher's own successful writes laid over it until the watch
//!   shows them, so a watch that lags (an API server far behind) never
//!   makes the publisher write the same slice again;
//! * [`apply`]: the writes; a create or update refused because the view was
//!   behind is resolved by reading the slice, not by writing again;
//! * [`clash_report`]: the log lines, gauge and Node event of each clash;
//! * [`taints`]: noticing an API server that drops device taints;
//! * [`handover`]: one publisher per pool when two instances of the driver
//!   run on the node (a surge upgrade): the newest publishes, the older
//!   yields.
//!
//! [`BackoffConfig::WATCH`]: crate::publish::backoff::BackoffConfig::WATCH

mod api;
mod apply;
mod clash_report;
mod config;
pub(crate) mod handover;
mod schedule;
mod settle;
mod taints;

use std::future::Future;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector as reflect};
use tokio::sync::watch;
use tokio::time::Instant;

use super::backoff::WatchBackoff;
use super::clash::{Withheld, find_clashes, own_slices};
use super::desired::{DesiredPool, PoolContent};
use super::reconcile::reconcile;
use api::{KubeApi, PoolApi};
use apply::{Applied, apply, check_unsettled};
use clash_report::{ClashReport, node_event};
use handover::Handover;
use schedule::Schedule;
use settle::OwnWrites;
use taints::TaintSupport;

// Public for the test helpers only (see `crate::testing`); a `pub use`
// in a build without them would be unreachable.
#[cfg(not(feature = "testing"))]
pub(crate) use config::{PublishMetrics, PublisherConfig, PublisherConfigError};
#[cfg(feature = "testing")]
pub use config::{PublishMetrics, PublisherConfig, PublisherConfigError};

/// Runs the publisher until `shutdown` completes. Spawn it as its own task.
/// If the sender of `devices` goes away the last devices stay published.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub async fn run(
    client: kube::Client,
    config: PublisherConfig,
    devices: watch::Receiver<PoolContent>,
    shutdown: impl Future<Output = ()>,
) {
    let api = KubeApi::new(client);
    let (store, writer) = reflector::store();
    let events = reflect(
        writer,
        watcher::watcher(api.slices(), config.watch_config()),
    )
    .backoff(WatchBackoff::new(config.watch_backoff));
    drive(api, store, events, config, devices, shutdown).await;
}

/// The loop of [`run`] on any [`PoolApi`] and any stream of watch events
/// (already applied to `store`).
async fn drive(
    api: impl PoolApi + Sync,
    store: Store<ResourceSlice>,
    events: impl Stream<Item = Result<Event<ResourceSlice>, watcher::Error>>,
    config: PublisherConfig,
    mut devices: watch::Receiver<PoolContent>,
    shutdown: impl Future<Output = ()>,
) {
    let mut events = std::pin::pin!(events);
    let mut shutdown = std::pin::pin!(shutdown);
    devices.borrow_and_update();
    let mut devices_open = true;
    let mut publisher = Publisher::new(api, &config, store);
    tracing::info!(node = %config.node_name, driver = %config.driver_name, "resourceslice publisher started");

    loop {
        if publisher.schedule.start() {
            tokio::select! {
                () = publisher.reconcile(&devices) => {}
                () = &mut shutdown => break,
            }
            continue;
        }
        let retry = sleep_until_opt(publisher.schedule.retry_at());
        // Read-backs wait while a failed round waits out its backoff.
        let check = match publisher.schedule.retry_at() {
            None => publisher.own.next_check(),
            Some(_) => None,
        };
        let check = sleep_until_opt(check);
        let recheck = sleep_until_opt(publisher.handover.recheck_at());
        tokio::select! {
            () = &mut shutdown => break,
            changed = devices.changed(), if devices_open => match changed {
                Ok(()) => {
                    devices.borrow_and_update();
                    publisher.devices_changed();
                }
                Err(_) => {
                    devices_open = false;
                    tracing::warn!("device source closed; keeping the last published devices");
                }
            },
            event = events.next() => match event {
                Some(Ok(event)) => publisher.watch_event(&event),
                Some(Err(error)) => {
                    publisher.schedule.watch_failed();
                    config.metrics.publish_errors.with_label_values(&["watch"]).inc();
                    tracing::warn!(%error, "resourceslice watch failed; retrying with backoff");
                }
                None => {
                    // The watcher stream does not end on its own; if it did, the
                    // publisher can no longer see drift. Say so loudly.
                    tracing::error!("resourceslice watch ended; publisher stops");
                    break;
                }
            },
            () = retry => publisher.schedule.retry_due(),
            () = check => publisher.schedule.changed(),
            () = recheck => {
                publisher.handover.recheck_due();
                publisher.schedule.changed();
            }
        }
    }
    tracing::info!("resourceslice publisher stopped");
}

/// The loop's state between reconciles.
struct Publisher<'c, A> {
    api: A,
    config: &'c PublisherConfig,
    /// The watch's view of the node's slices, every driver.
    store: Store<ResourceSlice>,
    schedule: Schedule,
    own: OwnWrites,
    taints: TaintSupport,
    clash_report: ClashReport,
    handover: Handover,
    /// Recomputed (and its validation issues counted) only when the devices,
    /// the taint support or the withheld devices change; `None`: due.
    desired: Option<DesiredPool>,
}

impl<'c, A: PoolApi + Sync> Publisher<'c, A> {
    fn new(api: A, config: &'c PublisherConfig, store: Store<ResourceSlice>) -> Self {
        Self {
            api,
            config,
            store,
            schedule: Schedule::new(config.backoff),
            own: OwnWrites::default(),
            taints: TaintSupport::default(),
            clash_report: ClashReport::default(),
            handover: Handover::default(),
            desired: None,
        }
    }

    fn devices_changed(&mut self) {
        self.desired = None;
        self.schedule.changed();
    }

    fn watch_event(&mut self, event: &Event<ResourceSlice>) {
        self.schedule.watch_event(event);
        match event {
            Event::Apply(s) | Event::InitApply(s) => self.own.observe(s, false),
            Event::Delete(s) => self.own.observe(s, true),
            Event::Init | Event::InitDone => {}
        }
    }

    fn failed(&mut self) {
        let delay = self.schedule.failed(Instant::now());
        tracing::warn!(
            retry_in_ms = delay.as_millis() as u64,
            "resourceslice sync failed; will retry"
        );
    }

    /// One round: read back what is due, find clashes, compute the actions
    /// on the view with our own writes, apply them.
    async fn reconcile(&mut self, devices: &watch::Receiver<PoolContent>) {
        let config = self.config;
        let metrics = &config.metrics;
        let seen = self.store.state();
        if check_unsettled(&self.api, &mut self.own, &seen, metrics)
            .await
            .is_err()
        {
            self.failed();
            return;
        }
        self.own.settle(&seen);
        let view = self.own.view(&seen);
        let on_node: Vec<&ResourceSlice> = view.iter().collect();
        let own = own_slices(on_node.clone(), &config.driver_name, &config.node_name);
        let key = config.stamp_key();
        if self
            .handover
            .must_yield(own.iter().copied(), &key, &config.instance, &config.alive)
        {
            // The pool is published, by the newer instance: ready.
            config.published.send_replace(true);
            return;
        }
        let clashes = find_clashes(
            &config.driver_name,
            &config.node_name,
            &on_node,
            &devices.borrow().devices,
            config.foreign,
        );
        for (source, devs) in self.clash_report.update(&clashes, config) {
            node_event(&self.api, config, &source, &devs, clashes.pool_withdrawn()).await;
        }
        let withheld = Withheld::of(&clashes);
        if withheld != self.clash_report.withheld {
            self.clash_report.withheld = withheld;
            self.desired = None;
        }
        let pool = self.desired.get_or_insert_with(|| {
            config.desired(
                &devices.borrow(),
                self.taints.supported(),
                &self.clash_report.withheld,
            )
        });
        let observed: Vec<ResourceSlice> = own.into_iter().cloned().collect();
        let actions = reconcile(&observed, &pool.slices);
        let device_count = pool.device_count;
        match apply(&self.api, actions, &mut self.own, metrics).await {
            Applied::Done { taints_dropped }
                if self
                    .taints
                    .after_writes(taints_dropped, &metrics.taints_dropped) =>
            {
                self.desired = None;
                self.schedule.changed();
            }
            Applied::Done { .. } => {
                self.schedule.succeeded();
                metrics
                    .published_devices
                    .set(i64::try_from(device_count).unwrap_or(i64::MAX));
                metrics.last_success.set(unix_now());
                config.published.send_replace(true);
            }
            Applied::ReadBack => self.schedule.changed(),
            Applied::Failed => self.failed(),
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod fake_api;
#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod surge_tests;
#[cfg(test)]
mod tests;
