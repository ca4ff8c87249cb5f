//! One driver process: the kubelet plugin, the slice publisher and the
//! `/metrics` + `/healthz` server, started together and stopped together.
//!
//! The order matters for operators: the Node is read first ([`connect`],
//! before the first scan: owner reference, the labels a scan may use, and
//! the refusal to run beside the classic device plugin, which would hand
//! the same device out twice); then the kubelet sockets are bound, so that a
//! registration never points at a plugin that is not serving; then slices
//! are published. SIGTERM or SIGINT cancels everything; the plugin removes
//! its sockets on the way out, which is how kubelet learns it is gone. An
//! unreachable API server never stops the kubelet sockets: the publisher
//! retries with backoff while prepared claims keep working.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::daemon::client::{ClientError, kube_client};
use crate::daemon::ops::{HealthProbe, OpsError, OpsServer, Readiness};
use crate::daemon::rescan::DeviceFeeds;
use crate::kubelet::plugin::{KubeletPlugin, PluginError, PluginOptions};
use crate::kubelet::self_check::self_check;
use crate::prepare::claims::KubeClaimSource;
use crate::prepare::driver::Driver;
use crate::prepare::metrics::PluginMetrics;
use crate::publish::BackoffConfig;
use crate::publish::node::{NodeError, device_plugin_resources_present, get_node, node_owner};
use crate::publish::publisher::{self, PublishMetrics, PublisherConfig, PublisherConfigError};

/// How many times the Node is read at start before giving up (with backoff,
/// about two minutes in all): a node whose API server is down at boot should
/// come up once it is back, not crash-loop at once.
const NODE_READ_ATTEMPTS: u32 = 8;

/// What [`run`] needs to know (the runner builds it from the command line,
/// see `cli::RunCommand::runtime_options`).
#[derive(Debug, Clone)]
pub(crate) struct RuntimeOptions {
    /// e.g. `efa.networking.k8s.aws`.
    pub driver_name: String,
    /// This node; also the pool name.
    pub node_name: String,
    /// kubelet's plugin registry directory.
    pub kubelet_registrar_dir: PathBuf,
    /// kubelet's plugins directory (sockets, checkpoint under `<driver>/`).
    pub kubelet_plugins_dir: PathBuf,
    /// Where CDI specs are written.
    pub cdi_root: PathBuf,
    /// This pod's UID, for per-pod socket names; `None` for plain names.
    pub pod_uid: Option<String>,
    /// Listen address of `/metrics`, `/healthz`, `/readyz`.
    pub metrics_address: SocketAddr,
    /// Explicit kubeconfig; `None`: in-cluster, then the default kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// Start even beside the classic device plugin.
    pub allow_device_plugin_coexistence: bool,
    /// Extended resources that the classic device plugin advertises for the
    /// same hardware, e.g. `["vpc.amazonaws.com/efa"]`.
    pub device_plugin_resources: &'static [&'static str],
    /// Where the driver registered its own metrics; the runtime adds its
    /// own and serves them all on `/metrics`.
    pub metrics: Registry,
    /// How long a prepare waits for a held device's release (see
    /// [`PluginOptions::device_release_wait`]).
    pub device_release_wait: std::time::Duration,
    /// Node label keys the driver manages ([`crate::publish::node_labels`]); empty:
    /// the Node is never written.
    pub managed_node_labels: &'static [&'static str],
    /// Device attributes files in containers (on/off, host directory).
    pub device_attributes: crate::prepare::attributes_file::AttributeFiles,
}

/// The API server connection and this node's Node as read at start-up.
pub(crate) struct Cluster {
    pub client: kube::Client,
    pub node: Node,
}

impl Cluster {
    /// The Node's labels.
    pub(crate) fn node_labels(&self) -> std::collections::BTreeMap<String, String> {
        self.node.metadata.labels.clone().unwrap_or_default()
    }
}

/// Connects and reads the Node (retried with backoff), refusing to go on
/// beside the classic device plugin of the same hardware.
pub(crate) async fn connect(options: &RuntimeOptions) -> Result<Cluster, RuntimeError> {
    let client = kube_client(options.kubeconfig.as_deref()).await?;
    let node = get_node(
        &client,
        &options.node_name,
        NODE_READ_ATTEMPTS,
        BackoffConfig::default(),
    )
    .await?;
    check_device_plugin_coexistence(
        &node,
        options.device_plugin_resources,
        options.allow_device_plugin_coexistence,
    )?;
    Ok(Cluster { client, node })
}

