//! The kubelet-facing servers: registration and the DRA plugin service.
//!
//! Socket layout (per the kubelet plugin protocol): registration on
//! `<registrar-dir>/<driver>-reg.sock`, the plugin on
//! `<plugins-dir>/<driver>/dra.sock`; with a pod UID (seamless upgrade) the
//! names become `<driver>-<podUID>-reg.sock` and `dra-<podUID>.sock`. The
//! plugin data directory `<plugins-dir>/<driver>/` holds the checkpoint and
//! the cross-process lock. Stale sockets are removed before binding (a new
//! instance replaces an old one), ours on shutdown (a registration socket
//! gone is how kubelet learns the plugin is), but only while the path
//! still names the socket this instance bound (`socket`): without a pod
//! UID a surge replacement binds the same names, and removing its sockets
//! would make kubelet deregister the running driver.
//! Every connection goes through a relay (`connection`) that closes it when
//! the client goes away, misbehaves or stalls; registration connections get
//! their `:authority` rewritten (`authority`). Shutdown is bounded: open
//! connections get `connections.shutdown_grace`, then are cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::kubelet::authority::Rewrite;
use crate::kubelet::connection::{ConnectionLimits, DEADLINE_MARGIN, relayed_connections};
use crate::kubelet::health::{self, DeviceHealthStatus, HealthService};
use crate::kubelet::proto::{
    dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration as reg,
};
use crate::prepare::atomic::remove_if_exists;
use crate::prepare::attributes_file::AttributeFiles;
use crate::prepare::claims::ClaimSource;
use crate::prepare::driver::Driver;
use crate::prepare::metrics::PluginMetrics;
use crate::prepare::state::{ClaimPipeline, PipelineConfig};
use crate::prepare::status::StatusSetup;

mod claim_uid;
mod dra;
mod socket;
use dra::DraService;
use socket::{BoundSocket, bind_private};

/// Default of [`PluginOptions::device_release_wait`]: long enough for kubelet
/// to stop a force-deleted pod's containers and unprepare its claim (about
/// 2 s with kubelet's minimum grace on an idle node; 11.4 s was seen on a
/// loaded one, where 10 s, the earlier default, refused), and under
/// kubelet's 45 s timeout of a prepare call with room for the prepare
/// itself.
pub(crate) const DEFAULT_DEVICE_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// Where and as what the plugin serves.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PluginOptions {
    /// e.g. `neuron.aws.com`.
    pub driver_name: String,
    /// CDI class, e.g. `neuron` (ids are `k8s.<driver>/<class>=...`).
    pub cdi_class: String,
    /// kubelet's plugin registry, default `/var/lib/kubelet/plugins_registry`.
    pub registrar_dir: PathBuf,
    /// kubelet's plugins dir, default `/var/lib/kubelet/plugins`.
    pub plugins_dir: PathBuf,
    /// default `/var/run/cdi`.
    pub cdi_root: PathBuf,
    /// The pod UID (env `POD_UID`) for per-pod socket names.
    pub pod_uid: Option<String>,
    /// default `/proc/sys/kernel/random/boot_id`.
    pub boot_id_path: PathBuf,
    /// Time limits of every accepted connection, shutdown grace included.
    pub connections: ConnectionLimits,
    /// How long a prepare waits for another claim that still holds one of
    /// its devices to be unprepared before refusing (device reuse after a
    /// force-deleted pod); zero refuses at once.
    pub device_release_wait: Duration,
    /// This node's pool (the node name): a result of this driver in
    /// another pool names a device of another node and is refused. `None`
    /// accepts every pool (tests that do not care).
    pub pool: Option<String>,
    /// Device attributes files (on by default).
    pub device_attributes: AttributeFiles,
}

