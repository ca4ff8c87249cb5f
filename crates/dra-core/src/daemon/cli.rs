//! Command-line plumbing shared by both driver binaries.
//!
//! Each binary has `run` (the DaemonSet entry point, also used when no
//! subcommand is given) and `discover` (prints the ResourceSlices `run` would
//! publish, touching no cluster). Every flag has an environment-variable twin,
//! as Kubernetes components do; the twin's name is listed in `--help`. The
//! binary supplies its own default `--driver-name` ([`DriverCli::parse_for`]).
//!
//! Logs go to stderr, so `discover`'s stdout is only the List document.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::resource::v1::ResourceSlice;
use prometheus::Registry;

use crate::daemon::ops::DEFAULT_METRICS_ADDRESS;
use crate::daemon::request_deadline::DEFAULT_API_REQUEST_TIMEOUT;
use crate::daemon::rescan::{DEFAULT_RESCAN_INTERVAL, RescanConfig, UEVENT_SETTLE};
use crate::daemon::runtime::RuntimeOptions;
use crate::kubelet::plugin::DEFAULT_DEVICE_RELEASE_WAIT;
use crate::scan::inventory::HostPaths;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `discover` output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum OutputFormat {
    /// JSON (kubectl `-o json` style).
    #[default]
    Json,
    /// YAML (kubectl `-o yaml` style).
    Yaml,
}

/// Flags of both `run` and `discover`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct CommonArgs {
    /// Root of the sysfs tree to probe.
    #[arg(long, env = "SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Root of the device-node tree (`/dev`) on the host side.
    #[arg(long, env = "DEV_ROOT", default_value = "/dev")]
    pub dev_root: PathBuf,
    /// Name of this node; also the pool name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// DRA driver name (the binary supplies the default).
    #[arg(long, env = "DRIVER_NAME", required = false, default_value = "")]
    pub driver_name: String,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (`info`, `debug`, or tracing directives like `dra_core=debug`).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// More logs: `-v` debug, `-vv` trace (overrides `--log-level`).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl CommonArgs {
    /// Where the hardware trees are.
    pub(crate) fn host_paths(&self) -> HostPaths {
        HostPaths {
            sysfs_root: self.sysfs_root.clone(),
            dev_root: self.dev_root.clone(),
        }
    }

    /// The effective log filter after `-v`.
    pub(crate) fn log_filter(&self) -> &str {
        match self.verbose {
            0 => &self.log_level,
            1 => "debug",
            _ => "trace",
        }
    }
}

/// Flags of `run` only.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct RunArgs {
    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(
        long,
        env = "KUBELET_REGISTRAR_DIRECTORY_PATH",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub kubelet_registrar_dir: PathBuf,
    /// Directory under which the plugin's own directory (sockets, checkpoint) lives.
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIRECTORY_PATH",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub kubelet_plugins_dir: PathBuf,
    /// Directory for the CDI spec files.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// UID of this pod; enables per-pod socket names for seamless upgrades.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Listen address of /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDRESS", default_value = DEFAULT_METRICS_ADDRESS)]
    pub metrics_address: SocketAddr,
    /// Kubeconfig file; without it: in-cluster config, then the default kubeconfig.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Start even when the classic device plugin for the same hardware is active.
    #[arg(long, env = "ALLOW_DEVICE_PLUGIN_COEXISTENCE")]
    pub allow_device_plugin_coexistence: bool,
    /// Seconds between fallback rescans of sysfs (hot-plug is normally seen
    /// at once through kernel uevents; the rescan catches lost events and
    /// reads health counters).
    #[arg(long, env = "RESCAN_INTERVAL_SECONDS", default_value_t = DEFAULT_RESCAN_INTERVAL.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rescan_interval: u64,
    /// Seconds a prepare waits for the claim that still holds one of its
    /// devices to be unprepared (a force-deleted pod's claim, released
    /// before kubelet unprepared it) before refusing; 0 refuses at once.
    #[arg(long, env = "DEVICE_RELEASE_WAIT_SECONDS", default_value_t = DEFAULT_DEVICE_RELEASE_WAIT.as_secs())]
    pub device_release_wait: u64,
    /// Seconds each API request that is not a watch may take, answer
    /// included (slice writes, Node reads and patches, claim reads); a
    /// request past it fails and is retried like any API error.
    #[arg(long, env = "API_REQUEST_TIMEOUT_SECONDS", default_value_t = DEFAULT_API_REQUEST_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..))]
    pub api_request_timeout: u64,
    /// Write each prepared claim's device attributes files and mount them
    /// read-only into its containers; `false`: neither.
    #[arg(long, env = "DEVICE_ATTRIBUTES_FILES", default_value_t = true,
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub device_attributes_files: bool,
    /// Host directory of the device attributes files; default:
    /// `dra-device-attributes` beside `--cdi-root` (/var/run/dra-device-attributes).
    #[arg(long, env = "DEVICE_ATTRIBUTES_ROOT")]
    pub device_attributes_root: Option<PathBuf>,
}