impl RuntimeOptions {
    /// The CDI class of the driver's devices: the first DNS label of the
    /// driver name (`efa.networking.k8s.aws` → `efa`, `neuron.aws.com` →
    /// `neuron`), giving ids like `k8s.neuron.aws.com/neuron=<name>`.
    fn cdi_class(&self) -> &str {
        self.driver_name
            .split('.')
            .next()
            .unwrap_or(&self.driver_name)
    }

    fn plugin_options(&self) -> PluginOptions {
        let mut options = PluginOptions::new(&self.driver_name, self.cdi_class());
        options.device_attributes = self.device_attributes.clone();
        options.registrar_dir = self.kubelet_registrar_dir.clone();
        options.plugins_dir = self.kubelet_plugins_dir.clone();
        options.cdi_root = self.cdi_root.clone();
        options.pod_uid = self.pod_uid.clone().filter(|uid| !uid.is_empty());
        options.device_release_wait = self.device_release_wait;
        options.pool = Some(self.node_name.clone());
        options
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RuntimeError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error(
        "node {node} advertises {resources:?} from the classic device plugin; running this DRA driver \
         beside it would hand the same devices out twice. Remove the device plugin from this node, \
         or pass --allow-device-plugin-coexistence if you know they manage different devices"
    )]
    DevicePluginPresent {
        node: String,
        resources: Vec<String>,
    },
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Publisher(#[from] PublisherConfigError),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs the driver until SIGTERM/SIGINT; see the module docs for the order.
/// `feeds` carry the devices to publish and their health for kubelet (the
/// rescan loop keeps them current).
pub(crate) async fn run<D: Driver>(
    driver: D,
    feeds: DeviceFeeds,
    options: RuntimeOptions,
    cluster: Cluster,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let node_name = options.node_name.clone();
    let driver_name = options.driver_name.clone();
    let node_labels_now = cluster.node_labels();
    let Cluster { client, node } = cluster;
    let owner = node_owner(&node)?;

    let registry = options.metrics.clone();
    let plugin_metrics = PluginMetrics::register(&registry)?;
    let publish_metrics = PublishMetrics::register(&registry)?;

    // Its own client and connection (see KubeClaimSource::new), opened
    // while the sockets are bound and the slices published: no prepare can
    // come before kubelet registered the plugin and the scheduler saw the
    // slices, so the start need not wait for a TLS handshake. A prepare
    // that came first anyway would open a connection of its own.
    let claims = Arc::new(KubeClaimSource::new(
        kube_client(options.kubeconfig.as_deref()).await?,
    ));
    tokio::spawn({
        let claims = Arc::clone(&claims);
        async move { claims.warm_up().await }
    });
    let mut plugin_options = options.plugin_options();
    plugin_options.device_attributes = plugin_options
        .device_attributes
        .with_source(published_attributes(feeds.devices.clone()));
    let plugin = KubeletPlugin::new(driver, claims, plugin_options, plugin_metrics)
        .with_health(feeds.health)
        .start(shutdown.clone())
        .await?;
    let sockets = plugin.sockets.clone();
    tracing::info!(
        driver = %driver_name,
        node = %node_name,
        registration = %sockets.registration.display(),
        plugin = %sockets.plugin.display(),
        "kubelet plugin serving"
    );

    let config = PublisherConfig::new(&driver_name, &node_name, Some(owner), publish_metrics)?;
    // Ready (for rollouts) once kubelet registered the plugin and the
    // slices are published: the two lifecycle signals, see
    // `crate::daemon::ready`.
    let readiness = Readiness::default();
    let ready_task = tokio::spawn(crate::daemon::ready::mark_when_serving(
        plugin.registered.clone(),
        config.published(),
        readiness.clone(),
    ));
    let probe = {
        let sockets = sockets.clone();
        HealthProbe::new(move || {
            let sockets = sockets.clone();
            async move {
                self_check(&sockets.registration, &sockets.plugin)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
    };
    let ops = OpsServer::bind(options.metrics_address, registry, probe, readiness).await?;
    if let Some(address) = ops.local_addr() {
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    }
    let ops_task = tokio::spawn(ops.serve(shutdown.clone().cancelled_owned()));

    let publisher_task = tokio::spawn(publisher::run(
        client.clone(),
        config,
        feeds.devices,
        shutdown.clone().cancelled_owned(),
    ));

    let labels_task = (!options.managed_node_labels.is_empty()).then(|| {
        tokio::spawn(crate::publish::node_labels::run(
            client.clone(),
            node_name.clone(),
            options.managed_node_labels,
            node_labels_now,
            feeds.node_labels,
            shutdown.clone(),
        ))
    });

    let result = plugin.wait().await;
    // The plugin only returns on shutdown or a fatal serving error; either
    // way the rest of the process goes down with it.
    shutdown.cancel();
    ready_task.abort();
    let _ = publisher_task.await;
    let _ = ops_task.await;
    if let Some(task) = labels_task {
        let _ = task.await;
    }
    tracing::info!(driver = %driver_name, node = %node_name, "stopped");
    Ok(result?)
}

/// Refuses to run beside the classic device plugin of the same hardware
/// (the Node's `status.allocatable` has one of `resources` above zero),
/// unless `allow` (`--allow-device-plugin-coexistence`) says otherwise.
fn check_device_plugin_coexistence(
    node: &Node,
    resources: &[&str],
    allow: bool,
) -> Result<(), RuntimeError> {
    let present = device_plugin_resources_present(node, resources);
    if present.is_empty() {
        return Ok(());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    if allow {
        tracing::warn!(node = %name, resources = ?present, "classic device plugin present; continuing because --allow-device-plugin-coexistence is set");
        return Ok(());
    }
    Err(RuntimeError::DevicePluginPresent {
        node: name,
        resources: present,
    })
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub(crate) fn spawn_signal_handler(shutdown: CancellationToken) -> Result<(), RuntimeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RuntimeError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RuntimeError::Signals)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            _ = shutdown.cancelled() => return,
        }
        shutdown.cancel();
    });
    Ok(())
}

/// The attributes a device of the pool has as last scanned (what the
/// publisher writes into the slices), for the device attributes files.
fn published_attributes(
    devices: tokio::sync::watch::Receiver<crate::publish::desired::PoolContent>,
) -> crate::prepare::attributes_file::AttributeSource {
    crate::prepare::attributes_file::AttributeSource::new(move |name| {
        let pool = devices.borrow();
        let device = pool.iter().find(|d| d.name == name)?;
        Some(device.attributes.clone().unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::cli::{DriverCli, DriverCommand};

    fn options(driver: &'static str) -> RuntimeOptions {
        let cli: DriverCli = DriverCli::try_parse_for(
            "test-driver",
            "0.0.0",
            driver,
            ["test-driver", "run", "--node-name", "n1", "--pod-uid", ""],
        )
        .expect("parse");
        let DriverCommand::Run(run) = cli.command else {
            panic!("expected run")
        };
        run.runtime_options(&[], Registry::new())
    }

    #[test]
    fn cdi_class_is_the_first_label_of_the_driver_name() {
        assert_eq!(options("efa.networking.k8s.aws").cdi_class(), "efa");
        assert_eq!(options("neuron.aws.com").cdi_class(), "neuron");
    }

    #[test]
    fn empty_pod_uid_means_plain_socket_names() {
        let sockets = options("neuron.aws.com").plugin_options().sockets();
        assert!(
            sockets
                .registration
                .ends_with("plugins_registry/neuron.aws.com-reg.sock")
        );
        assert!(sockets.plugin.ends_with("plugins/neuron.aws.com/dra.sock"));
    }

    #[test]
    fn device_plugin_coexistence_is_refused_unless_allowed() {
        const EFA: &[&str] = &["vpc.amazonaws.com/efa"];
        // (allocatable, allow, may start)
        type Case = (&'static [(&'static str, &'static str)], bool, bool);
        let cases: &[Case] = &[
            (&[("cpu", "8")], false, true),
            (&[("vpc.amazonaws.com/efa", "32")], false, false),
            (&[("vpc.amazonaws.com/efa", "32")], true, true),
            // kubelet keeps a removed plugin's resource at 0
            (&[("vpc.amazonaws.com/efa", "0")], false, true),
            (&[("aws.amazon.com/neuron", "16")], false, true),
        ];
        for (allocatable, allow, may_start) in cases {
            let node = crate::publish::node::tests::node(allocatable);
            let result = check_device_plugin_coexistence(&node, EFA, *allow);
            assert_eq!(result.is_ok(), *may_start, "{allocatable:?} allow={allow}");
            if let Err(e) = result {
                let message = e.to_string();
                assert!(
                    message.contains("node n1")
                        && message.contains("vpc.amazonaws.com/efa")
                        && message.contains("--allow-device-plugin-coexistence"),
                    "{message}"
                );
            }
        }
    }
}
