//! One driver process: the kubelet plugin, the slice publisher and the
//! `/metrics` + `/healthz` server, started together and stopped together.
//!
//! The order matters for operators. The kubelet sockets are bound first,
//! from local state only (the first scan, the checkpoint), so a node whose
//! API server is unreachable at boot still has a plugin: unprepare runs
//! from the checkpoint and kubelet gets device health (the socket is bound
//! before its registration, so a registration never points at a plugin
//! that is not serving). The ops server comes next, so `/readyz` and
//! `aws_dra_waiting_for` say what the start waits for. Then the Node is read,
//! retried for as long as it takes ([`crate::daemon::apiserver`]); until it
//! is, prepare answers each claim with an error that says the API server
//! has not answered (kubelet retries) and nothing is published. Once read:
//! the refusal to run beside the classic device plugin (which would hand
//! the same device out twice; it comes before any prepare or publish), the
//! Node's labels and the API probe reach the scan, one rescan, and only then
//! prepare opens and the slices are published. SIGTERM or SIGINT cancels
//! everything; the plugin removes its sockets on the way out, which is how
//! kubelet learns it is gone. An unreachable API server never stops the
//! kubelet sockets: the publisher retries with backoff while prepared
//! claims keep working.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::daemon::apiserver::{ApiServerGate, NODE_READ_BACKOFF};
use crate::daemon::checkpoint_event::report_newer;
use crate::daemon::claim_status;
use crate::daemon::client::{ClientError, kube_client};
use crate::daemon::ops::{HealthProbe, OpsError, OpsServer, Readiness};
use crate::daemon::ready::{Awaited, StartupWaits, follow_checkpoint, mark_when};
use crate::daemon::rescan::DeviceFeeds;
use crate::kubelet::plugin::{KubeletPlugin, PluginError, PluginOptions};
use crate::kubelet::self_check::self_check;
use crate::prepare::claims::{ClaimSource, KubeClaimSource};
use crate::prepare::driver::Driver;
use crate::prepare::metrics::PluginMetrics;
use crate::publish::node::{NodeError, device_plugin_resources_present, get_node, node_owner};
use crate::publish::node_event::NodeReporter;
use crate::publish::publisher::handover::{Instance, Liveness};
use crate::publish::publisher::{self, PublishMetrics, PublisherConfig, PublisherConfigError};

/// What the daemon does with the Node once the API server answered,
/// before prepare opens and publishing starts: hand the Node's labels and
/// the API probe to the scan and rescan (the runner's part).
pub(crate) type OnNode = Box<dyn FnOnce(kube::Client, Node) -> BoxFuture<'static, ()> + Send>;

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
    /// Deadline of each API request that is not a watch
    /// ([`crate::daemon::request_deadline`]).
    pub api_request_timeout: std::time::Duration,
    /// Device attributes files in containers (on/off, host directory).
    pub device_attributes: crate::prepare::attributes_file::AttributeFiles,
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
    #[error("the cluster side of the driver failed: {0}")]
    ClusterSide(tokio::task::JoinError),
}

