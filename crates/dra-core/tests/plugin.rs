//! In-process tests of the kubelet plugin runtime over real Unix sockets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_core::testing::unix_channel;
use dra_core::testing::{
    DeviceHealthStatus, InMemoryClaimSource, KubeletPlugin, PluginMetrics, PluginOptions,
    RunningPlugin,
};
use dra_core::testing::{Frame, PREFACE, read_frame};
use dra_core::testing::{
    dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration as reg,
};
use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverConfig,
    DriverError, HealthState, InvalidValue, PreparedDevice,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "test.example.com";

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TestConfig {
    #[serde(default)]
    lanes: Option<u8>,
}

impl DriverConfig for TestConfig {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "TestConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        match self.lanes {
            None | Some(1..=4) => Ok(()),
            Some(v) => Err(InvalidValue {
                field: "lanes".into(),
                value: v.to_string(),
                accepted: "1 to 4".into(),
            }),
        }
    }
}

/// Claim UID and the devices unprepare was given.
type UnprepareCall = (String, Vec<PreparedDevice>);

#[derive(Default, Clone)]
struct TestDriver {
    prepares: Arc<Mutex<Vec<String>>>,
    unprepares: Arc<Mutex<Vec<UnprepareCall>>>,
}

impl Driver for TestDriver {
    type Config = TestConfig;

    async fn prepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<TestConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        self.prepares.lock().unwrap().push(claim.uid.clone());
        Ok(devices
            .iter()
            .map(|d| DeviceEdits {
                device: d.device.clone(),
                edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: format!("/dev/{}", d.device),
                        host_path: Some(format!("/fixture/dev/{}", d.device)),
                    }],
                    env: BTreeMap::from([(
                        "TEST_LANES".to_string(),
                        d.config
                            .as_ref()
                            .and_then(|c| c.lanes)
                            .unwrap_or(1)
                            .to_string(),
                    )]),
                },
            })
            .collect())
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        devices: &[PreparedDevice],
    ) -> Result<(), DriverError> {
        self.unprepares
            .lock()
            .unwrap()
            .push((claim.uid.clone(), devices.to_vec()));
        Ok(())
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    root: PathBuf,
    driver: TestDriver,
    claims: InMemoryClaimSource,
    registry: prometheus::Registry,
    token: CancellationToken,
    running: RunningPlugin,
}

fn options(root: &Path, pod_uid: Option<&str>) -> PluginOptions {
    let mut o = PluginOptions::new(DRIVER, "dev");
    o.registrar_dir = root.join("registry");
    o.plugins_dir = root.join("plugins");
    o.cdi_root = root.join("cdi");
    o.boot_id_path = root.join("boot_id");
    o.pod_uid = pod_uid.map(str::to_string);
    o
}

async fn start_at(dir: tempfile::TempDir, driver: TestDriver, health: bool) -> Harness {
    let root = dir.path().to_path_buf();
    if !root.join("boot_id").exists() {
        std::fs::write(root.join("boot_id"), "boot-1\n").unwrap();
    }
    let claims = InMemoryClaimSource::new();
    let registry = prometheus::Registry::new();
    let metrics = PluginMetrics::register(&registry).unwrap();
    let token = CancellationToken::new();
    let mut plugin = KubeletPlugin::new(
        driver.clone(),
        Arc::new(claims.clone()),
        options(&root, None),
        metrics,
    );
    if health {
        let (_tx, rx) = tokio::sync::watch::channel(vec![DeviceHealthStatus {
            pool: "node".into(),
            device: "dev-0".into(),
            state: HealthState::Healthy,
            last_updated: std::time::UNIX_EPOCH + Duration::from_secs(1000),
            message: "ok".into(),
            health_check_timeout: Some(Duration::from_secs(45)),
        }]);
        std::mem::forget(_tx);
        plugin = plugin.with_health(rx);
    }
    let running = plugin.start(token.clone()).await.unwrap();
    Harness {
        _dir: dir,
        root,
        driver,
        claims,
        registry,
        token,
        running,
    }
}

async fn start() -> Harness {
    start_at(tempfile::tempdir().unwrap(), TestDriver::default(), false).await
}

