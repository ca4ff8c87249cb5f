//! The bad-input table of the EFA driver, through the real kubelet plugin
//! (gRPC `NodePrepareResources` on its socket, the real driver on a p4d
//! fixture, the claim as the API server would hold it).
//!
//! What every driver must do with bad input is dra-core's conformance suite
//! (`dra_core::testing::conformance`), run here on the EFA driver; the cases
//! below are the EFA driver's own (its config's fields, its device names,
//! its hot-plug), each with the exact message kubelet receives, on the
//! suite's `Node`: after each refusal nothing is left behind (no CDI spec,
//! no checkpoint entry) and a good EFA is still free for the next claim.

use std::path::Path;

use dra_core::testing::conformance::{self, BAD_UID, Node, POOL, Subject};
use efa_driver::attributes::device_name;
use efa_driver::{DRIVER_NAME, EfaDriver};
use serde_json::{Value, json};
use sysfs_fixtures::{Fixture, generate};
use topology::{PciAddress, SysfsRoot};

const UID: &str = BAD_UID;

/// The name of the fixture's `i`-th EFA, as published.
fn efa_of(fixture: &Fixture, i: usize) -> String {
    device_name(fixture.efas[i].bdf.parse::<PciAddress>().unwrap())
}

fn subject(fixture: &Fixture) -> Subject<EfaDriver> {
    Subject {
        driver: EfaDriver::new(SysfsRoot::new(&fixture.sys), &fixture.dev),
        driver_name: DRIVER_NAME,
        cdi_class: "efa",
        claim_name: "efa",
        devices: [efa_of(fixture, 0), efa_of(fixture, 1)],
        good_config: json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"}),
    }
}

/// A p4d fixture (4 EFAs) under `dir`.
fn fixture(dir: &Path) -> Fixture {
    generate("p4d.24xlarge", &dir.join("host")).unwrap()
}

#[tokio::test]
async fn the_efa_driver_passes_the_conformance_suite() {
    conformance::run(|dir| subject(&fixture(dir))).await;
}

/// A node with the EFA driver on a p4d fixture; the fixture, to change it.
async fn node() -> (Node, Fixture, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture(dir.path());
    let node = Node::start(subject(&fixture), dir.path()).await;
    (node, fixture, dir)
}

/// A claim of the first EFA with one opaque config of this driver, refused.
async fn with_config(parameters: Value) -> String {
    let (node, _fixture, _dir) = node().await;
    node.refused_config(parameters).await
}

const PREFIX: &str = "ResourceClaim ml/efa: opaque config #0 (from ResourceClaim): ";

#[tokio::test]
async fn config_kind_of_wrong_type() {
    let got = with_config(json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": 7})).await;
    assert_eq!(
        got,
        format!("{PREFIX}field `kind`: unsupported value 7; accepted values: \"EfaConfig\"")
    );
}

#[tokio::test]
async fn config_unknown_field() {
    let got = with_config(json!({
        "apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig", "interfaces": 2
    }))
    .await;
    assert_eq!(
        got,
        format!("{PREFIX}field `interfaces`: unknown field; accepted fields: apiVersion, kind")
    );
}

#[tokio::test]
async fn config_wrong_api_version() {
    let got =
        with_config(json!({"apiVersion": "efa.networking.k8s.aws/v2", "kind": "EfaConfig"})).await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `apiVersion`: unsupported value \"efa.networking.k8s.aws/v2\"; accepted values: \"efa.networking.k8s.aws/v1\""
        )
    );
}

#[tokio::test]
async fn config_wrong_kind() {
    let got =
        with_config(json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaSettings"}))
            .await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `kind`: unsupported value \"EfaSettings\"; accepted values: \"EfaConfig\""
        )
    );
}

#[tokio::test]
async fn config_missing_kind() {
    let got = with_config(json!({"apiVersion": "efa.networking.k8s.aws/v1"})).await;
    assert_eq!(
        got,
        format!("{PREFIX}field `kind`: missing; accepted values: \"EfaConfig\"")
    );
}

#[tokio::test]
async fn config_of_another_driver_under_this_driver() {
    let got = with_config(json!({
        "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 2
    }))
    .await;
    assert_eq!(
        got,
        format!(
            "{PREFIX}field `apiVersion`: \"neuron.aws.com/v1\" is not an apiVersion of this driver (accepted values: \"efa.networking.k8s.aws/v1\"); a config meant for another driver must name that driver in `opaque.driver`"
        )
    );
}

#[tokio::test]
async fn config_over_the_size_limit() {
    let got = with_config(json!({
        "apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig",
        "comment": "x".repeat(12 * 1024)
    }))
    .await;
    assert_eq!(
        got,
        format!("{PREFIX}parameters are 12362 bytes of JSON; the limit is 10240 bytes")
    );
}

#[tokio::test]
async fn device_not_in_the_inventory() {
    let (node, _fixture, _dir) = node().await;
    let bad = node.claim(UID, &[(DRIVER_NAME, POOL, "efa-0000-ff-1f-7")], vec![]);
    assert_eq!(
        node.refused(bad).await,
        "ResourceClaim ml/efa: preparing devices failed: EFA efa-0000-ff-1f-7 is not on this node: no PCI function 0000:ff:1f.7 in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
    );
}

#[tokio::test]
async fn device_name_of_another_driver() {
    let (node, _fixture, _dir) = node().await;
    let bad = node.claim(UID, &[(DRIVER_NAME, POOL, "neuron-device-0")], vec![]);
    assert_eq!(
        node.refused(bad).await,
        "ResourceClaim ml/efa: preparing devices failed: device \"neuron-device-0\" is not an EFA device name of this driver (expected efa-DDDD-BB-DD-F)"
    );
}

#[tokio::test]
async fn device_vanished_between_allocation_and_prepare() {
    let (node, fixture, _dir) = node().await;
    let kept = efa_of(&fixture, 1);
    let gone = efa_of(&fixture, 3);
    let bdf = fixture.efas[3].bdf.clone();
    fixture.remove_efa(&bdf).unwrap();
    let bad = node.claim(
        UID,
        &[(DRIVER_NAME, POOL, &kept), (DRIVER_NAME, POOL, &gone)],
        vec![],
    );
    assert_eq!(
        node.refused(bad).await,
        format!(
            "ResourceClaim ml/efa: preparing devices failed: EFA {gone} is not on this node: no PCI function {bdf} in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
        )
    );
    // The EFA allocated beside the vanished one was not half-prepared.
    node.claims.insert(node.claim(
        "4e000000-0000-4000-8000-0000000000e7",
        &[(DRIVER_NAME, POOL, &kept)],
        vec![],
    ));
    assert!(
        node.prepare("4e000000-0000-4000-8000-0000000000e7")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn oversized_claim_more_efas_than_the_node_has() {
    // p4d has 4 EFAs; a fifth result cannot be on this node, and the four
    // real ones must not be left prepared.
    let (node, fixture, _dir) = node().await;
    let mut devices: Vec<String> = (0..4).map(|i| efa_of(&fixture, i)).collect();
    devices.push("efa-0000-ff-00-0".into());
    let results: Vec<(&str, &str, &str)> = devices
        .iter()
        .map(|d| (DRIVER_NAME, POOL, d.as_str()))
        .collect();
    let bad = node.claim(UID, &results, vec![]);
    assert_eq!(
        node.refused(bad).await,
        "ResourceClaim ml/efa: preparing devices failed: EFA efa-0000-ff-00-0 is not on this node: no PCI function 0000:ff:00.0 in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
    );
}
