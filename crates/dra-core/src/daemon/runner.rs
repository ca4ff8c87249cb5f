//! A driver binary's whole life, given its [`DeviceInventory`]: the
//! command line, logging, the async runtime, the first scan, the rescan
//! loop, and [`crate::daemon::runtime::run`] (kubelet plugin with the health stream,
//! publisher, ops server). A driver's `main` is one call:
//!
//! ```text
//! fn main() -> std::process::ExitCode {
//!     dra_core::runner::main::<MyInventory>(&dra_core::runner::Program {
//!         binary: "my-driver",
//!         version: env!("CARGO_PKG_VERSION"),
//!         driver_name: "my.example.com",
//!         device_plugin_resources: &["example.com/thing"],
//!     })
//! }
//! ```
//!
//! `discover` opens the same inventory and runs the same scan as `run`, and
//! turns health into taints the same way, so it prints exactly what `run`
//! would publish. `discover --instance-type` reads no hardware: it prints
//! the driver's template of that type ([`crate::daemon::template`]).
//! Errors go to stderr (logs too), so `discover`'s stdout is only the List
//! document.

use std::process::ExitCode;
use std::sync::Arc;

use prometheus::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::daemon::cli::{
    DiscoverCommand, DriverCli, DriverCommand, LoggingError, RenderError, RunCommand, init_logging,
    render_document, render_list,
};
use crate::daemon::node_driver::NodeDriver;
use crate::daemon::rescan::{
    PoolId, RescanError, RescanMetrics, Rescanner, Trigger, forward_kernel_uevents,
    scan_with_taints,
};
use crate::daemon::runtime::{OnNode, RuntimeError, run, spawn_signal_handler};
use crate::daemon::template::template_document;
use crate::publish::desired_slices_with_counters;
use crate::scan::inventory::ApiSupport;
use crate::scan::inventory::DeviceInventory;

/// Threads that run async work; scans and other blocking work get their
/// own (tokio's blocking pool), so two are plenty for a node agent.
const WORKER_THREADS: usize = 2;

/// How long an idle blocking thread waits for more work before it exits.
/// Tokio's default is 10 s, exactly the default rescan interval, so the
/// scan thread raced its own exit and was now and then created anew for the
/// next scan (about one new thread a minute at rest on a p5). That cost
/// little CPU (the bench's figure did not move), but it made per-thread
/// figures lose the scan's time with the thread that exited. Five minutes
/// outlasts any rescan interval in use; the thread kept costs its touched
/// stack pages (RSS at rest unchanged, 11.3 MiB).
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(300);

/// What the binary is.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// Binary name (`efa-driver`); without its `-driver`, also the part of
    /// the rescan metrics' names after the project prefix
    /// (`aws_dra_efa_rescans_total`).
    pub binary: &'static str,
    /// `env!("CARGO_PKG_VERSION")` of the driver crate.
    pub version: &'static str,
    /// Default `--driver-name`.
    pub driver_name: &'static str,
    /// Extended resources the classic device plugin of the same hardware
    /// advertises; `run` refuses to start beside it.
    pub device_plugin_resources: &'static [&'static str],
}

impl Program {
    /// `aws_dra_<binary without -driver>`: the project's prefix, then the
    /// driver, as the naming rule in `docs/operations.md` asks.
    pub(crate) fn metrics_prefix(&self) -> String {
        let name = self.binary.strip_suffix("-driver").unwrap_or(self.binary);
        format!(
            "{}{}",
            crate::prepare::metrics::PREFIX,
            name.replace('-', "_")
        )
    }
}

/// Why a driver process ended with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunnerError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Logging(#[from] LoggingError),
    #[error("starting the async runtime: {0}")]
    AsyncRuntime(std::io::Error),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("opening the device inventory: {0}")]
    Open(E),
    #[error("first device scan: {0}")]
    FirstScan(RescanError<E>),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error("no template of instance type {instance_type}: {reason}")]
    Template {
        instance_type: String,
        reason: String,
    },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Parses the command line (exiting with usage on a bad one) and runs the
/// subcommand; errors are printed to stderr with their causes.
pub fn main<I: NodeDriver>(program: &Program) -> ExitCode {
    let cli =
        DriverCli::<I::Flags>::parse_for(program.binary, program.version, program.driver_name);
    match execute::<I>(program, cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = format!("Error: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one parsed command line.
pub(crate) fn execute<I: NodeDriver>(
    program: &Program,
    cli: DriverCli<I::Flags>,
) -> Result<(), RunnerError<I::Error>> {
    match cli.command {
        DriverCommand::Discover(cmd) => discover::<I>(cmd),
        DriverCommand::Run(cmd) => {
            init_logging(cmd.common.log_format, cmd.common.log_filter())?;
            one_malloc_arena();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKER_THREADS)
                .thread_keep_alive(BLOCKING_KEEP_ALIVE)
                .enable_all()
                .build()
                .map_err(RunnerError::AsyncRuntime)?;
            runtime.block_on(serve::<I>(program, cmd))
        }
    }
}

/// Makes every thread allocate from glibc's main arena. By default each
/// thread that allocates gets an arena of its own (up to eight per core),
/// and each keeps its own partly used pages: about 0.3 MiB resident per
/// thread for a process that allocates a few hundred KiB in all. A node
/// agent with two workers and a blocking thread or two never contends
/// enough for the extra arenas to pay. Called before the runtime starts
/// its threads. Other C libraries have one heap anyway (musl): no-op.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a parameter of glibc's allocator; it
        // takes no pointers and is safe to call at any time.
        #[allow(unsafe_code)]
        let applied = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
        if applied != 1 {
            tracing::debug!("glibc refused M_ARENA_MAX=1; threads keep their own arenas");
        }
    }
}

