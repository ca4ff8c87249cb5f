//! What the publisher publishes and for whom ([`PublisherConfig`]), where it
//! reports ([`PublishMetrics`]), and the one computation that needs both:
//! the desired pool less the devices another driver already publishes.

use kube::runtime::watcher;
use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use super::handover::{Instance, Liveness, stamp_all, stamp_key};
use crate::publish::backoff::BackoffConfig;
use crate::publish::clash::{FOREIGN_PUBLISHERS, ForeignIdentity, Withheld};
use crate::publish::desired::{DesiredPool, NodeOwner, PoolContent, desired_pool_with_counters};
use crate::publish::validate::{is_dns_subdomain, log_issues};
use crate::scan::taints::without_taints;

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
    /// (`create`/`update`/`delete`/`get`/`watch`).
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
    pub(super) driver_name: String,
    pub(super) node_name: String,
    pub(super) node_owner: Option<NodeOwner>,
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
    pub(super) published: watch::Sender<bool>,
    /// This publisher, as its stamp on the slices names it
    /// ([`super::handover`]).
    pub(crate) instance: Instance,
    /// Whether another instance on the node still runs.
    pub(crate) alive: Liveness,
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
            instance: Instance::this_process(None),
            alive: Liveness::assume_alive(),
        })
    }

    /// Names this publisher `instance` (see [`super::handover`]) and asks
    /// `alive` whether another instance still runs.
    pub(crate) fn with_instance(mut self, instance: Instance, alive: Liveness) -> Self {
        self.instance = instance;
        self.alive = alive;
        self
    }

    /// The annotation that stamps our slices with their writer.
    pub(super) fn stamp_key(&self) -> String {
        stamp_key(&self.driver_name)
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
    pub(super) fn desired(
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
        let mut pool = desired_pool_with_counters(
            &self.driver_name,
            &self.node_name,
            self.node_owner.as_ref(),
            devices,
            &content.counter_sets,
        );
        stamp_all(&mut pool.slices, &self.stamp_key(), &self.instance);
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