fn claim(
    uid: &str,
    name: &str,
    devices: &[(&str, &str, bool)],
    configs: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(uid.into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    devices
                        .iter()
                        .map(|(request, device, admin)| DeviceRequestAllocationResult {
                            request: request.to_string(),
                            driver: DRIVER.into(),
                            pool: "node".into(),
                            device: device.to_string(),
                            admin_access: admin.then_some(true),
                            ..Default::default()
                        })
                        .chain(std::iter::once(DeviceRequestAllocationResult {
                            request: "gpu".into(),
                            driver: "gpu.other.com".into(),
                            pool: "node".into(),
                            device: "gpu-0".into(),
                            ..Default::default()
                        }))
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

fn lanes_config(source: &str, params: serde_json::Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.into(),
            parameters: RawExtension(params),
        }),
    }
}

fn v1_claim(uid: &str, name: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

async fn v1_client(
    h: &Harness,
) -> dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    dra_v1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    )
}

async fn prepare_v1(
    h: &Harness,
    claims: Vec<dra_v1::Claim>,
) -> dra_v1::NodePrepareResourcesResponse {
    v1_client(h)
        .await
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

fn metrics_text(h: &Harness) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&h.registry.gather())
        .unwrap()
}

async fn stop(h: Harness) -> (tempfile::TempDir, TestDriver) {
    h.token.cancel();
    let sockets = h.running.sockets.clone();
    tokio::time::timeout(Duration::from_secs(10), h.running.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !sockets.registration.exists(),
        "registration socket removed on shutdown"
    );
    assert!(
        !sockets.plugin.exists(),
        "plugin socket removed on shutdown"
    );
    (h._dir, h.driver)
}

#[tokio::test]
async fn register_prepare_unprepare_v1() {
    let h = start().await;
    let info =
        dra_core::testing::self_check(&h.running.sockets.registration, &h.running.sockets.plugin)
            .await
            .unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(
        info.endpoint,
        h.root
            .join("plugins")
            .join(DRIVER)
            .join("dra.sock")
            .to_string_lossy()
    );
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(
        h.running.sockets.registration,
        h.root.join("registry").join(format!("{DRIVER}-reg.sock"))
    );

    let uid = "1a2b3c4d-0000-4000-8000-000000000001";
    h.claims
        .insert(claim(uid, "c1", &[("req/sub", "dev-0", false)], vec![]));
    let first = prepare_v1(&h, vec![v1_claim(uid, "c1")]).await;
    let entry = &first.claims[uid];
    assert_eq!(entry.error, "");
    assert_eq!(entry.devices.len(), 1, "only our driver's results");
    let d = &entry.devices[0];
    assert_eq!(d.request_names, ["req"]);
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        ("node", "dev-0")
    );
    assert_eq!(d.cdi_device_ids, [format!("k8s.{DRIVER}/dev={uid}-dev-0")]);
    assert_eq!(d.share_id, None);
    let spec = h
        .root
        .join("cdi")
        .join(format!("k8s.{DRIVER}-dev_{uid}.json"));
    let parsed = container_device_interface::spec::read_spec(&spec, 0).unwrap();
    assert!(parsed.get_device(&format!("{uid}-dev-0")).is_some());

    // Idempotent: same answer, driver not called again.
    let again = prepare_v1(&h, vec![v1_claim(uid, "c1")]).await;
    assert_eq!(again, first);
    assert_eq!(h.driver.prepares.lock().unwrap().len(), 1);

    let mut client = v1_client(&h).await;
    for _ in 0..2 {
        let un = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![v1_claim(uid, "c1")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(un.claims[uid].error, "");
    }
    assert!(!spec.exists());
    assert_eq!(
        h.driver.unprepares.lock().unwrap().len(),
        1,
        "second unprepare is a no-op"
    );
    let text = metrics_text(&h);
    assert!(
        text.contains("aws_dra_plugin_claims_total{operation=\"prepare\",result=\"success\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("aws_dra_plugin_claims_total{operation=\"unprepare\",result=\"success\"} 2"),
        "{text}"
    );
    stop(h).await;
}

#[tokio::test]
async fn register_prepare_unprepare_v1beta1_and_registration_failure() {
    let h = start().await;
    let uid = "2a2b3c4d-0000-4000-8000-000000000002";
    h.claims
        .insert(claim(uid, "c2", &[("req", "dev-1", false)], vec![]));
    let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let claim = dra_v1beta1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: "c2".into(),
    };
    let resp = client
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims[uid].error, "");
    assert_eq!(
        resp.claims[uid].devices[0].cdi_device_ids,
        [format!("k8s.{DRIVER}/dev={uid}-dev-1")]
    );
    let un = client
        .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[uid].error, "");

    let mut reg_client = reg::registration_client::RegistrationClient::new(
        unix_channel(&h.running.sockets.registration).await.unwrap(),
    );
    // The lifecycle signal the readiness gate waits on follows kubelet's
    // word: unset until registered, set by it, unset by a rejection.
    assert!(!*h.running.registered.borrow());
    reg_client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert!(*h.running.registered.borrow());
    reg_client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "boom".into(),
        })
        .await
        .unwrap();
    assert!(!*h.running.registered.borrow());
    let text = metrics_text(&h);
    assert!(
        text.contains("aws_dra_plugin_registration_failures_total 1"),
        "{text}"
    );
    assert!(text.contains("aws_dra_plugin_registered 0"), "{text}");
    stop(h).await;
}