impl PluginOptions {
    /// Options with the kubelet defaults.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new(driver_name: &str, cdi_class: &str) -> Self {
        Self {
            driver_name: driver_name.to_string(),
            cdi_class: cdi_class.to_string(),
            registrar_dir: PathBuf::from("/var/lib/kubelet/plugins_registry"),
            plugins_dir: PathBuf::from("/var/lib/kubelet/plugins"),
            cdi_root: PathBuf::from("/var/run/cdi"),
            pod_uid: None,
            boot_id_path: PathBuf::from("/proc/sys/kernel/random/boot_id"),
            connections: ConnectionLimits::default(),
            device_release_wait: DEFAULT_DEVICE_RELEASE_WAIT,
            pool: None,
            device_attributes: AttributeFiles::default(),
        }
    }

    /// The socket paths and data directory these options lead to.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn sockets(&self) -> PluginSockets {
        let data_dir = self.plugins_dir.join(&self.driver_name);
        let (registration, plugin) = match self.pod_uid.as_deref().filter(|u| !u.is_empty()) {
            Some(uid) => (
                format!("{}-{uid}-reg.sock", self.driver_name),
                format!("dra-{uid}.sock"),
            ),
            None => (
                format!("{}-reg.sock", self.driver_name),
                "dra.sock".to_string(),
            ),
        };
        PluginSockets {
            registration: self.registrar_dir.join(registration),
            plugin: data_dir.join(plugin),
            data_dir,
        }
    }
}

/// Resolved paths of a plugin instance.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PluginSockets {
    pub registration: PathBuf,
    pub plugin: PathBuf,
    pub data_dir: PathBuf,
}

/// The longest path a unix socket may have (`sun_path` is 108 bytes with
/// its terminating NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

