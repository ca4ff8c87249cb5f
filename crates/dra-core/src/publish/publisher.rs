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
//! our driver name), logs and reports each clash once when it starts (a
//! warning, the `aws_dra_publish_withheld_devices` gauge, a Node event) and when it
//! ends. Watching the node's slices of all drivers costs no extra API call:
//! it is the same single watch with a wider selector, and a node carries a
//! handful of slices. API
//! errors are retried with capped exponential backoff and jitter: writes
//! from 1 s up to 2 min, the watch from 0.5 s up to 5 s
//! ([`BackoffConfig::WATCH`]). After an API server outage the watch's first
//! event cuts a write's grown backoff short, so the pool is repaired within
//! seconds of the server's return, not at the end of the backoff. The task only
//! awaits the API server and its inputs, so it never blocks the kubelet-facing
//! part of the process; it ends when `shutdown` completes.
//!
//! An API server whose `DRADeviceTaints` gate is off (1.34, 1.35 by
//! default) drops device `taints` on write without an error. Comparing what
//! it wrote with what it reads back would then find drift after every
//! write, forever. So the publisher looks at what each write returned: when
//! the taints it sent are gone, it logs that once and publishes without
//! taints from then on (health still reaches kubelet's health stream).
//!
//! After its own writes it waits (bounded by [`WRITE_SETTLE_TIMEOUT`]) until
//! the watch has delivered them, so a reconcile never runs on a store that does
//! not yet contain our last write: that would cause needless conflicts.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;
use tokio::time::Instant;

use super::backoff::{Backoff, BackoffConfig, WatchBackoff};
use super::clash::{
    ClashSource, Clashes, FIELD_MANAGER, FOREIGN_PUBLISHERS, ForeignIdentity, find_clashes,
    own_slices,
};
use super::desired::{DesiredPool, NodeOwner, PoolContent, desired_pool_with_counters};
use super::reconcile::{SliceAction, reconcile};
use super::validate::{is_dns_subdomain, log_issues};
use crate::scan::taints::{any_tainted, without_taints};

/// Longest wait for the watch to show our own writes before reconciling anyway.
pub(crate) const WRITE_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Invalid publisher configuration.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum PublisherConfigError {
    /// Driver name is not a DNS subdomain of at most 63 characters.
    #[error("driver name {0:?} must be a DNS subdomain of at most 63 characters")]
    InvalidDriverName(String),
    /// Node name is not a DNS subdomain.
    #[error("node name {0:?} must be a DNS subdomain of at most 253 characters")]
    InvalidNodeName(String),
}

/// Metrics of the publisher, registered once per process.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PublishMetrics {
    /// `aws_dra_publish_pool_devices`: devices in the pool after the last successful sync.
    pub published_devices: IntGauge,
    /// `aws_dra_publish_errors_total{operation}`: failed API calls
    /// (`create`/`update`/`delete`/`watch`).
    pub publish_errors: IntCounterVec,
    /// `aws_dra_publish_last_success_timestamp_seconds`: Unix time of the last
    /// reconcile that left the pool in sync (written or already equal).
    pub last_success: Gauge,
    /// `aws_dra_publish_slice_writes_total{operation}`: successful slice writes.
    pub slice_writes: IntCounterVec,
    /// `aws_dra_publish_validation_issues_total{action,reason}`: attributes or
    /// devices dropped/shortened by validation.
    pub validation_issues: IntCounterVec,
    /// `aws_dra_publish_taints_dropped`: 1 once the API server was seen dropping
    /// device taints (publishing continues without them).
    pub taints_dropped: IntGauge,
    /// `aws_dra_publish_withheld_devices{other_driver}`: our devices not published
    /// because that driver already publishes them on this node
    /// (`publish::clash`); 0 once the clash is over. Named with the project
    /// prefix, not kubelet's `dra_`.
    pub withheld_devices: IntGaugeVec,
}

