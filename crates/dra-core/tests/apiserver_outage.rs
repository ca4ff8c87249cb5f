//! A whole driver (`run` in process, the same code as the binaries) started
//! while its API server is unreachable: kubelet's sockets are bound from
//! local state, an unprepare of a claim in the checkpoint works, a prepare
//! is refused per claim with an error that names the API server, and
//! `/readyz` and `/metrics` say what the start waits for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dra_core::testing::{
    CHECKPOINT_VERSION, CdiWriter, Checkpoint, CheckpointStore, PluginMetrics, PreparedClaim,
    dra_v1, run_in_process, unix_channel,
};
use dra_core::{
    AllocatedDevice, ClaimRef, DeviceEdits, DeviceInventory, Driver, DriverError, HostPaths,
    NoExtraArgs, PreparedDevice, Program, ScannedDevice,
};
use k8s_openapi::api::resource::v1::Device;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

mod support;
use support::NoConfig;

const DRIVER: &str = "outage.example.com";
const NODE: &str = "node-a";
/// The hold-out's bound on the first unprepare.
const UNPREPARE_BOUND: Duration = Duration::from_secs(10);
const UID_1: &str = "0b9e4a52-6a3e-4f4e-9c1a-1e2f3a4b5c61";
const UID_2: &str = "0b9e4a52-6a3e-4f4e-9c1a-1e2f3a4b5c62";

/// Counts unprepares, so the test sees the driver's own hook ran.
static UNPREPARED: AtomicUsize = AtomicUsize::new(0);

struct Thing;

impl Driver for Thing {
    type Config = NoConfig;
    async fn prepare(
        &self,
        _: &ClaimRef,
        _: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        Ok(Vec::new())
    }
    async fn unprepare(&self, _: &ClaimRef, _: &[PreparedDevice]) -> Result<(), DriverError> {
        UNPREPARED.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// One healthy device, `thing-0`.
struct Things;

impl DeviceInventory for Things {
    type Flags = NoExtraArgs;
    type Error = Never;
    const UEVENT_SUBSYSTEMS: &'static [&'static str] = &[];
    fn open(_: &HostPaths, _: &NoExtraArgs, _: &prometheus::Registry) -> Result<Self, Never> {
        Ok(Things)
    }
    fn scan(&mut self) -> Result<Vec<ScannedDevice>, Never> {
        Ok(vec![ScannedDevice::healthy(Device {
            name: "thing-0".into(),
            ..Default::default()
        })])
    }
}

impl dra_core::NodeDriver for Things {
    type Driver = Thing;

    fn driver(&self) -> Thing {
        Thing
    }
}

const PROGRAM: Program = Program {
    binary: "outage-driver",
    version: "0.0.0",
    driver_name: DRIVER,
    device_plugin_resources: &[],
};

/// A kubeconfig whose server is a local port nothing listens on.
fn unreachable_kubeconfig(dir: &Path) -> PathBuf {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let file = dir.join("kubeconfig");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{address}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    file
}

/// A free local port for the ops server.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn http_get(port: u16, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

async fn wait_for(path: &Path) {
    for _ in 0..200 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never appeared", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_is_served_while_the_api_server_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let registry_dir = root.join("registry");
    let plugins_dir = root.join("plugins");
    let cdi_root = root.join("cdi");
    let data_dir = plugins_dir.join(DRIVER);
    std::fs::create_dir_all(&data_dir).unwrap();

    // A claim prepared before the restart: its CDI spec and its checkpoint
    // entry, as the previous driver process left them.
    let spec = CdiWriter::new(&cdi_root, DRIVER, "outage")
        .write(UID_1, &[])
        .unwrap();
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let store = CheckpointStore::new(
        &data_dir,
        "/proc/sys/kernel/random/boot_id".into(),
        cdi_root.clone(),
        PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
    );
    store
        .save(&Checkpoint {
            version: CHECKPOINT_VERSION,
            boot_id: boot_id.trim().to_owned(),
            claims: BTreeMap::from([(
                UID_1.to_owned(),
                PreparedClaim {
                    namespace: "ns".into(),
                    name: "claim-1".into(),
                    devices: Vec::new(),
                    cdi_spec_path: spec.clone(),
                },
            )]),
        })
        .unwrap();

    let ops_port = free_port();
    let kubeconfig = unreachable_kubeconfig(root);
    let args: Vec<String> = [
        "outage-driver",
        "run",
        "--node-name",
        NODE,
        "--pod-uid",
        "",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--dev-root",
        root.to_str().unwrap(),
        "--kubelet-registrar-dir",
        registry_dir.to_str().unwrap(),
        "--kubelet-plugins-dir",
        plugins_dir.to_str().unwrap(),
        "--cdi-root",
        cdi_root.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--metrics-address",
        &format!("127.0.0.1:{ops_port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let shutdown = CancellationToken::new();
    let driver = tokio::spawn(run_in_process::<Things>(&PROGRAM, args, shutdown.clone()));

    let socket = data_dir.join("dra.sock");
    let unprepared = tokio::time::timeout(UNPREPARE_BOUND, async {
        wait_for(&socket).await;
        let mut client =
            dra_v1::dra_plugin_client::DraPluginClient::new(unix_channel(&socket).await.unwrap());
        client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: "ns".into(),
                    uid: UID_1.into(),
                    name: "claim-1".into(),
                }],
            })
            .await
            .unwrap()
            .into_inner()
    })
    .await
    .expect("NodeUnprepareResources answered within the bound");
    assert_eq!(unprepared.claims[UID_1].error, "", "{unprepared:?}");
    assert!(!spec.exists(), "the claim's CDI spec is gone");
    assert_eq!(
        UNPREPARED.load(Ordering::SeqCst),
        1,
        "the driver's hook ran"
    );
    let checkpoint = std::fs::read_to_string(data_dir.join("checkpoint.json")).unwrap();
    assert!(!checkpoint.contains(UID_1), "{checkpoint}");

    // Prepare waits for the API server, and says so, per claim.
    let mut client =
        dra_v1::dra_plugin_client::DraPluginClient::new(unix_channel(&socket).await.unwrap());
    let prepared = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "ns".into(),
                uid: UID_2.into(),
                name: "claim-2".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let error = &prepared.claims[UID_2].error;
    assert!(
        error.contains("ns/claim-2") && error.contains("API server has not answered"),
        "{error}"
    );

    // Readiness and the metric say what the start waits for.
    let readyz = http_get(ops_port, "/readyz").await;
    assert!(readyz.starts_with("HTTP/1.1 503"), "{readyz}");
    assert!(readyz.contains("waiting for the API server"), "{readyz}");
    let metrics = http_get(ops_port, "/metrics").await;
    assert!(
        metrics.contains("aws_dra_waiting_for{what=\"apiserver\"} 1"),
        "{metrics}"
    );

    assert!(!driver.is_finished(), "the driver is still running");
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("stopped on shutdown")
        .unwrap();
    assert_eq!(ended, Ok(()));
    assert!(!socket.exists(), "the socket is removed on the way out");
}