impl PluginSockets {
    /// Both socket paths fit a unix socket address. With a pod UID in the
    /// names (DaemonSet pods), the EFA driver's registration socket takes 86
    /// bytes after the kubelet root dir: a root of more than 21 bytes is too
    /// long, which the error says in the operator's terms.
    pub(crate) fn check_lengths(&self) -> Result<(), PluginError> {
        for path in [&self.registration, &self.plugin] {
            let len = path.as_os_str().len();
            if len > MAX_SOCKET_PATH {
                return Err(PluginError::PathTooLong {
                    path: path.clone(),
                    len,
                });
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum PluginError {
    #[error(
        "socket path {path} is {len} bytes, but unix socket paths end at {MAX_SOCKET_PATH}: \
         shorten the kubelet root dir (kubelet --root-dir; the charts' hostPaths.kubeletRoot, \
         or hostPaths.kubeletRegistrarDir / kubeletPluginsDir)"
    )]
    PathTooLong { path: PathBuf, len: usize },
    #[error("preparing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gRPC server on {path}: {source}")]
    Serve {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("server task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The kubelet plugin runtime of one driver.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct KubeletPlugin<D: Driver> {
    driver: Arc<D>,
    claims: Arc<dyn ClaimSource>,
    options: PluginOptions,
    metrics: PluginMetrics,
    health: Option<watch::Receiver<Vec<DeviceHealthStatus>>>,
    status: Option<StatusSetup>,
}

/// A started plugin; `wait` returns after shutdown, sockets removed.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct RunningPlugin {
    pub sockets: PluginSockets,
    /// Whether kubelet has registered the plugin: `false` until kubelet's
    /// `NotifyRegistrationStatus` says registered, and again if it says
    /// it rejected the plugin. The readiness gate waits on it.
    pub registered: watch::Receiver<bool>,
    /// Why no new claim is prepared while the checkpoint is a newer
    /// version's (`None` otherwise); the readiness follows it.
    pub(crate) checkpoint_newer: watch::Receiver<Option<String>>,
    task: JoinHandle<Result<(), PluginError>>,
}

impl RunningPlugin {
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub async fn wait(self) -> Result<(), PluginError> {
        self.task.await?
    }
}

impl<D: Driver> KubeletPlugin<D> {
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new(
        driver: D,
        claims: Arc<dyn ClaimSource>,
        options: PluginOptions,
        metrics: PluginMetrics,
    ) -> Self {
        Self {
            driver: Arc::new(driver),
            claims,
            options,
            metrics,
            health: None,
            status: None,
        }
    }

    /// Serve `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth` from
    /// this channel.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn with_health(mut self, health: watch::Receiver<Vec<DeviceHealthStatus>>) -> Self {
        self.health = Some(health);
        self
    }

    /// Write the claims' device status (`status.devices`) through `setup`.
    pub(crate) fn with_claim_status(mut self, setup: StatusSetup) -> Self {
        self.status = Some(setup);
        self
    }

    /// Binds both sockets (plugin first, so kubelet never finds a
    /// registration that points nowhere) and serves until `shutdown`.
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub async fn start(self, shutdown: CancellationToken) -> Result<RunningPlugin, PluginError> {
        let sockets = self.options.sockets();
        sockets.check_lengths()?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PluginError::Io { path, source }
        };
        for dir in [
            &self.options.registrar_dir,
            &sockets.data_dir,
            &self.options.cdi_root,
        ] {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }

        let driver = Arc::clone(&self.driver);
        let name = &self.options.driver_name;
        let status = self.status.map(|s| s.start(driver, name, shutdown.clone()));
        let pipeline = Arc::new(ClaimPipeline::new(
            self.driver,
            self.claims,
            PipelineConfig {
                driver_name: &self.options.driver_name,
                pool: self.options.pool.clone(),
                data_dir: &sockets.data_dir,
                cdi_root: &self.options.cdi_root,
                cdi_class: &self.options.cdi_class,
                boot_id_path: self.options.boot_id_path.clone(),
                device_attributes: &self.options.device_attributes,
                release_wait: self.options.device_release_wait,
            },
            self.metrics.clone(),
            status.unwrap_or_default(),
        ));
        let checkpoint_newer = pipeline.checkpoint_newer();
        // What an earlier run left (read under the node lock, a damaged
        // checkpoint recovered), then the sweeps of files nobody needs.
        tokio::spawn(pipeline.clone().run_in_background(shutdown.clone()));

        let limits = self.options.connections;
        // A prepare may wait `device_release_wait` for a device's release.
        let dra_deadline = limits
            .call_deadline
            .max(self.options.device_release_wait + DEADLINE_MARGIN);
        let max_request = limits.max_request_bytes;
        let mut versions = vec!["v1.DRAPlugin".to_string(), "v1beta1.DRAPlugin".to_string()];
        let mut plugin_router = bounded_server(&limits, dra_deadline + BACKSTOP_MARGIN)
            .add_service(
                dra_v1::dra_plugin_server::DraPluginServer::new(DraService {
                    pipeline: pipeline.clone(),
                    metrics: self.metrics.clone(),
                    deadline: dra_deadline,
                })
                .max_decoding_message_size(max_request),
            )
            .add_service(
                dra_v1beta1::dra_plugin_server::DraPluginServer::new(DraService {
                    pipeline,
                    metrics: self.metrics.clone(),
                    deadline: dra_deadline,
                })
                .max_decoding_message_size(max_request),
            );
        if let Some(health) = self.health {
            versions.extend(health::SERVICE_NAMES.iter().map(ToString::to_string));
            let service = HealthService { health };
            plugin_router = plugin_router
                .add_service(
                    health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                        service.clone(),
                    )
                    .max_decoding_message_size(max_request),
                )
                .add_service(
                    health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                        service,
                    )
                    .max_decoding_message_size(max_request),
                );
        }

        remove_if_exists(&sockets.plugin).map_err(io(&sockets.plugin))?;
        let (plugin_listener, plugin_file) =
            bind_private(&sockets.plugin).map_err(io(&sockets.plugin))?;
        remove_if_exists(&sockets.registration).map_err(io(&sockets.registration))?;
        let (reg_listener, reg_file) =
            bind_private(&sockets.registration).map_err(io(&sockets.registration))?;
        let reg_file = Arc::new(reg_file);

        let info = reg::PluginInfo {
            r#type: "DRAPlugin".to_string(),
            name: self.options.driver_name.clone(),
            endpoint: sockets.plugin.to_string_lossy().into_owned(),
            supported_versions: versions,
        };
        let (registered_tx, registered) = watch::channel(false);
        let registration = reg::registration_server::RegistrationServer::new(RegistrationService {
            info,
            metrics: self.metrics.clone(),
            registered: registered_tx,
        })
        .max_decoding_message_size(max_request);
        tracing::info!(
            registration = %sockets.registration.display(),
            plugin = %sockets.plugin.display(),
            "kubelet plugin sockets listening"
        );