#[tokio::test]
async fn per_claim_errors_are_actionable() {
    let h = start().await;
    let bad_cfg = "3a000000-0000-4000-8000-000000000001";
    let unknown_field = "3a000000-0000-4000-8000-000000000002";
    let wrong_kind = "3a000000-0000-4000-8000-000000000003";
    let replaced = "3a000000-0000-4000-8000-000000000004";
    let missing = "3a000000-0000-4000-8000-000000000005";
    let good = "3a000000-0000-4000-8000-000000000006";
    let unallocated = "3a000000-0000-4000-8000-000000000007";
    let cfg = |v: serde_json::Value| {
        vec![
            lanes_config(
                "FromClass",
                serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 2}),
            ),
            lanes_config("FromClaim", v),
        ]
    };
    h.claims.insert(claim(bad_cfg, "bad-cfg", &[("r", "dev-0", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 9}))));
    h.claims.insert(claim(unknown_field, "unknown-field", &[("r", "dev-1", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lane": 2}))));
    h.claims.insert(claim(
        wrong_kind,
        "wrong-kind",
        &[("r", "dev-2", false)],
        cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "OtherConfig"})),
    ));
    h.claims.insert(claim(
        "someone-else",
        "replaced",
        &[("r", "dev-3", false)],
        vec![],
    ));
    h.claims.insert(claim(good, "good", &[("r", "dev-4", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 3}))));
    let mut c = claim(unallocated, "unallocated", &[], vec![]);
    c.status = None;
    h.claims.insert(c);
    let resp = prepare_v1(
        &h,
        vec![
            v1_claim(bad_cfg, "bad-cfg"),
            v1_claim(unknown_field, "unknown-field"),
            v1_claim(wrong_kind, "wrong-kind"),
            v1_claim(replaced, "replaced"),
            v1_claim(missing, "missing"),
            v1_claim(good, "good"),
            v1_claim(unallocated, "unallocated"),
        ],
    )
    .await;
    assert_eq!(resp.claims.len(), 7, "every claim gets an entry");
    let err = |uid: &str| resp.claims[uid].error.clone();
    assert_eq!(
        err(bad_cfg),
        "ResourceClaim ns/bad-cfg: opaque config #1 (from ResourceClaim): field `lanes`: value 9 is out of range; accepted values: 1 to 4"
    );
    assert_eq!(
        err(unknown_field),
        "ResourceClaim ns/unknown-field: opaque config #1 (from ResourceClaim): field `lane`: unknown field; accepted fields: apiVersion, kind, lanes"
    );
    assert_eq!(
        err(wrong_kind),
        "ResourceClaim ns/wrong-kind: opaque config #1 (from ResourceClaim): field `kind`: unsupported value \"OtherConfig\"; accepted values: \"TestConfig\""
    );
    assert_eq!(
        err(replaced),
        format!(
            "ResourceClaim ns/replaced has UID \"someone-else\" but kubelet asked for \"{replaced}\": the claim was deleted and recreated; delete the pod so that it is scheduled with the new claim"
        )
    );
    assert_eq!(
        err(missing),
        "ResourceClaim ns/missing not found; it may have been deleted"
    );
    assert_eq!(
        err(unallocated),
        "ResourceClaim ns/unallocated is not allocated (status.allocation is empty); wait for the scheduler to allocate it"
    );
    assert_eq!(err(good), "");
    // Claim config (lanes 3) wins over class config (lanes 2).
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            h.root
                .join("cdi")
                .join(format!("k8s.{DRIVER}-dev_{good}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"][0],
        "TEST_LANES=3"
    );
    stop(h).await;
}

