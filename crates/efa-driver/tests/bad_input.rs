//! The bad-input table of the EFA driver, through the real kubelet plugin
//! (gRPC `NodePrepareResources` on its socket, the real driver on a p4d
//! fixture, the claim as the API server would hold it).
//!
//! Each case asserts the exact message kubelet receives (and turns into the
//! pod's event, prefixed with the claim), and that nothing is left behind:
//! no CDI spec and no checkpoint entry for the claim, and the claim's good
//! devices still free for the next claim.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dra_core::proto::dra_v1;
use dra_core::self_check::unix_channel;
use dra_core::{InMemoryClaimSource, KubeletPlugin, PluginMetrics, PluginOptions, RunningPlugin};
use efa_driver::attributes::device_name;
use efa_driver::{DRIVER_NAME, EfaDriver};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};
use sysfs_fixtures::{Fixture, generate};
use tokio_util::sync::CancellationToken;
use topology::{PciAddress, SysfsRoot};

const POOL: &str = "node-a";
const UID: &str = "uid-bad";

struct Node {
    _dir: tempfile::TempDir,
    fixture: Fixture,
    cdi_root: PathBuf,
    checkpoint: PathBuf,
    claims: InMemoryClaimSource,
    token: CancellationToken,
    running: Option<RunningPlugin>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

async fn node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let fixture = generate("p4d.24xlarge", &dir.path().join("host")).unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("boot_id"), "boot-1\n").unwrap();
    let mut options = PluginOptions::new(DRIVER_NAME, "efa");
    options.registrar_dir = root.join("registry");
    options.plugins_dir = root.join("plugins");
    options.cdi_root = root.join("cdi");
    options.boot_id_path = root.join("boot_id");
    options.pool = Some(POOL.into());
    let checkpoint = options.sockets().data_dir.join("checkpoint.json");
    let claims = InMemoryClaimSource::new();
    let metrics = PluginMetrics::register(&prometheus::Registry::new()).unwrap();
    let token = CancellationToken::new();
    let driver = EfaDriver::new(SysfsRoot::new(&fixture.sys), &fixture.dev);
    let running = KubeletPlugin::new(driver, Arc::new(claims.clone()), options.clone(), metrics)
        .start(token.clone())
        .await
        .unwrap();
    Node {
        _dir: dir,
        fixture,
        cdi_root: options.cdi_root,
        checkpoint,
        claims,
        token,
        running: Some(running),
    }
}

/// The name of the fixture's `i`-th EFA, as published.
fn efa(node: &Node, i: usize) -> String {
    device_name(node.fixture.efas[i].bdf.parse::<PciAddress>().unwrap())
}