        let plugin_path = sockets.plugin.clone();
        let plugin_server = plugin_router.serve_with_incoming_shutdown(
            relayed_connections(
                plugin_listener,
                "dra",
                Rewrite::PassThrough,
                limits,
                shutdown.clone(),
            ),
            shutdown.clone().cancelled_owned(),
        );
        let reg_path = sockets.registration.clone();
        let reg_server = bounded_server(&limits, limits.call_deadline + BACKSTOP_MARGIN)
            .add_service(registration)
            .serve_with_incoming_shutdown(
                relayed_connections(
                    reg_listener,
                    "registration",
                    Rewrite::Authority,
                    limits,
                    shutdown.clone(),
                ),
                shutdown.clone().cancelled_owned(),
            );
        let task = tokio::spawn(async move {
            // Kubelet must see the registration socket vanish first.
            let early_unregister = {
                let reg_file = Arc::clone(&reg_file);
                let shutdown = shutdown.clone();
                async move {
                    shutdown.cancelled().await;
                    remove_own(&reg_file);
                }
            };
            // The relays cut every connection `shutdown_grace` after
            // shutdown; the servers then finish at once. The bound is a
            // second line of defence so that SIGTERM always completes.
            let servers = async { tokio::join!(plugin_server, reg_server) };
            let bound = async {
                shutdown.cancelled().await;
                tokio::time::sleep(limits.shutdown_grace + SERVER_EXIT_MARGIN).await;
            };
            let (servers, ()) = tokio::join!(
                async {
                    tokio::select! {
                        results = servers => Some(results),
                        () = bound => None,
                    }
                },
                early_unregister
            );
            remove_own(&reg_file);
            remove_own(&plugin_file);
            tracing::info!("kubelet plugin sockets removed (those still ours)");
            let Some((plugin_result, reg_result)) = servers else {
                tracing::error!(
                    grace = ?limits.shutdown_grace,
                    "gRPC servers still busy after the shutdown grace; left behind"
                );
                return Ok(());
            };
            plugin_result.map_err(|source| PluginError::Serve {
                path: plugin_path,
                source,
            })?;
            reg_result.map_err(|source| PluginError::Serve {
                path: reg_path,
                source,
            })
        });
        Ok(RunningPlugin {
            sockets,
            registered,
            checkpoint_newer,
            task,
        })
    }
}

/// How much later than a handler's own deadline the server's cuts a call
/// (the handlers answer with a clear message; the server's is for calls
/// without one, e.g. registration and the health stream's start).
const BACKSTOP_MARGIN: Duration = Duration::from_secs(1);

/// A gRPC server with the bounds of `limits`: concurrent streams per
/// connection (announced in SETTINGS, and enforced), and `deadline` on
/// every call as a second line behind the handlers' own.
fn bounded_server(limits: &ConnectionLimits, deadline: Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .timeout(deadline)
        .max_concurrent_streams(limits.max_concurrent_streams)
        .concurrency_limit_per_connection(limits.max_concurrent_streams as usize)
}

/// Removes `socket` unless another instance has bound its path since
/// (shutdown goes on either way; a failure is logged).
fn remove_own(socket: &BoundSocket) {
    if let Err(e) = socket.remove_if_ours() {
        tracing::warn!(error = %e, "cannot remove a kubelet plugin socket");
    }
}

/// How long after the connections' shutdown grace the servers may take to
/// notice that their connections are gone.
const SERVER_EXIT_MARGIN: Duration = Duration::from_millis(500);

struct RegistrationService {
    info: reg::PluginInfo,
    metrics: PluginMetrics,
    /// The lifecycle signal behind [`RunningPlugin::registered`].
    registered: watch::Sender<bool>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.metrics.registration(status.plugin_registered);
        self.registered.send_replace(status.plugin_registered);
        if status.plugin_registered {
            tracing::info!(driver = self.info.name, "kubelet registered the plugin");
        } else {
            tracing::error!(
                driver = self.info.name,
                error = status.error,
                "kubelet REJECTED the plugin registration: this node will get no allocations"
            );
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests;