/// Flags of `discover` only.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct DiscoverArgs {
    /// Output format.
    #[arg(short, long, env = "OUTPUT_FORMAT", value_enum, default_value_t = OutputFormat::Json)]
    pub output: OutputFormat,
    /// Print what a node of this EC2 instance type publishes, without
    /// hardware: its devices without the attributes that exist only on a
    /// running node, and which devices share each of those
    /// (`attributeBindings`); `--node-name` is then optional.
    #[arg(long, env = "DISCOVER_INSTANCE_TYPE", conflicts_with_all = ["sysfs_root", "dev_root"])]
    pub instance_type: Option<String>,
}

/// A driver without flags of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct NoExtraArgs {}

/// `run` = common + run flags + the driver's own flags (`X`).
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct RunCommand<X: Args = NoExtraArgs> {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
    /// `run` flags.
    #[command(flatten)]
    pub run: RunArgs,
    /// The driver's own flags.
    #[command(flatten)]
    pub extra: X,
}

impl<X: Args> RunCommand<X> {
    /// The runtime's options: what these flags say, plus what the binary
    /// knows (the classic device plugin's resource names) and the registry
    /// its metrics went to.
    pub(crate) fn runtime_options(
        &self,
        device_plugin_resources: &'static [&'static str],
        metrics: Registry,
    ) -> RuntimeOptions {
        RuntimeOptions {
            driver_name: self.common.driver_name.clone(),
            node_name: self.common.node_name.clone(),
            kubelet_registrar_dir: self.run.kubelet_registrar_dir.clone(),
            kubelet_plugins_dir: self.run.kubelet_plugins_dir.clone(),
            cdi_root: self.run.cdi_root.clone(),
            pod_uid: self.run.pod_uid.clone().filter(|uid| !uid.is_empty()),
            metrics_address: self.run.metrics_address,
            kubeconfig: self.run.kubeconfig.clone(),
            allow_device_plugin_coexistence: self.run.allow_device_plugin_coexistence,
            device_plugin_resources,
            metrics,
            device_release_wait: Duration::from_secs(self.run.device_release_wait),
            managed_node_labels: &[],
            api_request_timeout: Duration::from_secs(self.run.api_request_timeout),
            device_attributes: crate::prepare::attributes_file::AttributeFiles {
                enabled: self.run.device_attributes_files,
                host_dir: self.run.device_attributes_root.clone(),
                ..Default::default()
            },
        }
    }

    /// The rescan loop's timing.
    pub(crate) fn rescan_config(&self) -> RescanConfig {
        RescanConfig {
            interval: Duration::from_secs(self.run.rescan_interval),
            settle: UEVENT_SETTLE,
        }
    }
}

/// `discover` = common + discover flags + the driver's own flags (`X`).
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub(crate) struct DiscoverCommand<X: Args = NoExtraArgs> {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
    /// `discover` flags.
    #[command(flatten)]
    pub discover: DiscoverArgs,
    /// The driver's own flags.
    #[command(flatten)]
    pub extra: X,
}

/// The subcommands.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
// Parsed once per process and consumed at once: boxing `run` would save
// nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
pub(crate) enum DriverCommand<X: Args = NoExtraArgs> {
    /// Serve the kubelet plugin and publish devices (the DaemonSet entry point; the default).
    Run(RunCommand<X>),
    /// Print the ResourceSlices `run` would publish, without touching any cluster.
    Discover(DiscoverCommand<X>),
}

/// The whole command line of a driver binary; `X` holds the flags that only
/// this driver has (on both `run` and `discover`).
#[derive(Debug, Clone, PartialEq, Eq, Parser)]
pub(crate) struct DriverCli<X: Args = NoExtraArgs> {
    /// What to do.
    #[command(subcommand)]
    pub command: DriverCommand<X>,
}