#[tokio::test]
async fn double_allocation_is_refused_unless_admin_access() {
    let h = start().await;
    let a = "4a000000-0000-4000-8000-00000000000a";
    let b = "4a000000-0000-4000-8000-00000000000b";
    let admin = "4a000000-0000-4000-8000-0000000000ad";
    h.claims
        .insert(claim(a, "a", &[("r", "dev-7", false)], vec![]));
    h.claims
        .insert(claim(b, "b", &[("r", "dev-7", false)], vec![]));
    h.claims
        .insert(claim(admin, "admin", &[("r", "dev-7", true)], vec![]));
    let resp = prepare_v1(
        &h,
        vec![v1_claim(a, "a"), v1_claim(b, "b"), v1_claim(admin, "admin")],
    )
    .await;
    assert_eq!(resp.claims[a].error, "");
    assert_eq!(
        resp.claims[b].error,
        format!(
            "ResourceClaim ns/b: device node/dev-7 is already prepared for claim ns/a (uid {a}); refusing to give one device to two claims. Wait until that claim is unprepared (its pods are gone), then retry"
        )
    );
    assert_eq!(resp.claims[admin].error, "");
    stop(h).await;
}

/// An `adminAccess` claim shares the device by design: prepared first, it
/// must not block the regular claim that comes after it (this was refused),
/// and prepared second it is not blocked either. Each order in its own call,
/// as kubelet sends them for two pods.
#[tokio::test]
async fn admin_access_and_a_regular_claim_share_a_device_in_either_order() {
    let admin = "4a000000-0000-4000-8000-0000000000ad";
    let regular = "4a000000-0000-4000-8000-0000000000e1";
    for admin_first in [true, false] {
        let h = start().await;
        h.claims
            .insert(claim(admin, "admin", &[("r", "dev-7", true)], vec![]));
        h.claims
            .insert(claim(regular, "regular", &[("r", "dev-7", false)], vec![]));
        let order = if admin_first {
            [(admin, "admin"), (regular, "regular")]
        } else {
            [(regular, "regular"), (admin, "admin")]
        };
        for (uid, name) in order {
            let resp = prepare_v1(&h, vec![v1_claim(uid, name)]).await;
            assert_eq!(
                resp.claims[uid].error, "",
                "{name} (admin first: {admin_first})"
            );
            assert_eq!(resp.claims[uid].devices.len(), 1, "{name}");
        }
        stop(h).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_prepares() {
    let h = Arc::new(start().await);
    let uids: Vec<String> = (0..200)
        .map(|i| format!("5a000000-0000-4000-8000-{i:012}"))
        .collect();
    for (i, uid) in uids.iter().enumerate() {
        h.claims.insert(claim(
            uid,
            &format!("c{i}"),
            &[("r", &format!("dev-{i}"), false)],
            vec![],
        ));
    }
    let started = std::time::Instant::now();
    let tasks: Vec<_> = uids
        .iter()
        .enumerate()
        .map(|(i, uid)| {
            let h = h.clone();
            let uid = uid.clone();
            tokio::spawn(
                async move { prepare_v1(&h, vec![v1_claim(&uid, &format!("c{i}"))]).await },
            )
        })
        .collect();
    for (t, uid) in tasks.into_iter().zip(&uids) {
        let resp = t.await.unwrap();
        assert_eq!(resp.claims[uid].error, "", "claim {uid}");
    }
    eprintln!("200 concurrent prepares took {:?}", started.elapsed());
    // Repeated concurrent prepares of one shared claim: one driver call, one answer.
    let shared = &uids[0];
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let h = h.clone();
            let uid = shared.clone();
            tokio::spawn(async move { prepare_v1(&h, vec![v1_claim(&uid, "c0")]).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(h.driver.prepares.lock().unwrap().len(), 200);
    let checkpoint: serde_json::Value = serde_json::from_slice(
        &std::fs::read(h.root.join("plugins").join(DRIVER).join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(checkpoint["claims"].as_object().unwrap().len(), 200);
    let h = Arc::try_unwrap(h).ok().unwrap();
    stop(h).await;
}

#[tokio::test]
async fn restart_unprepares_from_checkpoint_without_api() {
    let h = start().await;
    let uid = "6a000000-0000-4000-8000-000000000001";
    h.claims.insert(claim(
        uid,
        "c",
        &[("r", "dev-0", false), ("r2", "dev-1", false)],
        vec![],
    ));
    assert_eq!(
        prepare_v1(&h, vec![v1_claim(uid, "c")]).await.claims[uid].error,
        ""
    );
    let spec = h
        .root
        .join("cdi")
        .join(format!("k8s.{DRIVER}-dev_{uid}.json"));
    assert!(spec.exists());
    let (dir, _) = stop(h).await;

    // A new instance over the same directories, with an empty claim source.
    let h = start_at(dir, TestDriver::default(), false).await;
    let un = v1_client(&h)
        .await
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim(uid, "c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[uid].error, "");
    assert_eq!(h.claims.get_count(), 0, "unprepare never reads the API");
    let calls = h.driver.unprepares.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]
            .1
            .iter()
            .map(|d| d.device.as_str())
            .collect::<Vec<_>>(),
        ["dev-0", "dev-1"]
    );
    assert!(!spec.exists());
    stop(h).await;
}

#[tokio::test]
async fn corrupt_checkpoint_is_moved_aside_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("plugins").join(DRIVER);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("checkpoint.json"),
        b"{\"version\": 1, \"claims\": [",
    )
    .unwrap();
    let h = start_at(dir, TestDriver::default(), false).await;
    let uid = "7a000000-0000-4000-8000-000000000001";
    h.claims
        .insert(claim(uid, "c", &[("r", "dev-0", false)], vec![]));
    assert_eq!(
        prepare_v1(&h, vec![v1_claim(uid, "c")]).await.claims[uid].error,
        ""
    );
    let names: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("checkpoint.json.corrupt-")),
        "{names:?}"
    );
    assert!(metrics_text(&h).contains("aws_dra_checkpoint_errors_total{reason=\"corrupt\"} 1"));
    stop(h).await;
}

#[tokio::test]
async fn pod_uid_socket_names_and_stale_socket_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let o = options(dir.path(), Some("pod-123"));
    let s = o.sockets();
    assert_eq!(
        s.registration,
        dir.path()
            .join("registry")
            .join(format!("{DRIVER}-pod-123-reg.sock"))
    );
    assert_eq!(
        s.plugin,
        dir.path()
            .join("plugins")
            .join(DRIVER)
            .join("dra-pod-123.sock")
    );
    // A stale socket file from a crashed instance.
    std::fs::create_dir_all(s.registration.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&s.registration).unwrap());
    std::fs::write(dir.path().join("boot_id"), "b").unwrap();
    let token = CancellationToken::new();
    let running = KubeletPlugin::new(
        TestDriver::default(),
        Arc::new(InMemoryClaimSource::new()),
        o,
        PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
    )
    .start(token.clone())
    .await
    .unwrap();
    dra_core::testing::self_check(&running.sockets.registration, &running.sockets.plugin)
        .await
        .unwrap();
    token.cancel();
    running.wait().await.unwrap();
    assert!(!s.registration.exists() && !s.plugin.exists());
}

