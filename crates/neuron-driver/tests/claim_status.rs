//! What the Neuron driver reports in a claim's `status.devices` entries:
//! chip, device node, the cores given, LNC and the visible cores, the same
//! values its container edits carry.

use std::sync::{Arc, RwLock};

use dra_core::{AllocatedDevice, ClaimRef, Driver};
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{BdfCache, discover};
use neuron_driver::{NeuronConfig, NeuronDriver};
use serde_json::json;
use topology::{PciAddress, SysfsRoot};

fn allocated(device: &str, lnc: Option<u32>) -> AllocatedDevice<NeuronConfig> {
    AllocatedDevice {
        request: "n".into(),
        pool: "n1".into(),
        device: device.into(),
        admin_access: false,
        config: lnc.map(|l| NeuronConfig {
            logical_neuron_core: Some(l),
            ultraserver_mode: None,
        }),
    }
}

fn driver(instance: &str) -> (tempfile::TempDir, NeuronDriver) {
    let dir = tempfile::tempdir().unwrap();
    let fx = sysfs_fixtures::generate(instance, dir.path()).unwrap();
    let bdf = StaticBdf {
        answers: fx
            .neuron_chips
            .iter()
            .map(|c| {
                (
                    fx.dev.join(format!("neuron{}", c.index)),
                    Ok(c.bdf.parse::<PciAddress>().unwrap()),
                )
            })
            .collect(),
    };
    let inventory = discover(
        &SysfsRoot::new(&fx.sys),
        &fx.dev,
        &bdf,
        &mut BdfCache::default(),
    )
    .unwrap();
    (dir, NeuronDriver::new(Arc::new(RwLock::new(inventory))))
}

fn claim() -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: "c".into(),
        uid: "u1".into(),
    }
}

#[test]
fn chips_and_cores_report_what_the_container_gets() {
    let (_dir, driver) = driver("trn2.48xlarge");
    let status = driver.device_status(
        &claim(),
        &[
            allocated("neurondevice2", None),
            allocated("neurondevice0", None),
        ],
    );
    assert_eq!(status.len(), 2);
    assert_eq!(status[0].device, "neurondevice2");
    assert_eq!(
        serde_json::Value::Object(status[0].data.clone()),
        json!({
            "chip": 2,
            "deviceNode": "/dev/neuron2",
            "cores": [0, 1, 2, 3, 4, 5, 6, 7],
            "logicalNeuronCore": 2,
            "visibleCores": "0-3,8-11",
        })
    );
    assert_eq!(status[1].data["chip"], json!(0));
    assert_eq!(status[1].network, None);

    // Single cores at LNC 1: each core's entry names its core.
    let status = driver.device_status(
        &claim(),
        &[
            allocated("neurondevice1-core-2", Some(1)),
            allocated("neurondevice1-core-3", Some(1)),
        ],
    );
    assert_eq!(status.len(), 2);
    assert_eq!(status[0].data["cores"], json!([2]));
    assert_eq!(status[1].data["cores"], json!([3]));
    assert_eq!(status[0].data["logicalNeuronCore"], json!(1));
    assert_eq!(status[0].data["visibleCores"], json!("10-11"));
}

#[test]
fn a_claim_that_no_longer_resolves_has_no_data() {
    let (_dir, driver) = driver("inf2.48xlarge");
    let status = driver.device_status(&claim(), &[allocated("neurondevice99", None)]);
    assert!(status.is_empty(), "{status:?}");
}
