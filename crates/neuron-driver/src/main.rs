//! `neuron-driver`: the DRA driver for AWS Neuron chips.
//!
//! `run` (the default) serves the kubelet plugin and publishes the node's
//! chips; `discover` prints the ResourceSlices `run` would publish, touching
//! no cluster. Logs go to stderr, so `discover`'s stdout is only the List.

use std::sync::{Arc, RwLock};

use anyhow::Context;
use dra_core::cli::{CommonArgs, DiscoverCommand, DriverCli, DriverCommand, RunCommand};
use neuron_driver::bdf::NeuronIoctl;
use neuron_driver::hotplug::{
    DEFAULT_RESCAN_INTERVAL, RELEVANT_SUBSYSTEMS, Scanner, apply, watch_devices,
};
use neuron_driver::{DRIVER_NAME, NeuronDriver, devices};
use topology::SysfsRoot;

fn main() -> anyhow::Result<()> {
    let cli: DriverCli =
        DriverCli::parse_for("neuron-driver", env!("CARGO_PKG_VERSION"), DRIVER_NAME);
    match cli.command {
        DriverCommand::Discover(d) => discover(d),
        DriverCommand::Run(r) => run(r),
    }
}

fn logging(common: &CommonArgs) -> anyhow::Result<()> {
    dra_core::cli::init_logging(common.log_format, common.log_filter())?;
    Ok(())
}

fn scanner(common: &CommonArgs) -> Scanner {
    Scanner::new(
        SysfsRoot::new(&common.sysfs_root),
        common.dev_root.clone(),
        Box::new(NeuronIoctl),
    )
}

fn discover(cmd: DiscoverCommand) -> anyhow::Result<()> {
    let common = &cmd.common;
    logging(common)?;
    let inventory = scanner(common).scan()?;
    let devices = devices(&inventory);
    let slices =
        dra_core::publish::desired_slices(&common.driver_name, &common.node_name, None, &devices);
    let text = dra_core::cli::render_list(&slices, cmd.discover.output)?;
    print!("{text}");
    Ok(())
}

fn run(cmd: RunCommand) -> anyhow::Result<()> {
    logging(&cmd.common)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let mut scanner = scanner(&cmd.common);
        let first = scanner.scan().context("discovering Neuron chips")?;
        tracing::info!(
            chips = first.chips.len(),
            instance_type = first.instance_type.as_ref().map(|t| t.as_str()),
            "discovered Neuron chips"
        );
        let shared = Arc::new(RwLock::new(Default::default()));
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        apply(first, &shared, &tx);
        let (uevent_tx, uevent_rx) = tokio::sync::mpsc::channel(1);
        match dra_core::uevent::UeventSocket::open() {
            Ok(socket) => {
                tokio::spawn(async move {
                    dra_core::uevent::forward_uevents(socket, RELEVANT_SUBSYSTEMS, uevent_tx, ())
                        .await
                });
            }
            Err(error) => {
                tracing::warn!(%error, "no kernel uevents; chip changes are seen by the periodic rescan only")
            }
        }
        tokio::spawn(watch_devices(
            scanner,
            shared.clone(),
            tx,
            uevent_rx,
            DEFAULT_RESCAN_INTERVAL,
        ));
        let driver = NeuronDriver::new(shared);
        let options = dra_core::RuntimeOptions {
            common: cmd.common,
            run: cmd.run,
            device_plugin_resources: neuron_driver::safety::DEVICE_PLUGIN_RESOURCES,
            metrics: prometheus::Registry::new(),
        };
        dra_core::runtime::run(driver, rx, options).await?;
        Ok(())
    })
}
