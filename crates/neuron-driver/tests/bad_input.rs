//! The bad-input table of the Neuron driver, through the real kubelet
//! plugin (gRPC `NodePrepareResources` on its socket, the real driver on an
//! inf2 fixture, the claim as the API server would hold it).
//!
//! What every driver must do with bad input is dra-core's conformance suite
//! (`dra_core::testing::conformance`), run here on the Neuron driver; the
//! cases below are the Neuron driver's own (its config's fields, its device
//! names, a chip gone from the inventory, a claim spanning pools), each with
//! the exact message kubelet receives, on the suite's `Node`: after each
//! refusal nothing is left behind (no CDI spec, no checkpoint entry) and a
//! good chip is still free for the next claim.

use std::path::Path;
use std::sync::{Arc, RwLock};

use dra_core::testing::conformance::{self, BAD_UID, Node, POOL, Subject};
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{BdfCache, NodeInventory, discover};
use neuron_driver::prepare::SharedInventory;
use neuron_driver::{DRIVER_NAME, NeuronDriver};
use serde_json::{Value, json};
use sysfs_fixtures::{Fixture, generate};
use topology::{PciAddress, SysfsRoot};

const UID: &str = BAD_UID;

/// What a rescan of the fixture finds now (the BDF ioctl answered as the
/// kernel would for the chips still there).
fn scan(fixture: &Fixture) -> NodeInventory {
    let bdf = StaticBdf {
        answers: fixture
            .neuron_chips
            .iter()
            .map(|c| {
                (
                    fixture.dev.join(format!("neuron{}", c.index)),
                    Ok(c.bdf.parse::<PciAddress>().unwrap()),
                )
            })
            .collect(),
    };
    discover(
        &SysfsRoot::new(&fixture.sys),
        &fixture.dev,
        &bdf,
        &mut BdfCache::default(),
    )
    .unwrap()
}

/// The published name of chip `i`.
fn chip(i: u32) -> String {
    format!("neurondevice{i}")
}

fn subject(inventory: &SharedInventory) -> Subject<NeuronDriver> {
    Subject {
        driver: NeuronDriver::new(inventory.clone()),
        driver_name: DRIVER_NAME,
        cdi_class: "neuron",
        claim_name: "chips",
        devices: [chip(0), chip(3)],
        good_config: json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}),
    }
}

/// An inf2.48xlarge fixture (12 chips) under `dir`.
fn fixture(dir: &Path) -> Fixture {
    generate("inf2.48xlarge", &dir.join("host")).unwrap()
}

#[tokio::test]
async fn the_neuron_driver_passes_the_conformance_suite() {
    conformance::run(|dir| subject(&Arc::new(RwLock::new(scan(&fixture(dir)))))).await;
}

/// A node with the Neuron driver on an inf2 fixture; the fixture and the
/// driver's inventory, to change them.
async fn node() -> (Node, Fixture, SharedInventory, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let inventory: SharedInventory = Arc::new(RwLock::new(scan(&fixture)));
    let node = Node::start(subject(&inventory), dir.path()).await;
    (node, fixture, inventory, dir)
}

/// A claim of chip 0 with one opaque config of this driver, refused.
async fn with_config(parameters: Value) -> String {
    let (node, _fixture, _inventory, _dir) = node().await;
    node.refused_config(parameters).await
}

const PREFIX: &str = "ResourceClaim ml/chips: opaque config #0 (from ResourceClaim): ";
const FAILED: &str = "ResourceClaim ml/chips: preparing devices failed: ";

fn neuron(extra: Value) -> Value {
    let mut v = json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"});
    if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
        v.extend(extra);
    }
    v
}

#[tokio::test]
async fn config_parameters_not_an_object() {
    let got = with_config(json!("logicalNeuronCore=2")).await;
    assert_eq!(
        got,
        format!("{PREFIX}parameters must be a JSON object, got a string")
    );
}

#[tokio::test]
async fn config_lnc_of_wrong_type() {
    let got = with_config(neuron(json!({"logicalNeuronCore": "2"}))).await;
    assert_eq!(
        got,
        format!("{PREFIX}field `logicalNeuronCore`: invalid type: string \"2\", expected u32")
    );
}

#[tokio::test]
async fn config_lnc_negative() {
    let got = with_config(neuron(json!({"logicalNeuronCore": -1}))).await;
    assert_eq!(
        got,
        format!("{PREFIX}field `logicalNeuronCore`: invalid value: integer `-1`, expected u32")
    );
}

#[tokio::test]
async fn config_lnc_out_of_range() {
    let got = with_config(neuron(json!({"logicalNeuronCore": 4}))).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `logicalNeuronCore`: value 4 is out of range; accepted values: 1 (every chip), 2 (only chips with 8 physical cores: Trainium2, Trainium3)"
        )
    );
}

#[tokio::test]
async fn config_lnc_not_supported_by_this_chip() {
    // In range, but inf2 chips have 2 cores: refused at prepare time.
    let got = with_config(neuron(json!({"logicalNeuronCore": 2}))).await;
    assert_eq!(
        got,
        format!(
            "{FAILED}NeuronConfig logicalNeuronCore: 2 is not supported on chip 0 (Inferentia2, 2 physical cores); allowed on this chip: 1"
        )
    );
}

