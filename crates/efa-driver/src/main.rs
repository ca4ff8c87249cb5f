//! `efa-driver`: the DRA driver for Elastic Fabric Adapters. `run` (the
//! DaemonSet entry point, the default) and `discover`; everything but the
//! EFA-specific parts is [`dra_core::run`].

use efa_driver::{DRIVER_NAME, EfaInventory, safety};

fn main() -> std::process::ExitCode {
    dra_core::run::<EfaInventory>(&dra_core::Program {
        binary: "efa-driver",
        version: env!("CARGO_PKG_VERSION"),
        driver_name: DRIVER_NAME,
        device_plugin_resources: safety::DEVICE_PLUGIN_RESOURCES,
    })
}