impl<X: Args> DriverCli<X> {
    /// Parses the process's arguments for the binary `name` whose default
    /// driver name is `default_driver`; exits with usage on error, like clap.
    pub(crate) fn parse_for(
        name: &'static str,
        version: &'static str,
        default_driver: &'static str,
    ) -> Self {
        match Self::try_parse_for(name, version, default_driver, std::env::args_os()) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }

    /// The binary's whole command line as clap describes it: what
    /// `--help` prints and the flags reference of the docs is generated from.
    pub(crate) fn command_for(
        name: &'static str,
        version: &'static str,
        default_driver: &'static str,
    ) -> clap::Command {
        with_default(Self::command(), "driver_name", default_driver)
            .mut_subcommand("discover", |discover| {
                // A template of an instance type is no node's: the pool
                // is named after the type unless a node name is given.
                discover.mut_arg("node_name", |a| {
                    a.required(false)
                        .required_unless_present("instance_type")
                        .default_value("")
                        .hide_default_value(true)
                        .help(
                            "Name of this node; also the pool name. Required unless \
                             --instance-type is given, which names the pool after the type",
                        )
                })
            })
            .name(name)
            .bin_name(name)
            .version(version)
    }

    /// As [`Self::parse_for`] from explicit arguments (first one is the binary).
    /// When the first argument after the binary is not a subcommand, `run` is
    /// assumed.
    pub(crate) fn try_parse_for<I, T>(
        name: &'static str,
        version: &'static str,
        default_driver: &'static str,
        args: I,
    ) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let explicit = args.get(1).and_then(|a| a.to_str()).is_some_and(|a| {
            matches!(
                a,
                "run" | "discover" | "help" | "-h" | "--help" | "-V" | "--version"
            )
        });
        if !explicit {
            args.insert(args.len().min(1), "run".into());
        }
        let matches =
            Self::command_for(name, version, default_driver).try_get_matches_from(args)?;
        Self::from_arg_matches(&matches)
    }
}

/// Sets `default` on the argument `id` of `cmd` and of every subcommand that has it.
fn with_default(cmd: clap::Command, id: &'static str, default: &'static str) -> clap::Command {
    let has = cmd.get_arguments().any(|a| a.get_id() == id);
    let mut cmd = if has {
        cmd.mut_arg(id, |a| a.default_value(default))
    } else {
        cmd
    };
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for sub in subs {
        cmd = cmd.mut_subcommand(sub, |s| with_default(s, id, default));
    }
    cmd
}

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoggingError {
    /// The filter string is not a valid tracing directive.
    #[error("invalid log level/filter {filter:?}: {reason}")]
    Filter {
        /// What was given.
        filter: String,
        /// Parser message.
        reason: String,
    },
    /// A global subscriber was already installed.
    #[error("logging already initialised: {0}")]
    AlreadySet(String),
}

/// Installs the global `tracing` subscriber writing to stderr.
pub(crate) fn init_logging(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    let env_filter =
        tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| LoggingError::Filter {
            filter: filter.to_owned(),
            reason: e.to_string(),
        })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| LoggingError::AlreadySet(e.to_string()))
}

/// Rendering the List failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    /// JSON encoding failed.
    #[error("encoding ResourceSlices as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML encoding failed.
    #[error("encoding ResourceSlices as YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser_error::Error),
}

/// Renders slices as a kubectl-style `{"apiVersion":"v1","kind":"List","items":[...]}`;
/// each item carries `apiVersion: resource.k8s.io/v1` and `kind: ResourceSlice`.
/// JSON is pretty-printed; both end with a newline.
pub(crate) fn render_list(
    slices: &[ResourceSlice],
    format: OutputFormat,
) -> Result<String, RenderError> {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": slices,
    });
    render_document(&list, format)
}

/// Renders any document `discover` prints, as [`render_list`] does.
pub(crate) fn render_document(
    document: &serde_json::Value,
    format: OutputFormat,
) -> Result<String, RenderError> {
    let mut out = match format {
        OutputFormat::Json => serde_json::to_string_pretty(document)?,
        OutputFormat::Yaml => serde_saphyr::to_string(document)?,
    };
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