/// An opaque config entry of a claim.
fn config(driver: &str, parameters: Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: "FromClaim".into(),
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

/// `results`: (driver, pool, device), all for request `efa`.
fn claim(
    uid: &str,
    results: &[(&str, &str, &str)],
    configs: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ml".into());
    c.metadata.name = Some("efa".into());
    c.metadata.uid = Some(uid.into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                            request: "efa".into(),
                            driver: driver.to_string(),
                            pool: pool.to_string(),
                            device: device.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                config: Some(configs),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

/// Kubelet's call for one claim: its devices' CDI ids, or its error.
async fn prepare(node: &Node, uid: &str) -> Result<Vec<String>, String> {
    let socket = &node.running.as_ref().unwrap().sockets.plugin;
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(unix_channel(socket).await.unwrap());
    let response = tokio::time::timeout(
        Duration::from_secs(30),
        client.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "ml".into(),
                uid: uid.into(),
                name: "efa".into(),
            }],
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let answer = response.claims.get(uid).cloned().unwrap();
    if answer.error.is_empty() {
        Ok(answer
            .devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect())
    } else {
        Err(answer.error)
    }
}

/// Nothing of `uid` on the node: no CDI spec names it, the checkpoint
/// (if any) has no entry for it.
fn assert_nothing_left(node: &Node, uid: &str) {
    let specs: Vec<String> = std::fs::read_dir(&node.cdi_root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(uid))
        .collect();
    assert!(specs.is_empty(), "CDI specs left for {uid}: {specs:?}");
    if let Ok(text) = std::fs::read_to_string(&node.checkpoint) {
        let checkpoint: Value = serde_json::from_str(&text).unwrap();
        assert!(
            checkpoint["claims"].get(uid).is_none(),
            "checkpoint entry left for {uid}: {text}"
        );
    }
}

/// Prepares `bad` (uid [`UID`]) and returns its error, after checking that
/// nothing was left behind and that the fixture's first EFA is still free
/// for a good claim.
async fn refused(node: &Node, bad: ResourceClaim) -> String {
    node.claims.insert(bad);
    let error = prepare(node, UID).await.unwrap_err();
    assert_nothing_left(node, UID);
    let good = efa(node, 0);
    node.claims.insert(claim(
        "uid-good",
        &[(DRIVER_NAME, POOL, &good)],
        vec![config(
            DRIVER_NAME,
            json!({"apiVersion": "efa.networking.k8s.aws/v1", "kind": "EfaConfig"}),
        )],
    ));
    let ids = prepare(node, "uid-good").await.unwrap();
    assert_eq!(ids, vec![format!("k8s.{DRIVER_NAME}/efa=uid-good-{good}")]);
    error
}

/// A claim of the first EFA with one opaque config of this driver.
async fn with_config(parameters: Value) -> String {
    let node = node().await;
    let device = efa(&node, 0);
    let bad = claim(
        UID,
        &[(DRIVER_NAME, POOL, &device)],
        vec![config(DRIVER_NAME, parameters)],
    );
    refused(&node, bad).await
}

const PREFIX: &str = "ResourceClaim ml/efa: opaque config #0 (from ResourceClaim): ";

#[tokio::test]
async fn a_good_claim_prepares_and_leaves_its_spec() {
    let node = node().await;
    let device = efa(&node, 1);
    node.claims
        .insert(claim(UID, &[(DRIVER_NAME, POOL, &device)], vec![]));
    let ids = prepare(&node, UID).await.unwrap();
    assert_eq!(ids, vec![format!("k8s.{DRIVER_NAME}/efa={UID}-{device}")]);
    // The control for `assert_nothing_left`: it does see a prepared claim.
    let left = std::panic::catch_unwind(|| assert_nothing_left(&node, UID));
    assert!(left.is_err(), "a prepared claim must be visible");
}

#[tokio::test]
async fn config_parameters_not_an_object() {
    let got = with_config(json!(["EfaConfig"])).await;
    assert_eq!(
        got,
        format!("{PREFIX}parameters must be a JSON object, got an array")
    );
}

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
async fn another_drivers_config_is_not_ours_to_check() {
    // A NeuronConfig addressed to the Neuron driver, in an EFA claim: not
    // decoded here, so the claim prepares.
    let node = node().await;
    let device = efa(&node, 2);
    node.claims.insert(claim(
        UID,
        &[(DRIVER_NAME, POOL, &device)],
        vec![config("neuron.aws.com", json!({"anything": true}))],
    ));
    assert!(prepare(&node, UID).await.is_ok());
}

#[tokio::test]
async fn device_not_in_the_inventory() {
    let node = node().await;
    let bad = claim(UID, &[(DRIVER_NAME, POOL, "efa-0000-ff-1f-7")], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/efa: preparing devices failed: EFA efa-0000-ff-1f-7 is not on this node: no PCI function 0000:ff:1f.7 in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
    );
}

#[tokio::test]
async fn device_name_of_another_driver() {
    let node = node().await;
    let bad = claim(UID, &[(DRIVER_NAME, POOL, "neuron-device-0")], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/efa: preparing devices failed: device \"neuron-device-0\" is not an EFA device name of this driver (expected efa-DDDD-BB-DD-F)"
    );
}

#[tokio::test]
async fn device_vanished_between_allocation_and_prepare() {
    let node = node().await;
    let kept = efa(&node, 1);
    let gone = efa(&node, 3);
    let bdf = node.fixture.efas[3].bdf.clone();
    node.fixture.remove_efa(&bdf).unwrap();
    let bad = claim(
        UID,
        &[(DRIVER_NAME, POOL, &kept), (DRIVER_NAME, POOL, &gone)],
        vec![],
    );
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "ResourceClaim ml/efa: preparing devices failed: EFA {gone} is not on this node: no PCI function {bdf} in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
        )
    );
    // The EFA allocated beside the vanished one was not half-prepared.
    node.claims
        .insert(claim("uid-kept", &[(DRIVER_NAME, POOL, &kept)], vec![]));
    assert!(prepare(&node, "uid-kept").await.is_ok());
}

#[tokio::test]
async fn results_only_for_another_driver() {
    let node = node().await;
    let bad = claim(UID, &[("gpu.example.com", POOL, "gpu-0")], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/efa has no device of driver efa.networking.k8s.aws in status.allocation (results are for: gpu.example.com); the allocation changed after the pod was scheduled: delete the pod so that it is scheduled again"
    );
}

#[tokio::test]
async fn results_in_another_pool() {
    let node = node().await;
    let device = efa(&node, 0);
    let bad = claim(UID, &[(DRIVER_NAME, "node-b", &device)], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "ResourceClaim ml/efa: device {device} of request efa is in pool node-b, but this node's pool is node-a: the claim was allocated devices of another node; delete the pod so that it is scheduled where its devices are"
        )
    );
}

#[tokio::test]
async fn oversized_claim_more_efas_than_the_node_has() {
    // p4d has 4 EFAs; a fifth result cannot be on this node, and the four
    // real ones must not be left prepared.
    let node = node().await;
    let mut devices: Vec<String> = (0..4).map(|i| efa(&node, i)).collect();
    devices.push("efa-0000-ff-00-0".into());
    let results: Vec<(&str, &str, &str)> = devices
        .iter()
        .map(|d| (DRIVER_NAME, POOL, d.as_str()))
        .collect();
    let bad = claim(UID, &results, vec![]);
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/efa: preparing devices failed: EFA efa-0000-ff-00-0 is not on this node: no PCI function 0000:ff:00.0 in sysfs (it was removed after the claim was allocated, or the claim names a device this node never published)"
    );
}

#[tokio::test]
async fn claim_gone_from_the_api_server() {
    let node = node().await;
    let error = prepare(&node, UID).await.unwrap_err();
    assert_nothing_left(&node, UID);
    assert_eq!(
        error,
        "ResourceClaim ml/efa not found; it may have been deleted"
    );
}