#[tokio::test]
async fn config_unknown_field() {
    let got = with_config(neuron(json!({"lnc": 2}))).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `lnc`: unknown field; accepted fields: apiVersion, kind, logicalNeuronCore"
        )
    );
}

#[tokio::test]
async fn config_wrong_api_version() {
    let got =
        with_config(json!({"apiVersion": "neuron.aws.com/v1beta1", "kind": "NeuronConfig"})).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `apiVersion`: unsupported value \"neuron.aws.com/v1beta1\"; accepted values: \"neuron.aws.com/v1\", \"neuron.aws.com/v1alphav1\", \"resource.neuron.aws.com/v1alphav1\""
        )
    );
}

#[tokio::test]
async fn config_wrong_kind() {
    let got =
        with_config(json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronSettings"})).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `kind`: unsupported value \"NeuronSettings\"; accepted values: \"NeuronConfig\", \"UltraServerConfig\""
        )
    );
}

#[tokio::test]
async fn config_missing_api_version() {
    let got = with_config(json!({"kind": "NeuronConfig"})).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `apiVersion`: missing; accepted values: \"neuron.aws.com/v1\", \"neuron.aws.com/v1alphav1\", \"resource.neuron.aws.com/v1alphav1\""
        )
    );
}

#[tokio::test]
async fn config_of_another_driver_under_this_driver() {
    let got =
        with_config(json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"})).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `apiVersion`: \"efa.networking.k8s.aws/v1\" is not an apiVersion of this driver (accepted values: \"neuron.aws.com/v1\", \"neuron.aws.com/v1alphav1\", \"resource.neuron.aws.com/v1alphav1\"); a config meant for another driver must name that driver in `opaque.driver`"
        )
    );
}

#[tokio::test]
async fn config_over_the_size_limit() {
    let got = with_config(neuron(json!({"note": "x".repeat(12 * 1024)}))).await;
    assert!(
        got.starts_with(&format!("{PREFIX}parameters are ")),
        "{got}"
    );
    assert!(
        got.ends_with(" bytes of JSON; the limit is 10240 bytes"),
        "{got}"
    );
}

#[tokio::test]
async fn device_not_in_the_inventory() {
    let (node, _fixture, _inventory, _dir) = node().await;
    let bad = node.claim(UID, &[(DRIVER_NAME, POOL, &chip(99))], vec![]);
    assert_eq!(
        node.refused(bad).await,
        format!(
            "{FAILED}chip 99 (neurondevice99) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
}

#[tokio::test]
async fn device_name_of_another_driver() {
    let (node, _fixture, _inventory, _dir) = node().await;
    let bad = node.claim(UID, &[(DRIVER_NAME, POOL, "efa-0000-10-1c-0")], vec![]);
    assert_eq!(
        node.refused(bad).await,
        format!(
            "{FAILED}device \"efa-0000-10-1c-0\" is not a Neuron chip or core of this driver (expected neurondevice<index>, neurondevice<index>-core-<core> or neuronnode)"
        )
    );
}

#[tokio::test]
async fn device_vanished_between_allocation_and_prepare() {
    let (node, fixture, inventory, _dir) = node().await;
    // Chip 5 is hot-unplugged and the next rescan no longer has it.
    let bdf = fixture.neuron_chips[5].bdf.clone();
    fixture.remove_device(&bdf).unwrap();
    *inventory.write().unwrap() = scan(&fixture);
    let bad = node.claim(
        UID,
        &[(DRIVER_NAME, POOL, &chip(4)), (DRIVER_NAME, POOL, &chip(5))],
        vec![],
    );
    assert_eq!(
        node.refused(bad).await,
        format!(
            "{FAILED}chip 5 (neurondevice5) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
    // The chip allocated beside the vanished one was not half-prepared.
    node.claims.insert(node.claim(
        "4e000000-0000-4000-8000-0000000000e7",
        &[(DRIVER_NAME, POOL, &chip(4))],
        vec![],
    ));
    assert!(
        node.prepare("4e000000-0000-4000-8000-0000000000e7")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn results_in_another_pool() {
    let (node, _fixture, _inventory, _dir) = node().await;
    let bad = node.claim(
        UID,
        &[
            (DRIVER_NAME, POOL, &chip(1)),
            (DRIVER_NAME, "node-b", &chip(2)),
        ],
        vec![],
    );
    assert_eq!(
        node.refused(bad).await,
        "ResourceClaim ml/chips: device neurondevice2 of request chips is in pool node-b, but this node's pool is node-a: the claim was allocated devices of another node; delete the pod so that it is scheduled where its devices are"
    );
}

#[tokio::test]
async fn oversized_claim_more_chips_than_the_node_has() {
    // inf2.48xlarge has 12 chips; a 13th result cannot be on this node.
    let (node, _fixture, _inventory, _dir) = node().await;
    let devices: Vec<String> = (0..13).map(chip).collect();
    let results: Vec<(&str, &str, &str)> = devices
        .iter()
        .map(|d| (DRIVER_NAME, POOL, d.as_str()))
        .collect();
    let bad = node.claim(UID, &results, vec![]);
    assert_eq!(
        node.refused(bad).await,
        format!(
            "{FAILED}chip 12 (neurondevice12) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
}
