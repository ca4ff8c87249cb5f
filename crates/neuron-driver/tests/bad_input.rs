//! The bad-input table of the Neuron driver, through the real kubelet
//! plugin (gRPC `NodePrepareResources` on its socket, the real driver on an
//! inf2 fixture, the claim as the API server would hold it).
//!
//! Each case asserts the exact message kubelet receives (and turns into the
//! pod's event, prefixed with the claim), and that nothing is left behind:
//! no CDI spec and no checkpoint entry for the claim, and the claim's good
//! devices still free for the next claim.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dra_core::proto::dra_v1;
use dra_core::self_check::unix_channel;
use dra_core::{InMemoryClaimSource, KubeletPlugin, PluginMetrics, PluginOptions, RunningPlugin};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{BdfCache, NodeInventory, discover};
use neuron_driver::prepare::SharedInventory;
use neuron_driver::{DRIVER_NAME, NeuronDriver};
use serde_json::{Value, json};
use sysfs_fixtures::{Fixture, generate};
use tokio_util::sync::CancellationToken;
use topology::{PciAddress, SysfsRoot};

const POOL: &str = "node-a";
const UID: &str = "uid-bad";

struct Node {
    _dir: tempfile::TempDir,
    fixture: Fixture,
    inventory: SharedInventory,
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
    let fixture = generate("inf2.48xlarge", &dir.path().join("host")).unwrap();
    let root = dir.path().to_path_buf();
    std::fs::write(root.join("boot_id"), "boot-1\n").unwrap();
    let mut options = PluginOptions::new(DRIVER_NAME, "neuron");
    options.registrar_dir = root.join("registry");
    options.plugins_dir = root.join("plugins");
    options.cdi_root = root.join("cdi");
    options.boot_id_path = root.join("boot_id");
    options.pool = Some(POOL.into());
    let checkpoint = options.sockets().data_dir.join("checkpoint.json");
    let claims = InMemoryClaimSource::new();
    let metrics = PluginMetrics::register(&prometheus::Registry::new()).unwrap();
    let token = CancellationToken::new();
    let inventory = Arc::new(RwLock::new(scan(&fixture)));
    let driver = NeuronDriver::new(inventory.clone());
    let running = KubeletPlugin::new(driver, Arc::new(claims.clone()), options.clone(), metrics)
        .start(token.clone())
        .await
        .unwrap();
    Node {
        _dir: dir,
        fixture,
        inventory,
        cdi_root: options.cdi_root,
        checkpoint,
        claims,
        token,
        running: Some(running),
    }
}

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