impl PublishMetrics {
    /// Creates the metrics and registers them in `registry`.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            published_devices: IntGauge::new(
                "aws_dra_publish_pool_devices",
                "Devices in the node's ResourceSlice pool after the last successful sync.",
            )?,
            publish_errors: IntCounterVec::new(
                Opts::new(
                    "aws_dra_publish_errors_total",
                    "Failed ResourceSlice API calls, by operation.",
                ),
                &["operation"],
            )?,
            last_success: Gauge::new(
                "aws_dra_publish_last_success_timestamp_seconds",
                "Unix time of the last reconcile that left the pool in sync.",
            )?,
            slice_writes: IntCounterVec::new(
                Opts::new(
                    "aws_dra_publish_slice_writes_total",
                    "Successful ResourceSlice writes, by operation.",
                ),
                &["operation"],
            )?,
            validation_issues: IntCounterVec::new(
                Opts::new(
                    "aws_dra_publish_validation_issues_total",
                    "Attributes, capacities or devices dropped or shortened to meet API limits.",
                ),
                &["action", "reason"],
            )?,
            taints_dropped: IntGauge::new(
                "aws_dra_publish_taints_dropped",
                "1 once the API server dropped the device taints the driver wrote (DRADeviceTaints off).",
            )?,
            withheld_devices: IntGaugeVec::new(
                Opts::new(
                    "aws_dra_publish_withheld_devices",
                    "Devices not published because another driver already publishes them on this node, by that driver.",
                ),
                &["other_driver"],
            )?,
        };
        registry.register(Box::new(m.published_devices.clone()))?;
        registry.register(Box::new(m.publish_errors.clone()))?;
        registry.register(Box::new(m.last_success.clone()))?;
        registry.register(Box::new(m.slice_writes.clone()))?;
        registry.register(Box::new(m.validation_issues.clone()))?;
        registry.register(Box::new(m.taints_dropped.clone()))?;
        registry.register(Box::new(m.withheld_devices.clone()))?;
        Ok(m)
    }
}

/// What the publisher publishes, for whom.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PublisherConfig {
    driver_name: String,
    node_name: String,
    node_owner: Option<NodeOwner>,
    /// Retry timing for failed writes.
    pub(crate) backoff: BackoffConfig,
    /// Reconnect timing of the watch ([`BackoffConfig::WATCH`]).
    pub(crate) watch_backoff: BackoffConfig,
    /// Where the publisher reports.
    pub metrics: PublishMetrics,
    /// Other drivers whose devices are matched to ours by PCI address
    /// ([`FOREIGN_PUBLISHERS`] unless changed).
    pub(crate) foreign: &'static [ForeignIdentity],
    /// Set once the node's slices are in the API server as desired (the
    /// first successful reconcile); [`PublisherConfig::published`] hands
    /// out receivers. The readiness gate waits on it.
    published: watch::Sender<bool>,
}

impl PublisherConfig {
    /// Checks the names; `node_owner` is the Node for the owner reference
    /// (see `publish::node::node_owner`); without it slices are not
    /// garbage-collected with the Node.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new(
        driver_name: &str,
        node_name: &str,
        node_owner: Option<NodeOwner>,
        metrics: PublishMetrics,
    ) -> Result<Self, PublisherConfigError> {
        if driver_name.len() > 63 || !is_dns_subdomain(driver_name) {
            return Err(PublisherConfigError::InvalidDriverName(
                driver_name.to_owned(),
            ));
        }
        if !is_dns_subdomain(node_name) {
            return Err(PublisherConfigError::InvalidNodeName(node_name.to_owned()));
        }
        Ok(Self {
            driver_name: driver_name.to_owned(),
            node_name: node_name.to_owned(),
            node_owner,
            backoff: BackoffConfig::default(),
            watch_backoff: BackoffConfig::WATCH,
            metrics,
            foreign: FOREIGN_PUBLISHERS,
            published: watch::channel(false).0,
        })
    }

    /// Becomes `true` once the publisher has published the node's slices
    /// (reconciled them once), and stays so.
    pub(crate) fn published(&self) -> watch::Receiver<bool> {
        self.published.subscribe()
    }

    /// The field selector of the watch: every driver's slices on the node,
    /// ours to reconcile, the others to find clashes.
    pub(crate) fn field_selector(&self) -> String {
        format!("spec.nodeName={}", self.node_name)
    }

    /// The watch of the node's slices. Its lists (at start and after a
    /// watch is lost) are served from the API server's watch cache
    /// (`resourceVersion=0`), as client-go's informers list: a list of the
    /// latest version may go to etcd, which cannot filter by node, so each
    /// node's list read every slice of the fleet (quadratic in the fleet:
    /// at 500 trn2 nodes with cores, ~12 MB per list and etcd at 11.6 GB
    /// before the machine ran out of memory). A cached list can be a
    /// moment old; the watch that follows brings it up to date, and a
    /// write from a stale view is refused by its precondition and retried.
    /// Unpaged: kube drops `resourceVersion=0` from a list that has a
    /// limit (the server would ignore the limit there anyway), which would
    /// make it a read of the latest version again; a node's own slices are
    /// a handful.
    pub(crate) fn watch_config(&self) -> watcher::Config {
        let mut config = watcher::Config::default()
            .fields(&self.field_selector())
            .any_semantic();
        config.page_size = None;
        config
    }

    /// The desired pool for `content` less the devices in `withheld`; no
    /// slice at all when the pool is withdrawn (another writer uses our
    /// driver and pool name: even an empty slice of ours would join its pool).
    fn desired(
        &self,
        content: &PoolContent,
        taints_supported: bool,
        withheld: &Withheld,
    ) -> DesiredPool {
        if withheld.pool {
            return DesiredPool {
                slices: Vec::new(),
                issues: Vec::new(),
                device_count: 0,
            };
        }
        let kept: Vec<_> = content
            .devices
            .iter()
            .filter(|d| !withheld.devices.contains(&d.name))
            .cloned()
            .collect();
        let devices = if taints_supported {
            kept
        } else {
            without_taints(&kept)
        };
        let devices = &devices;
        let pool = desired_pool_with_counters(
            &self.driver_name,
            &self.node_name,
            self.node_owner.as_ref(),
            devices,
            &content.counter_sets,
        );
        log_issues(&pool.issues);
        for issue in &pool.issues {
            self.metrics
                .validation_issues
                .with_label_values(&[issue.action.as_str(), issue.reason.as_str()])
                .inc();
        }
        pool
    }
}