#[tokio::test]
async fn health_service_is_advertised_and_streams() {
    let h = start_at(tempfile::tempdir().unwrap(), TestDriver::default(), true).await;
    let info =
        dra_core::testing::self_check(&h.running.sockets.registration, &h.running.sockets.plugin)
            .await
            .unwrap();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    // kubelet 1.37 opens the v1 stream; older kubelets the v1alpha1 one.
    let mut v1 = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let first_v1 = v1
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first_v1.devices.len(), 1);
    assert_eq!(
        first_v1.devices[0].health,
        health_v1::HealthStatus::Healthy as i32
    );
    assert_eq!(first_v1.devices[0].health_check_timeout_seconds, 45);
    let mut client = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let mut stream = client
        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 1);
    assert_eq!(
        first.devices[0].health,
        health_v1alpha1::HealthStatus::Healthy as i32
    );
    assert_eq!(first.devices[0].last_updated_time, 1000);
    assert_eq!(first.devices[0].health_check_timeout_seconds, 45);
    drop(stream);
    stop(h).await;
}

// ---- raw HTTP/2, as kubelet's grpc-go speaks it to the registration socket ----

const PERCENT_ENCODED: &str =
    "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Ftest.example.com-reg.sock";

#[derive(Debug)]
enum RawOutcome {
    Answered {
        status: Vec<u8>,
        grpc_status: Vec<u8>,
        message: Vec<u8>,
    },
    Reset(u32),
    GoAway(u32),
}