/// `results`: (driver, pool, device), all for request `chips`.
fn claim(
    uid: &str,
    results: &[(&str, &str, &str)],
    configs: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ml".into());
    c.metadata.name = Some("chips".into());
    c.metadata.uid = Some(uid.into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                            request: "chips".into(),
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
                name: "chips".into(),
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
/// nothing was left behind and that chip 0 is still free for a good claim.
async fn refused(node: &Node, bad: ResourceClaim) -> String {
    node.claims.insert(bad);
    let error = prepare(node, UID).await.unwrap_err();
    assert_nothing_left(node, UID);
    let good = chip(0);
    node.claims.insert(claim(
        "uid-good",
        &[(DRIVER_NAME, POOL, &good)],
        vec![config(
            DRIVER_NAME,
            json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": 1}),
        )],
    ));
    let ids = prepare(node, "uid-good").await.unwrap();
    assert_eq!(
        ids,
        vec![format!("k8s.{DRIVER_NAME}/neuron=uid-good-{good}")]
    );
    error
}

/// A claim of chip 0 with one opaque config of this driver.
async fn with_config(parameters: Value) -> String {
    let node = node().await;
    let device = chip(0);
    let bad = claim(
        UID,
        &[(DRIVER_NAME, POOL, &device)],
        vec![config(DRIVER_NAME, parameters)],
    );
    refused(&node, bad).await
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
async fn a_good_claim_prepares_and_leaves_its_spec() {
    let node = node().await;
    node.claims
        .insert(claim(UID, &[(DRIVER_NAME, POOL, &chip(3))], vec![]));
    let ids = prepare(&node, UID).await.unwrap();
    assert_eq!(
        ids,
        vec![format!("k8s.{DRIVER_NAME}/neuron={UID}-{}", chip(3))]
    );
    // The control for `assert_nothing_left`: it does see a prepared claim.
    let left = std::panic::catch_unwind(|| assert_nothing_left(&node, UID));
    assert!(left.is_err(), "a prepared claim must be visible");
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
    let node = node().await;
    let bad = claim(UID, &[(DRIVER_NAME, POOL, &chip(99))], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "{FAILED}chip 99 (neurondevice99) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
}

#[tokio::test]
async fn device_name_of_another_driver() {
    let node = node().await;
    let bad = claim(UID, &[(DRIVER_NAME, POOL, "efa-0000-10-1c-0")], vec![]);
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "{FAILED}device \"efa-0000-10-1c-0\" is not a Neuron chip or core of this driver (expected neurondevice<index>, neurondevice<index>-core-<core> or neuronnode)"
        )
    );
}

#[tokio::test]
async fn device_vanished_between_allocation_and_prepare() {
    let node = node().await;
    // Chip 5 is hot-unplugged and the next rescan no longer has it.
    let bdf = node.fixture.neuron_chips[5].bdf.clone();
    node.fixture.remove_device(&bdf).unwrap();
    *node.inventory.write().unwrap() = scan(&node.fixture);
    let bad = claim(
        UID,
        &[(DRIVER_NAME, POOL, &chip(4)), (DRIVER_NAME, POOL, &chip(5))],
        vec![],
    );
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "{FAILED}chip 5 (neurondevice5) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
    // The chip allocated beside the vanished one was not half-prepared.
    node.claims
        .insert(claim("uid-kept", &[(DRIVER_NAME, POOL, &chip(4))], vec![]));
    assert!(prepare(&node, "uid-kept").await.is_ok());
}

#[tokio::test]
async fn results_only_for_another_driver() {
    let node = node().await;
    let bad = claim(
        UID,
        &[("efa.networking.k8s.aws", POOL, "efa-0000-10-1c-0")],
        vec![],
    );
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/chips has no device of driver neuron.aws.com in status.allocation (results are for: efa.networking.k8s.aws); the allocation changed after the pod was scheduled: delete the pod so that it is scheduled again"
    );
}

#[tokio::test]
async fn results_in_another_pool() {
    let node = node().await;
    let bad = claim(
        UID,
        &[
            (DRIVER_NAME, POOL, &chip(1)),
            (DRIVER_NAME, "node-b", &chip(2)),
        ],
        vec![],
    );
    assert_eq!(
        refused(&node, bad).await,
        "ResourceClaim ml/chips: device neurondevice2 of request chips is in pool node-b, but this node's pool is node-a: the claim was allocated devices of another node; delete the pod so that it is scheduled where its devices are"
    );
}

#[tokio::test]
async fn oversized_claim_more_chips_than_the_node_has() {
    // inf2.48xlarge has 12 chips; a 13th result cannot be on this node.
    let node = node().await;
    let devices: Vec<String> = (0..13).map(chip).collect();
    let results: Vec<(&str, &str, &str)> = devices
        .iter()
        .map(|d| (DRIVER_NAME, POOL, d.as_str()))
        .collect();
    let bad = claim(UID, &results, vec![]);
    assert_eq!(
        refused(&node, bad).await,
        format!(
            "{FAILED}chip 12 (neurondevice12) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
        )
    );
}

#[tokio::test]
async fn claim_gone_from_the_api_server() {
    let node = node().await;
    let error = prepare(&node, UID).await.unwrap_err();
    assert_nothing_left(&node, UID);
    assert_eq!(
        error,
        "ResourceClaim ml/chips not found; it may have been deleted"
    );
}