/// Runs the publisher until `shutdown` completes. Spawn it as its own task.
/// If the sender of `devices` goes away the last devices stay published.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub async fn run(
    client: kube::Client,
    config: PublisherConfig,
    mut devices: watch::Receiver<PoolContent>,
    shutdown: impl Future<Output = ()>,
) {
    let events_api: Api<CoreEvent> = Api::namespaced(client.clone(), NODE_EVENT_NAMESPACE);
    let api: Api<ResourceSlice> = Api::all(client);
    let (store, writer) = reflector::store();
    let watch_config = config.watch_config();
    let events = reflector(writer, watcher::watcher(api.clone(), watch_config))
        .backoff(WatchBackoff::new(config.watch_backoff));
    let mut events = std::pin::pin!(events);
    let mut shutdown = std::pin::pin!(shutdown);

    let mut taints_supported = true;
    // Recomputed (and its validation issues counted) only when the devices,
    // the taint support or the withheld devices change; `None`: due.
    let mut desired: Option<DesiredPool> = None;
    devices.borrow_and_update();
    let mut clash_report = ClashReport::default();
    let mut devices_open = true;
    let mut synced = false;
    let mut dirty = true;
    let mut backoff = Backoff::new(config.backoff);
    let mut retry_at: Option<Instant> = None;
    // The watch failed and has not delivered anything since: the API server
    // may be gone. Its next event says the server is back.
    let mut watch_failed = false;
    let mut pending = PendingWrites::default();
    let metrics = &config.metrics;
    tracing::info!(node = %config.node_name, driver = %config.driver_name, "resourceslice publisher started");

    'publish: loop {
        let now = Instant::now();
        if pending.expired(now) {
            pending.clear();
        }
        if dirty && synced && retry_at.is_none() && pending.is_empty() {
            dirty = false;
            let snapshot = store.state();
            let on_node: Vec<&ResourceSlice> = snapshot.iter().map(|s| &**s).collect();
            let clashes = find_clashes(
                &config.driver_name,
                &config.node_name,
                &on_node,
                &devices.borrow().devices,
                config.foreign,
            );
            let started = clash_report.update(&clashes, &config);
            for (source, devs) in started {
                tokio::select! {
                    () = node_event(&events_api, &config, &source, &devs, clashes.pool_withdrawn()) => {}
                    () = &mut shutdown => break 'publish,
                }
            }
            let withheld = Withheld::of(&clashes);
            if withheld != clash_report.withheld {
                clash_report.withheld = withheld;
                desired = None;
            }
            let pool = desired.get_or_insert_with(|| {
                config.desired(&devices.borrow(), taints_supported, &clash_report.withheld)
            });
            let observed: Vec<ResourceSlice> =
                own_slices(on_node, &config.driver_name, &config.node_name)
                    .into_iter()
                    .cloned()
                    .collect();
            let actions = reconcile(&observed, &pool.slices);
            let device_count = pool.device_count;
            let applied = tokio::select! {
                r = apply(&api, actions, &mut pending, metrics) => r,
                () = &mut shutdown => break,
            };
            match applied {
                Ok(Applied {
                    taints_dropped: true,
                }) if taints_supported => {
                    taints_supported = false;
                    tracing::warn!(
                        "the API server dropped the device taints we wrote (DRADeviceTaints is off); \
                         publishing without taints from now on, health still reaches kubelet"
                    );
                    metrics.taints_dropped.set(1);
                    desired = None;
                    dirty = true;
                }
                Ok(_) => {
                    backoff.reset();
                    metrics
                        .published_devices
                        .set(i64::try_from(device_count).unwrap_or(i64::MAX));
                    metrics.last_success.set(unix_now());
                    config.published.send_replace(true);
                }
                Err(()) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(
                        retry_in_ms = delay.as_millis() as u64,
                        "resourceslice sync failed; will retry"
                    );
                    retry_at = Some(Instant::now() + delay);
                }
            }
            continue;
        }

        let retry = sleep_until_opt(retry_at);
        let settle = sleep_until_opt(pending.deadline());
        tokio::select! {
            () = &mut shutdown => break,
            changed = devices.changed(), if devices_open => match changed {
                Ok(()) => {
                    devices.borrow_and_update();
                    desired = None;
                    dirty = true;
                }
                Err(_) => {
                    devices_open = false;
                    tracing::warn!("device source closed; keeping the last published devices");
                }
            },
            event = events.next() => match event {
                Some(Ok(event)) => {
                    if std::mem::take(&mut watch_failed) && retry_at.is_some() {
                        // A write failed while the server was away and waits
                        // out a backoff that grew during the outage: the
                        // watch answering again means the server is back, so
                        // write now.
                        tracing::info!("resourceslice watch is back; retrying the failed write now");
                        backoff.reset();
                        retry_at = None;
                        dirty = true;
                    }
                    watch_event(event, &mut synced, &mut pending, &mut dirty);
                }
                Some(Err(error)) => {
                    watch_failed = true;
                    metrics.publish_errors.with_label_values(&["watch"]).inc();
                    tracing::warn!(%error, "resourceslice watch failed; retrying with backoff");
                }
                None => {
                    // The watcher stream does not end on its own; if it did, the
                    // publisher can no longer see drift. Say so loudly.
                    tracing::error!("resourceslice watch ended; publisher stops");
                    break;
                }
            },
            () = retry => {
                retry_at = None;
                dirty = true;
            }
            () = settle => pending.clear(),
        }
    }
    tracing::info!("resourceslice publisher stopped");
}