async fn raw_get_info(socket: &Path, authority: &str) -> RawOutcome {
    let mut s = UnixStream::connect(socket).await.unwrap();
    let mut encoder = loona_hpack::Encoder::new();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.72.1"),
        (b"te", b"trailers"),
    ];
    let block = encoder.encode(headers);
    let mut out = PREFACE.to_vec();
    Frame {
        frame_type: 0x4,
        flags: 0,
        stream: 0,
        payload: vec![],
    }
    .encode(&mut out);
    // HEADERS split in two, the second half in a CONTINUATION, with padding.
    let (a, b) = block.split_at(block.len() / 2);
    let mut payload = vec![2u8];
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0]);
    Frame {
        frame_type: 0x1,
        flags: 0x8,
        stream: 1,
        payload,
    }
    .encode(&mut out);
    Frame {
        frame_type: 0x9,
        flags: 0x4,
        stream: 1,
        payload: b.to_vec(),
    }
    .encode(&mut out);
    // Empty InfoRequest: uncompressed flag + zero length.
    Frame {
        frame_type: 0x0,
        flags: 0x1,
        stream: 1,
        payload: vec![0, 0, 0, 0, 0],
    }
    .encode(&mut out);
    s.write_all(&out).await.unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let mut status = Vec::new();
    let mut message = Vec::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s))
            .await
            .expect("server answered in time")
            .unwrap()
            .expect("server kept the connection open until it answered");
        match frame.frame_type {
            0x4 if frame.flags & 0x1 == 0 => {
                let mut ack = Vec::new();
                Frame {
                    frame_type: 0x4,
                    flags: 0x1,
                    stream: 0,
                    payload: vec![],
                }
                .encode(&mut ack);
                s.write_all(&ack).await.unwrap();
            }
            0x1 if frame.stream == 1 => {
                assert!(
                    frame.flags & 0x4 != 0,
                    "test expects unsplit response headers"
                );
                let headers = decoder.decode(&frame.payload).unwrap();
                let get = |name: &[u8]| {
                    headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                };
                if let Some(s) = get(b":status") {
                    status = s;
                }
                if frame.flags & 0x1 != 0 {
                    return RawOutcome::Answered {
                        status,
                        grpc_status: get(b"grpc-status").unwrap_or_default(),
                        message,
                    };
                }
            }
            0x0 if frame.stream == 1 => message.extend_from_slice(&frame.payload),
            0x3 if frame.stream == 1 => {
                return RawOutcome::Reset(u32::from_be_bytes(
                    frame.payload[..4].try_into().unwrap(),
                ));
            }
            0x7 => {
                return RawOutcome::GoAway(u32::from_be_bytes(
                    frame.payload[4..8].try_into().unwrap(),
                ));
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn raw_frames_with_percent_encoded_authority_get_plugin_info() {
    let h = start().await;
    match raw_get_info(&h.running.sockets.registration, PERCENT_ENCODED).await {
        RawOutcome::Answered {
            status,
            grpc_status,
            message,
        } => {
            assert_eq!(status, b"200");
            assert_eq!(grpc_status, b"0");
            assert_eq!(message[0], 0, "uncompressed");
            let len = u32::from_be_bytes(message[1..5].try_into().unwrap()) as usize;
            let info = reg::PluginInfo::decode(&message[5..5 + len]).unwrap();
            assert_eq!(info.name, DRIVER);
            assert_eq!(info.r#type, "DRAPlugin");
            assert_eq!(
                info.supported_versions,
                ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            );
        }
        other => panic!("registration socket refused kubelet's request: {other:?}"),
    }
    stop(h).await;
}

struct BareRegistration;

#[tonic::async_trait]
impl reg::registration_server::Registration for BareRegistration {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo::default()))
    }
    async fn notify_registration_status(
        &self,
        _: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Documents the trap the adapter exists for: a plain tonic server resets
/// kubelet's request. If h2 ever accepts it, this fails and the adapter can go.
#[tokio::test]
async fn without_the_adapter_h2_refuses_the_percent_encoded_authority() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare-reg.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let token = CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                BareRegistration,
            ))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                token.clone().cancelled_owned(),
            ),
    );
    match raw_get_info(&path, PERCENT_ENCODED).await {
        RawOutcome::Reset(code) | RawOutcome::GoAway(code) => assert_eq!(code, 1, "PROTOCOL_ERROR"),
        other => panic!("h2 accepted the percent-encoded authority: {other:?}"),
    }
    // The same raw client with a valid authority is answered: the test client is sound.
    assert!(matches!(
        raw_get_info(&path, "localhost").await,
        RawOutcome::Answered { .. }
    ));
    token.cancel();
    server.await.unwrap().unwrap();
}