fn discover<I: DeviceInventory>(
    cmd: DiscoverCommand<I::Flags>,
) -> Result<(), RunnerError<I::Error>> {
    let common = &cmd.common;
    init_logging(common.log_format, common.log_filter())?;
    if let Some(instance_type) = &cmd.discover.instance_type {
        return discover_template::<I>(&cmd, instance_type);
    }
    let mut inventory =
        I::open(&common.host_paths(), &cmd.extra, &Registry::new()).map_err(RunnerError::Open)?;
    inventory.set_api_support(&ApiSupport::unknown());
    let pool = scan_with_taints(&mut inventory, &common.driver_name)
        .map_err(|e| RunnerError::FirstScan(RescanError::Scan(e)))?;
    let slices = desired_slices_with_counters(
        &common.driver_name,
        &common.node_name,
        None,
        &pool.devices,
        &pool.counter_sets,
    );
    print!("{}", render_list(&slices, cmd.discover.output)?);
    Ok(())
}

/// `discover --instance-type`: the driver's devices for a node of that
/// type, from its model, with no hardware read
/// ([`crate::daemon::template`]). The pool is named after the instance
/// type unless `--node-name` says otherwise.
fn discover_template<I: DeviceInventory>(
    cmd: &DiscoverCommand<I::Flags>,
    instance_type: &str,
) -> Result<(), RunnerError<I::Error>> {
    let (devices, counter_sets) =
        I::instance_template(instance_type, &cmd.extra).map_err(|reason| {
            RunnerError::Template {
                instance_type: instance_type.to_owned(),
                reason,
            }
        })?;
    let pool = match cmd.common.node_name.as_str() {
        "" => instance_type,
        name => name,
    };
    let document = template_document(
        &cmd.common.driver_name,
        pool,
        devices,
        &counter_sets,
        I::RUNTIME_ONLY_ATTRIBUTES,
    );
    print!("{}", render_document(&document, cmd.discover.output)?);
    Ok(())
}

async fn serve<I: NodeDriver>(
    program: &Program,
    cmd: RunCommand<I::Flags>,
) -> Result<(), RunnerError<I::Error>> {
    // SIGTERM/SIGINT stop the process from here on by cancelling
    // `shutdown`: the sockets are bound before the API server is reached,
    // however long that takes, and are removed on the way out.
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;
    serve_until::<I>(program, cmd, shutdown).await
}

/// `run` until `shutdown`: the first scan from sysfs alone, the rescan
/// loop, and the runtime, which binds kubelet's sockets before it reads
/// the Node; the Node's labels and the API probe reach the scan once the
/// API server answers, followed by a rescan, before anything is prepared
/// or published.
pub(crate) async fn serve_until<I: NodeDriver>(
    program: &Program,
    cmd: RunCommand<I::Flags>,
    shutdown: CancellationToken,
) -> Result<(), RunnerError<I::Error>> {
    let registry = Registry::new();
    let metrics = RescanMetrics::register(&registry, &program.metrics_prefix())?;
    let inventory =
        I::open(&cmd.common.host_paths(), &cmd.extra, &registry).map_err(RunnerError::Open)?;
    let mut options = cmd.runtime_options(program.device_plugin_resources, registry);
    options.managed_node_labels = I::NODE_LABELS;
    let rescan = cmd.rescan_config();
    let (rescanner, feeds) = Rescanner::new(
        inventory,
        PoolId {
            driver: &cmd.common.driver_name,
            pool: &cmd.common.node_name,
        },
        Some(rescan.health_timeout()),
        Some(metrics),
    );
    rescanner
        .rescan(Trigger::Start)
        .await
        .map_err(RunnerError::FirstScan)?;
    tracing::info!(
        node = %cmd.common.node_name,
        driver = %cmd.common.driver_name,
        devices = feeds.devices.borrow().len(),
        rescan_interval_seconds = rescan.interval.as_secs(),
        "discovered devices"
    );
    let driver = rescanner.driver();
    let rescanner = Arc::new(rescanner);
    let (trigger_tx, trigger_rx) = mpsc::channel(1);
    forward_kernel_uevents(I::UEVENT_SUBSYSTEMS, trigger_tx);
    tokio::spawn({
        let rescanner = Arc::clone(&rescanner);
        async move { rescanner.serve_triggers(trigger_rx, rescan).await }
    });
    let wants_probe = I::wants_api_probe(&cmd.extra);
    let driver_name = cmd.common.driver_name.clone();
    let node_name = cmd.common.node_name.clone();
    let on_node: OnNode = Box::new(move |client, node| {
        Box::pin(async move {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let support = if wants_probe {
                crate::publish::api_probe::probe(&client, &driver_name, &node_name).await
            } else {
                ApiSupport::unknown()
            };
            rescanner.set_cluster_facts(&labels, &support);
            if let Err(error) = rescanner.rescan(Trigger::Start).await {
                tracing::warn!(%error, "rescan with the Node's labels failed; keeping the first scan's devices");
            }
        })
    });
    run(driver, feeds, options, on_node, shutdown).await?;
    Ok(())
}

/// Runs `args` (as given to the binary, the first one its name) in this
/// process until `shutdown`, without logging setup or signal handlers: a
/// whole driver for tests (`testing` feature). Errors come as text.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub async fn run_in_process<I: NodeDriver>(
    program: &Program,
    args: Vec<String>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let cli = DriverCli::<I::Flags>::try_parse_for(
        program.binary,
        program.version,
        program.driver_name,
        args,
    )
    .map_err(|e| e.to_string())?;
    let DriverCommand::Run(cmd) = cli.command else {
        return Err("only `run` runs in process".into());
    };
    serve_until::<I>(program, cmd, shutdown)
        .await
        .map_err(|e| e.to_string())
}