/// Every create and update names our field manager: the mark by which
/// [`super::clash::is_ours`] knows our slices.
fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    }
}

/// Where Node events go: the namespace kubelet uses for its own Node events
/// (a Node has none; `kubectl describe node` finds them there).
pub(crate) const NODE_EVENT_NAMESPACE: &str = "default";

/// Reason of the Node event when a clash starts.
pub(crate) const CLASH_EVENT_REASON: &str = "DevicesPublishedByAnotherDriver";

/// Longest wait for the Node event's create: the event is a courtesy, the
/// pool must not wait for it.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Most device names spelled out in a log line or an event message.
const NAMES_SHOWN: usize = 16;

/// The devices the desired pool leaves out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Withheld {
    /// The whole pool: another writer uses our driver name.
    pool: bool,
    devices: BTreeSet<String>,
}

impl Withheld {
    fn of(clashes: &Clashes) -> Self {
        Withheld {
            pool: clashes.pool_withdrawn(),
            devices: clashes.withheld.keys().cloned().collect(),
        }
    }
}

/// The clashes seen so far, so that each is logged and reported once.
#[derive(Debug, Default)]
struct ClashReport {
    active: BTreeMap<ClashSource, BTreeSet<String>>,
    /// Every `other_driver` label set so far, so that an ended clash reads 0.
    labels: BTreeSet<String>,
    withheld: Withheld,
}

