//! `neuron-driver`: the DRA driver for AWS Neuron chips. `run` (the
//! DaemonSet entry point, the default) and `discover`; everything but the
//! Neuron-specific parts is [`dra_core::run`].

use neuron_driver::{DRIVER_NAME, NeuronInventory, safety};

fn main() -> std::process::ExitCode {
    dra_core::run::<NeuronInventory>(&dra_core::Program {
        binary: "neuron-driver",
        version: env!("CARGO_PKG_VERSION"),
        driver_name: DRIVER_NAME,
        device_plugin_resources: safety::DEVICE_PLUGIN_RESOURCES,
    })
}
