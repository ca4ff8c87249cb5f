//! `efa-driver`: the DRA driver for Elastic Fabric Adapters.
//!
//! `run` (the DaemonSet entry point, the default) and `discover` (prints the
//! ResourceSlices `run` would publish, touching no cluster). The flags are
//! `dra-core`'s shared ones plus `--rescan-interval` for `run`.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use dra_core::cli::{DiscoverCommand, DriverCli, DriverCommand, init_logging, render_list};
use dra_core::publish::desired_slices;
use efa_driver::hotplug::{self, EfaMetrics, Inventory, Trigger, WatchConfig};
use efa_driver::{DRIVER_NAME, EfaDriver, attributes, discovery, safety};
use topology::SysfsRoot;

/// Flags of `run` that only this driver has.
#[derive(Debug, Clone, Args)]
struct EfaRunArgs {
    /// Seconds between fallback rescans of sysfs (hot-plug is normally seen
    /// at once through kernel uevents; the rescan catches lost events).
    #[arg(long, env = "RESCAN_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    rescan_interval: u64,
}

type RunCommand = dra_core::cli::RunCommand<EfaRunArgs>;
type Command = DriverCommand<EfaRunArgs>;

/// Parses the command line: dra-core's shared CLI (`run` implied when no
/// subcommand is given, `--driver-name` defaulting to [`DRIVER_NAME`]) plus
/// [`EfaRunArgs`] on `run`.
fn parse(args: impl IntoIterator<Item = OsString>) -> Result<DriverCli<EfaRunArgs>, clap::Error> {
    DriverCli::try_parse_for("efa-driver", env!("CARGO_PKG_VERSION"), DRIVER_NAME, args)
}

fn main() -> anyhow::Result<()> {
    let cli = parse(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Discover(cmd) => discover(cmd),
        Command::Run(cmd) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(run(cmd))
        }
    }
}

fn discover(cmd: DiscoverCommand) -> anyhow::Result<()> {
    let common = &cmd.common;
    init_logging(common.log_format, common.log_filter())?;
    let root = SysfsRoot::new(&common.sysfs_root);
    let found = discovery::discover(&root)?;
    for u in &found.unusable {
        tracing::warn!(pci_bus_id = %u.address, reason = %u.reason, "EFA present but not published");
    }
    let devices = attributes::devices(&found);
    let slices = desired_slices(&common.driver_name, &common.node_name, None, &devices);
    print!("{}", render_list(&slices, cmd.discover.output)?);
    Ok(())
}

async fn run(cmd: RunCommand) -> anyhow::Result<()> {
    let common = &cmd.common;
    init_logging(common.log_format, common.log_filter())?;
    let root = SysfsRoot::new(&common.sysfs_root);
    let registry = prometheus::Registry::new();
    let metrics = EfaMetrics::register(&registry).context("registering the EFA metrics")?;
    let mut inventory = Inventory::new(root.clone(), Some(metrics));
    let initial = inventory
        .rescan(Trigger::Start)
        .context("initial EFA discovery")?
        .unwrap_or_default();
    tracing::info!(
        node = %common.node_name,
        driver = %common.driver_name,
        devices = initial.len(),
        "discovered EFAs"
    );
    let (tx, devices) = tokio::sync::watch::channel(initial);
    let (trigger_tx, trigger_rx) = tokio::sync::mpsc::channel(1);
    match dra_core::uevent::UeventSocket::open() {
        Ok(socket) => {
            tokio::spawn(async move {
                dra_core::uevent::forward_uevents(
                    socket,
                    hotplug::RELEVANT_SUBSYSTEMS,
                    trigger_tx,
                    Trigger::Uevent,
                )
                .await
            });
        }
        Err(error) => {
            tracing::warn!(%error, "no kernel uevents; hot-plug is seen by the periodic rescan only")
        }
    }
    let watch_config = WatchConfig {
        rescan_interval: Duration::from_secs(cmd.extra.rescan_interval),
        ..WatchConfig::default()
    };
    tokio::spawn(hotplug::watch_devices(
        inventory,
        tx,
        trigger_rx,
        watch_config,
    ));
    let driver = EfaDriver::new(root, &common.dev_root);

    let options = dra_core::RuntimeOptions {
        common: cmd.common,
        run: cmd.run,
        device_plugin_resources: safety::DEVICE_PLUGIN_RESOURCES,
        metrics: registry,
    };
    dra_core::runtime::run(driver, devices, options).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn run_is_the_default_and_driver_name_defaults() {
        let cli = parse(args(&["efa-driver", "--node-name", "n1"])).unwrap();
        let Command::Run(r) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(r.common.driver_name, DRIVER_NAME);
        assert_eq!(r.extra.rescan_interval, 60);
        let cli = parse(args(&[
            "efa-driver",
            "discover",
            "--node-name",
            "n1",
            "-o",
            "yaml",
            "--sysfs-root",
            "/f/sys",
        ]))
        .unwrap();
        let Command::Discover(d) = cli.command else {
            panic!("discover expected")
        };
        assert_eq!(d.common.driver_name, DRIVER_NAME);
        assert_eq!(d.common.sysfs_root, std::path::PathBuf::from("/f/sys"));
    }

    #[test]
    fn rescan_interval_flag() {
        let cli = parse(args(&[
            "efa-driver",
            "run",
            "--node-name",
            "n1",
            "--rescan-interval",
            "5",
        ]))
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(r.extra.rescan_interval, 5);
        for bad in ["0", "-1", "soon"] {
            assert!(
                parse(args(&[
                    "efa-driver",
                    "run",
                    "--node-name",
                    "n1",
                    "--rescan-interval",
                    bad
                ]))
                .is_err(),
                "{bad}"
            );
        }
        // discover has no rescan interval
        assert!(
            parse(args(&[
                "efa-driver",
                "discover",
                "--node-name",
                "n",
                "--rescan-interval",
                "5"
            ]))
            .is_err()
        );
    }
}