/// Runs the driver until SIGTERM/SIGINT; see the module docs for the order.
/// `feeds` carry the devices to publish and their health for kubelet (the
/// rescan loop keeps them current); `on_node` runs once the Node is read.
pub(crate) async fn run<D: Driver>(
    driver: D,
    feeds: DeviceFeeds,
    options: RuntimeOptions,
    on_node: OnNode,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let node_name = options.node_name.clone();
    let driver_name = options.driver_name.clone();
    // Who publishes when two instances run on the node: the newest started.
    let instance = Instance::this_process(options.pod_uid.as_deref());
    // Built from the configuration alone: nothing is sent yet.
    let client = kube_client(options.kubeconfig.as_deref(), options.api_request_timeout).await?;

    let registry = options.metrics.clone();
    let plugin_metrics = PluginMetrics::register(&registry)?;
    let publish_metrics = PublishMetrics::register(&registry)?;
    let readiness = Readiness::default();
    let waits = StartupWaits::register(&registry, readiness.clone())?;

    // The same client as the publisher's (see KubeClaimSource::new), behind
    // the gate that refuses prepares until the API server has answered.
    let gate = ApiServerGate::default();
    let claims: Arc<dyn ClaimSource> =
        Arc::new(gate.guard(Arc::new(KubeClaimSource::new(client.clone()))));
    let mut plugin_options = options.plugin_options();
    plugin_options.device_attributes = plugin_options
        .device_attributes
        .with_source(published_attributes(feeds.devices.clone()));
    let status = claim_status::setup(
        client.clone(),
        &driver_name,
        feeds.health.clone(),
        &registry,
    )?;
    let plugin = KubeletPlugin::new(driver, claims, plugin_options, plugin_metrics)
        .with_health(feeds.health.clone())
        .with_claim_status(status)
        .start(shutdown.clone())
        .await?;
    let sockets = plugin.sockets.clone();
    tracing::info!(
        driver = %driver_name,
        node = %node_name,
        registration = %sockets.registration.display(),
        plugin = %sockets.plugin.display(),
        "kubelet plugin serving (unprepare from the checkpoint; prepare once the API server answered)"
    );
    let registration_task = tokio::spawn(mark_when(
        plugin.registered.clone(),
        Awaited::Registration,
        waits.clone(),
    ));
    let checkpoint_task = tokio::spawn(follow_checkpoint(
        plugin.checkpoint_newer.clone(),
        waits.clone(),
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
    let ops = match OpsServer::bind(options.metrics_address, registry, probe, readiness).await {
        Ok(ops) => ops,
        Err(error) => {
            shutdown.cancel();
            let _ = plugin.wait().await;
            return Err(error.into());
        }
    };
    if let Some(address) = ops.local_addr() {
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    }
    let ops_task = tokio::spawn(ops.serve(shutdown.clone().cancelled_owned()));

    let cluster_side = tokio::spawn(serve_cluster(
        ClusterSide {
            client,
            gate,
            waits,
            feeds,
            publish_metrics,
            instance,
            on_node,
            checkpoint_newer: plugin.checkpoint_newer.clone(),
        },
        options,
        shutdown.clone(),
    ));

    let plugin_done = plugin.wait();
    tokio::pin!(plugin_done);
    let mut cluster_side = cluster_side;
    // The plugin only returns on shutdown or a fatal serving error; the
    // cluster side early only when it refuses to go on (the classic device
    // plugin on this node). Either way the rest goes down with it.
    let result = tokio::select! {
        plugin = &mut plugin_done => {
            shutdown.cancel();
            let cluster = join_cluster_side(cluster_side.await);
            plugin.map_err(RuntimeError::from).and(cluster)
        }
        cluster = &mut cluster_side => {
            shutdown.cancel();
            let plugin = plugin_done.await;
            join_cluster_side(cluster).and(plugin.map_err(RuntimeError::from))
        }
    };
    registration_task.abort();
    checkpoint_task.abort();
    let _ = ops_task.await;
    tracing::info!(driver = %driver_name, node = %node_name, "stopped");
    result
}

fn join_cluster_side(
    joined: Result<Result<(), RuntimeError>, tokio::task::JoinError>,
) -> Result<(), RuntimeError> {
    joined.map_err(RuntimeError::ClusterSide)?
}

/// What the cluster side of the daemon works with.
struct ClusterSide {
    client: kube::Client,
    gate: ApiServerGate,
    waits: StartupWaits,
    feeds: DeviceFeeds,
    publish_metrics: PublishMetrics,
    instance: Instance,
    on_node: OnNode,
    /// The plugin's refusal while its checkpoint is a newer driver's.
    checkpoint_newer: tokio::sync::watch::Receiver<Option<String>>,
}

/// Reads the Node (for as long as it takes), checks it, lets the runner
/// apply it, opens prepare and publishes until `shutdown`.
async fn serve_cluster(
    side: ClusterSide,
    options: RuntimeOptions,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let ClusterSide {
        client,
        gate,
        waits,
        feeds,
        publish_metrics,
        instance,
        on_node,
        checkpoint_newer,
    } = side;
    let node_name = options.node_name.clone();
    let read = get_node(&client, &node_name, NODE_READ_BACKOFF, |failures| {
        if failures == 1 {
            tracing::warn!(node = %node_name, "the API server does not answer; kubelet is served from local state (unprepare works, prepare waits) until it does");
        }
    });
    let node = tokio::select! {
        node = read => node,
        () = shutdown.cancelled() => return Ok(()),
    };
    check_device_plugin_coexistence(
        &node,
        options.device_plugin_resources,
        options.allow_device_plugin_coexistence,
    )?;
    let owner = node_owner(&node)?;
    let node_labels_now = node.metadata.labels.clone().unwrap_or_default();
    let newer_task = {
        let (client, driver, node, uid) = (
            client.clone(),
            options.driver_name.clone(),
            node_name.clone(),
            owner.uid.clone(),
        );
        tokio::spawn(async move {
            let reporter = NodeReporter {
                driver: &driver,
                node: &node,
                node_uid: Some(&uid),
            };
            report_newer(client, reporter, checkpoint_newer).await
        })
    };
    tokio::select! {
        () = on_node(client.clone(), node) => {}
        () = shutdown.cancelled() => return Ok(()),
    }
    gate.open();
    waits.done(Awaited::ApiServer);

    let config = PublisherConfig::new(
        &options.driver_name,
        &node_name,
        Some(owner),
        publish_metrics,
    )?
    .with_instance(instance, instance_liveness(&options));
    let publish_task = tokio::spawn(mark_when(config.published(), Awaited::FirstPublish, waits));
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
    let _ = publisher_task.await;
    publish_task.abort();
    newer_task.abort();
    if let Some(task) = labels_task {
        let _ = task.await;
    }
    Ok(())
}

/// Whether another instance of the driver still runs on this node, by its
/// id ([`crate::publish::publisher::handover`]): it serves its plugin socket
/// (`dra-<podUID>.sock`, `dra.sock` for a `pid-` id) in the data directory
/// this one shares. The probe connects and sends the HTTP/2 client preface
/// before it closes, so the other instance does not log a broken client.
/// An instance with our own socket path is gone: we replaced its socket.
fn instance_liveness(options: &RuntimeOptions) -> Liveness {
    let plugin = options.plugin_options();
    let ours = plugin.sockets().plugin;
    Liveness::new(move |id| {
        let mut other = plugin.clone();
        other.pod_uid = (!id.starts_with("pid-")).then(|| id.to_owned());
        let path = other.sockets().plugin;
        path != ours && serves(&path)
    })
}

/// Does a server accept connections on the Unix socket `path`?
fn serves(path: &std::path::Path) -> bool {
    use std::io::Write;
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(mut stream) => {
            let _ = stream.set_write_timeout(Some(std::time::Duration::from_millis(200)));
            let _ = stream.write_all(crate::kubelet::authority::PREFACE);
            true
        }
        Err(_) => false,
    }
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
    fn another_instance_is_alive_while_it_serves_its_plugin_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = options("neuron.aws.com");
        o.kubelet_plugins_dir = dir.path().to_path_buf();
        o.pod_uid = Some("old-pod".into());
        let alive = instance_liveness(&o);
        let data = dir.path().join("neuron.aws.com");
        std::fs::create_dir_all(&data).expect("data dir");
        assert!(!alive.alive("new-pod"), "no socket");
        let listener =
            std::os::unix::net::UnixListener::bind(data.join("dra-new-pod.sock")).expect("bind");
        assert!(alive.alive("new-pod"), "serving");
        drop(listener);
        assert!(data.join("dra-new-pod.sock").exists());
        assert!(!alive.alive("new-pod"), "a stale socket is no instance");
        let plain = std::os::unix::net::UnixListener::bind(data.join("dra.sock")).expect("bind");
        assert!(alive.alive("pid-7"), "an instance with plain socket names");
        // With plain names ourselves, that socket is ours: the other is gone.
        o.pod_uid = None;
        assert!(!instance_liveness(&o).alive("pid-7"));
        drop(plain);
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
