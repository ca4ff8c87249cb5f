//! Opaque device configs as a claim author writes them (the JSON kube
//! hands us), decoded strictly for both drivers. Never a panic; a config
//! either decodes or is refused with an error that names what was wrong.
#![no_main]

use dra_core::decode_config;
use efa_driver::EfaConfig;
use libfuzzer_sys::fuzz_target;
use neuron_driver::NeuronConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(parameters) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Err(e) = decode_config::<EfaConfig>(&parameters) {
        assert!(!e.to_string().is_empty());
    }
    if let Err(e) = decode_config::<NeuronConfig>(&parameters) {
        assert!(!e.to_string().is_empty());
    }
});