impl ClashReport {
    /// Takes the new clashes in: logs each one that started (or now takes
    /// more of our devices) and each one that ended, sets the gauge, and
    /// returns the started ones (for the Node event).
    fn update(
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
async fn node_event(
    api: &Api<CoreEvent>,
    config: &PublisherConfig,
    source: &ClashSource,
    devices: &BTreeSet<String>,
    pool_withdrawn: bool,
) {
    let event = clash_event(config, source, devices, pool_withdrawn, Timestamp::now());
    match tokio::time::timeout(EVENT_TIMEOUT, api.create(&PostParams::default(), &event)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::warn!(%error, "could not create the Node event of the clash"),
        Err(_) => tracing::warn!("creating the Node event of the clash timed out"),
    }
}

fn clash_event(
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
    let node = &config.node_name;
    CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}.")),
            namespace: Some(NODE_EVENT_NAMESPACE.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.clone()),
            uid: config.node_owner.as_ref().map(|o| o.uid.clone()),
            ..Default::default()
        },
        reason: Some(CLASH_EVENT_REASON.into()),
        message: Some(what),
        type_: Some("Warning".into()),
        action: Some("WithholdDevices".into()),
        source: Some(EventSource {
            component: Some(config.driver_name.clone()),
            host: Some(node.clone()),
        }),
        reporting_component: Some(config.driver_name.clone()),
        reporting_instance: Some(node.clone()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Default::default()
    }
}

