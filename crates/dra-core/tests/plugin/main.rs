//! In-process tests of the kubelet plugin runtime over real Unix sockets.
//!
//! One test binary, split by subject: registration and sockets
//! (`lifecycle`), what prepare does with claims (`claims`), the checkpoint
//! across restarts (`checkpoint`) and the raw HTTP/2 that kubelet speaks
//! (`authority`). This file holds the test driver and the harness they share.

mod authority;
mod checkpoint;
mod claims;
mod lifecycle;
#[path = "../support/mod.rs"]
mod support;

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
    let mut o = support::node_options(root, DRIVER, "dev");
    o.pod_uid = pod_uid.map(str::to_string);
    o
}

async fn start_at(dir: tempfile::TempDir, driver: TestDriver, health: bool) -> Harness {
    let root = dir.path().to_path_buf();
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