/// What one watch event changes in the loop's state.
fn watch_event(
    event: Event<ResourceSlice>,
    synced: &mut bool,
    pending: &mut PendingWrites,
    dirty: &mut bool,
) {
    match event {
        Event::InitDone => {
            // A fresh list is authoritative: it contains our writes.
            *synced = true;
            pending.clear();
            *dirty = true;
        }
        Event::Apply(s) => {
            pending.observe(&s, false);
            *dirty = true;
        }
        Event::Delete(s) => {
            pending.observe(&s, true);
            *dirty = true;
        }
        Event::Init | Event::InitApply(_) => {}
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

/// What a successful [`apply`] learnt.
#[derive(Debug, Default)]
struct Applied {
    /// A write sent device taints and the stored object has none.
    taints_dropped: bool,
}

/// Did the API server drop the taints of `sent` in what it `stored`?
fn taints_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    let devices = |s: &ResourceSlice| s.spec.devices.clone().unwrap_or_default();
    any_tainted(&devices(sent)) && !any_tainted(&devices(stored))
}

/// Applies actions in order, stopping at the first failure (the next
/// reconcile recomputes from what the watch shows). Logs one line per action.
async fn apply(
    api: &Api<ResourceSlice>,
    actions: Vec<SliceAction>,
    pending: &mut PendingWrites,
    metrics: &PublishMetrics,
) -> Result<Applied, ()> {
    let mut applied = Applied::default();
    for action in actions {
        let verb = action.verb();
        let name = action.slice_name().to_owned();
        let (generation, devices) = match &action {
            SliceAction::Create(s) | SliceAction::Update(s) => (
                s.spec.pool.generation,
                s.spec.devices.as_ref().map_or(0, Vec::len),
            ),
            SliceAction::Delete { .. } => (0, 0),
        };
        let result = match action {
            SliceAction::Create(s) => api.create(&write_params(), &s).await.map(|stored| {
                applied.taints_dropped |= taints_dropped(&s, &stored);
                pending.wrote(&stored)
            }),
            SliceAction::Update(s) => api.replace(&name, &write_params(), &s).await.map(|stored| {
                applied.taints_dropped |= taints_dropped(&s, &stored);
                pending.wrote(&stored)
            }),
            SliceAction::Delete { name, uid } => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => {
                        pending.deleted(&name, uid);
                        Ok(())
                    }
                    // Already gone: that is what we wanted.
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        };
        match result {
            Ok(()) => {
                metrics.slice_writes.with_label_values(&[verb]).inc();
                tracing::info!(action = verb, slice = %name, generation, devices, "resourceslice written");
            }
            Err(error) => {
                metrics.publish_errors.with_label_values(&[verb]).inc();
                tracing::warn!(action = verb, slice = %name, %error, "resourceslice write failed");
                return Err(());
            }
        }
    }
    Ok(applied)
}

/// Our own writes that the watch has not delivered yet.
#[derive(Debug, Default)]
struct PendingWrites {
    entries: Vec<PendingWrite>,
    deadline: Option<Instant>,
}

#[derive(Debug, PartialEq)]
enum PendingWrite {
    /// Created or updated: waiting for an event with at least this version.
    Written {
        name: String,
        resource_version: Option<u64>,
    },
    /// Deleted: waiting for the delete event of this UID.
    Deleted { name: String, uid: Option<String> },
}

impl PendingWrites {
    fn wrote(&mut self, s: &ResourceSlice) {
        self.push(PendingWrite::Written {
            name: s.metadata.name.clone().unwrap_or_default(),
            resource_version: s
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok()),
        });
    }

    fn deleted(&mut self, name: &str, uid: Option<String>) {
        self.push(PendingWrite::Deleted {
            name: name.to_owned(),
            uid,
        });
    }

    fn push(&mut self, w: PendingWrite) {
        self.deadline
            .get_or_insert_with(|| Instant::now() + WRITE_SETTLE_TIMEOUT);
        self.entries.push(w);
    }

    /// Crosses off what a watch event proves has been seen.
    fn observe(&mut self, s: &ResourceSlice, is_delete: bool) {
        let name = s.metadata.name.as_deref().unwrap_or("");
        let rv: Option<u64> = s
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok());
        self.entries.retain(|w| match w {
            PendingWrite::Written {
                name: n,
                resource_version,
            } => {
                // Versions are opaque in theory; when either is not a number,
                // any event for the name counts as "caught up".
                !(n == name
                    && match (rv, resource_version) {
                        (Some(seen), Some(wrote)) => seen >= *wrote,
                        _ => true,
                    })
            }
            PendingWrite::Deleted { name: n, uid } => {
                let same_object = uid.is_none() || uid.as_deref() == s.metadata.uid.as_deref();
                // Deleted when the delete event arrives, or when the name is
                // back with another UID (someone recreated it).
                !(n == name && (is_delete && same_object || !is_delete && !same_object))
            }
        });
        if self.entries.is_empty() {
            self.deadline = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::Device;

    #[test]
    fn dropped_taints_are_noticed() {
        use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSliceSpec};
        let slice = |tainted: bool| ResourceSlice {
            spec: ResourceSliceSpec {
                devices: Some(vec![Device {
                    name: "d".into(),
                    taints: tainted.then(|| {
                        vec![DeviceTaint {
                            key: "x.example.com/y".into(),
                            effect: "NoSchedule".into(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(taints_dropped(&slice(true), &slice(false)));
        assert!(!taints_dropped(&slice(true), &slice(true)));
        assert!(!taints_dropped(&slice(false), &slice(false)));
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(name: &str, uid: &str, rv: &str) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn pending_writes_wait_for_own_versions() {
        let mut p = PendingWrites::default();
        p.wrote(&slice("a", "u1", "10"));
        p.deleted("b", Some("u2".into()));
        assert!(!p.is_empty());
        assert!(p.deadline().is_some());
        p.observe(&slice("a", "u1", "9"), false); // older event still in flight
        p.observe(&slice("c", "u3", "11"), false); // unrelated
        assert_eq!(p.entries.len(), 2);
        p.observe(&slice("a", "u1", "10"), false);
        assert_eq!(
            p.entries,
            vec![PendingWrite::Deleted {
                name: "b".into(),
                uid: Some("u2".into())
            }]
        );
        p.observe(&slice("b", "u2", "12"), false); // an update of the old object is not the delete
        assert!(!p.is_empty());
        p.observe(&slice("b", "u2", "13"), true);
        assert!(p.is_empty());
        assert_eq!(p.deadline(), None);
    }

    #[test]
    fn pending_delete_satisfied_by_recreate_and_opaque_versions() {
        let mut p = PendingWrites::default();
        p.deleted("b", Some("u2".into()));
        p.observe(&slice("b", "u9", "20"), false);
        assert!(p.is_empty());
        p.wrote(&slice("a", "u1", "not-a-number"));
        p.observe(&slice("a", "u1", "5"), false);
        assert!(p.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn pending_writes_expire() {
        let mut p = PendingWrites::default();
        p.wrote(&slice("a", "u1", "10"));
        assert!(!p.expired(Instant::now()));
        tokio::time::advance(WRITE_SETTLE_TIMEOUT).await;
        assert!(p.expired(Instant::now()));
    }

    #[test]
    fn config_checks_names_and_builds_selector() {
        let reg = Registry::new();
        let metrics = PublishMetrics::register(&reg).expect("register");
        let c = PublisherConfig::new(
            "efa.networking.k8s.aws",
            "ip-10-0-0-1.ec2.internal",
            None,
            metrics.clone(),
        )
        .expect("valid");
        // Every driver on the node: ours to reconcile, the others for clashes.
        assert_eq!(c.field_selector(), "spec.nodeName=ip-10-0-0-1.ec2.internal");
        let watch = c.watch_config();
        assert_eq!(
            watch.field_selector.as_deref(),
            Some("spec.nodeName=ip-10-0-0-1.ec2.internal")
        );
        // Lists from the watch cache, never a quorum read from etcd: the
        // request carries resourceVersion=0 only without a limit.
        assert_eq!(watch.list_semantic, watcher::ListSemantic::Any);
        assert_eq!(watch.page_size, None);
        let list = |limit| {
            let params = kube::api::ListParams {
                resource_version: Some("0".into()),
                limit,
                ..Default::default()
            };
            kube::core::Request::new("/apis/resource.k8s.io/v1/resourceslices")
                .list(&params)
                .expect("list request")
                .uri()
                .to_string()
        };
        assert!(list(None).contains("resourceVersion=0"), "{}", list(None));
        assert!(
            !list(Some(500)).contains("resourceVersion"),
            "{}",
            list(Some(500))
        );
        assert!(matches!(
            PublisherConfig::new("Bad_Driver", "n", None, metrics.clone()),
            Err(PublisherConfigError::InvalidDriverName(d)) if d == "Bad_Driver"
        ));
        assert!(matches!(
            PublisherConfig::new(
                &format!("{}.io", "a".repeat(61)),
                "n",
                None,
                metrics.clone()
            ),
            Err(PublisherConfigError::InvalidDriverName(_))
        ));
        assert!(matches!(
            PublisherConfig::new("d.io", "Node_1", None, metrics),
            Err(PublisherConfigError::InvalidNodeName(_))
        ));
        // Registering twice in one registry is refused, not silently shared.
        assert!(PublishMetrics::register(&reg).is_err());
    }

    #[test]
    fn desired_counts_validation_issues() {
        let reg = Registry::new();
        let metrics = PublishMetrics::register(&reg).expect("register");
        let c = PublisherConfig::new("d.io", "n", None, metrics.clone()).expect("valid");
        let pool = c.desired(
            &PoolContent::devices(vec![
                Device {
                    name: "BAD".into(),
                    ..Default::default()
                },
                Device {
                    name: "ok".into(),
                    ..Default::default()
                },
            ]),
            true,
            &Withheld::default(),
        );
        assert_eq!(pool.device_count, 1);
        assert_eq!(
            metrics
                .validation_issues
                .with_label_values(&["device_dropped", "invalid_device_name"])
                .get(),
            1
        );
    }

    fn efa_device(name: &str, bdf: &str) -> Device {
        use k8s_openapi::api::resource::v1::DeviceAttribute;
        Device {
            name: name.into(),
            attributes: Some(
                [(
                    crate::publish::clash::PCI_BUS_ID.to_string(),
                    DeviceAttribute {
                        string: Some(bdf.into()),
                        ..Default::default()
                    },
                )]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn withheld_devices_leave_the_pool_and_a_withdrawn_pool_has_no_slice() {
        let reg = Registry::new();
        let metrics = PublishMetrics::register(&reg).expect("register");
        let c = PublisherConfig::new("efa.networking.k8s.aws", "n", None, metrics).expect("valid");
        let content = PoolContent::devices(vec![
            efa_device("efa-a", "0000:10:1b.0"),
            efa_device("efa-b", "0000:20:1b.0"),
        ]);
        let some = Withheld {
            pool: false,
            devices: BTreeSet::from(["efa-a".to_string()]),
        };
        let pool = c.desired(&content, true, &some);
        let names: Vec<&str> = pool
            .slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["efa-b"]);
        assert_eq!(pool.device_count, 1);
        // Every device withheld but the pool ours: an empty pool, one slice.
        let all = Withheld {
            pool: false,
            devices: BTreeSet::from(["efa-a".to_string(), "efa-b".to_string()]),
        };
        assert_eq!(c.desired(&content, true, &all).slices.len(), 1);
        let withdrawn = Withheld {
            pool: true,
            devices: all.devices.clone(),
        };
        let pool = c.desired(&content, true, &withdrawn);
        assert!(pool.slices.is_empty());
        // ... which reconcile turns into deleting our slices, and only ours.
        let ours = c.desired(&content, true, &Withheld::default()).slices;
        let actions = reconcile(&ours, &pool.slices);
        assert!(actions.iter().all(|a| a.verb() == "delete"));
        assert_eq!(actions.len(), ours.len());
    }

    fn dranet_slice(name: &str, bdfs: &[&str]) -> ResourceSlice {
        use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSliceSpec};
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "dra.net".into(),
                node_name: Some("n".into()),
                devices: Some(
                    bdfs.iter()
                        .map(|b| Device {
                            name: format!("pci-{}", b.replace([':', '.'], "-")),
                            attributes: Some(
                                [(
                                    "dra.net/pciAddress".to_string(),
                                    DeviceAttribute {
                                        string: Some((*b).into()),
                                        ..Default::default()
                                    },
                                )]
                                .into(),
                            ),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        }
    }

    #[test]
    fn each_clash_is_reported_once_and_the_gauge_clears() {
        let reg = Registry::new();
        let metrics = PublishMetrics::register(&reg).expect("register");
        let c = PublisherConfig::new("efa.networking.k8s.aws", "n", None, metrics.clone())
            .expect("valid");
        let ours = vec![
            efa_device("efa-a", "0000:10:1b.0"),
            efa_device("efa-b", "0000:20:1b.0"),
        ];
        let gauge = || {
            metrics
                .withheld_devices
                .with_label_values(&["dra.net"])
                .get()
        };
        let mut report = ClashReport::default();
        let clashes = |slices: &[ResourceSlice]| {
            let refs: Vec<&ResourceSlice> = slices.iter().collect();
            find_clashes(
                c.driver_name.as_str(),
                "n",
                &refs,
                &ours,
                FOREIGN_PUBLISHERS,
            )
        };
        // (slices on the node, clashes reported as started, gauge after)
        let steps: Vec<(Vec<ResourceSlice>, usize, i64)> = vec![
            (vec![], 0, 0),
            (vec![dranet_slice("d", &["0000:10:1b.0"])], 1, 1),
            // The same clash again (any watch event): not reported again.
            (vec![dranet_slice("d", &["0000:10:1b.0"])], 0, 1),
            // It takes one more device of ours: reported, with both.
            (
                vec![dranet_slice("d", &["0000:10:1b.0", "0000:20:1b.0"])],
                1,
                2,
            ),
            // Shrinks: nothing new to say.
            (vec![dranet_slice("d", &["0000:20:1b.0"])], 0, 1),
            // Gone: the gauge reads 0, not a stale value.
            (vec![], 0, 0),
            // Back: a new clash.
            (vec![dranet_slice("d", &["0000:20:1b.0"])], 1, 1),
        ];
        for (i, (slices, want_started, want_gauge)) in steps.into_iter().enumerate() {
            let started = report.update(&clashes(&slices), &c);
            assert_eq!(started.len(), want_started, "step {i}");
            assert_eq!(gauge(), want_gauge, "step {i}");
        }
        let text = {
            use prometheus::Encoder;
            let mut buf = Vec::new();
            prometheus::TextEncoder::new()
                .encode(&reg.gather(), &mut buf)
                .expect("encode");
            String::from_utf8(buf).expect("utf8")
        };
        assert!(
            text.contains("aws_dra_publish_withheld_devices{other_driver=\"dra.net\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn the_node_event_names_the_other_driver_and_the_devices() {
        let reg = Registry::new();
        let metrics = PublishMetrics::register(&reg).expect("register");
        let owner = NodeOwner {
            name: "n".into(),
            uid: "node-uid".into(),
        };
        let c = PublisherConfig::new("efa.networking.k8s.aws", "n", Some(owner), metrics)
            .expect("valid");
        let source = ClashSource {
            driver: "dra.net".into(),
            slice: "n-dra.net-abcde".into(),
        };
        let devices: BTreeSet<String> = (0..20).map(|i| format!("efa-{i:02}")).collect();
        let e = clash_event(&c, &source, &devices, false, Timestamp::UNIX_EPOCH);
        assert_eq!(e.reason.as_deref(), Some(CLASH_EVENT_REASON));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.metadata.namespace.as_deref(), Some(NODE_EVENT_NAMESPACE));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.name.as_deref(), Some("n"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("node-uid"));
        let message = e.message.unwrap_or_default();
        assert!(
            message.contains("dra.net")
                && message.contains("n-dra.net-abcde")
                && message.contains("efa-00")
                && message.contains("efa-15")
                && !message.contains("efa-16")
                && message.contains("and 4 more"),
            "{message}"
        );
        let withdrawn = clash_event(&c, &source, &devices, true, Timestamp::UNIX_EPOCH);
        assert!(
            withdrawn
                .message
                .unwrap_or_default()
                .contains("all efa.networking.k8s.aws devices")
        );
    }
}
