//! Where the time of one `NodePrepareResources` goes, layer by layer, in
//! one process on this machine (no API server: claims come from memory).
//!
//! ```text
//! cargo run --release -p dra-core --example prepare_layers -- [ROUNDS] [DATA_DIR]
//! ```
//!
//! Rows, each a mean/p50/p99 over ROUNDS (default 300) calls, one at a time:
//! * `grpc empty, bare tonic`: an empty call to a tonic server on a unix
//!   socket, nothing in between: the HTTP/2 + gRPC floor;
//! * `grpc empty, plugin`: the same call to the real plugin socket (the
//!   connection relay, then the same server);
//! * `cdi spec write` / `checkpoint save`: one atomic replacement each
//!   (temp file, fsync, rename, fsync of the directory) in DATA_DIR;
//! * `prepare`/`unprepare, data on disk` and `..., tmpfs`: one claim
//!   prepared and unprepared through the plugin socket with the plugin's
//!   files in DATA_DIR (default: a temp dir under /var/tmp, the disk
//!   kubelet's dir is on) and in /dev/shm (fsync costs nothing there): the
//!   difference is the disk. Interleaved with the disk rows, `spec, then
//!   checkpoint` writes the same two files one atomic replacement after the
//!   other (four waits for the disk, as prepare did before it committed
//!   them together: two waits).
//!
//! With `RUST_LOG=dra_core=debug` the plugin also logs each call's
//! `prepare call timings` (lock, checkpoint load, claims, checkpoint save).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_core::testing::CdiWriter;
use dra_core::testing::dra_v1;
use dra_core::testing::unix_channel;
use dra_core::testing::{Checkpoint, CheckpointStore, PreparedClaim};
use dra_core::testing::{InMemoryClaimSource, KubeletPlugin, PluginMetrics, PluginOptions};
use dra_core::{
    AllocatedDevice, ClaimRef, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverConfig,
    DriverError,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use tokio_util::sync::CancellationToken;

const DRIVER: &str = "bench.example.com";

#[derive(Debug, Clone, serde::Deserialize)]
struct NoConfig {}

impl DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["bench.example.com/v1"];
    const KIND: &'static str = "NoConfig";
}

/// One device node per device, like the EFA driver's uverbs node.
struct BenchDriver;

impl Driver for BenchDriver {
    type Config = NoConfig;

    async fn prepare(
        &self,
        _claim: &ClaimRef,
        devices: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        Ok(devices
            .iter()
            .map(|d| DeviceEdits {
                device: d.device.clone(),
                edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/infiniband/uverbs0".into(),
                        host_path: None,
                    }],
                    env: BTreeMap::new(),
                },
            })
            .collect())
    }
}

struct Stats(Vec<Duration>);

impl Stats {
    fn line(&mut self, what: &str) {
        self.0.sort();
        let n = self.0.len().max(1);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let mean = self.0.iter().map(|d| ms(*d)).sum::<f64>() / n as f64;
        let p = |q: f64| ms(self.0[((n as f64 * q) as usize).min(n - 1)]);
        println!(
            "{what:<36} mean {mean:7.3} ms  p50 {:7.3} ms  p99 {:7.3} ms  (n={n})",
            p(0.5),
            p(0.99)
        );
    }
}

async fn time<F, Fut>(rounds: usize, mut f: F) -> Stats
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // A few warm-up calls: connections, allocator, page cache.
    for i in 0..5 {
        f(rounds + i).await;
    }
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let started = Instant::now();
        f(i).await;
        out.push(started.elapsed());
    }
    Stats(out)
}

fn claim(i: usize) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(format!("c{i}"));
    c.metadata.uid = Some(format!("0b7c6a58-2f3e-4f7e-9d55-{i:012}"));
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "efa".into(),
                    driver: DRIVER.into(),
                    pool: "node".into(),
                    device: format!("efa-{}", i % 32),
                    ..Default::default()
                }]),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

fn wire_claim(i: usize) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "ns".into(),
        name: format!("c{i}"),
        uid: format!("0b7c6a58-2f3e-4f7e-9d55-{i:012}"),
    }
}

/// The plugin with its files under `root`; returns the plugin socket.
async fn plugin(root: &Path, claims: &InMemoryClaimSource, token: &CancellationToken) -> PathBuf {
    std::fs::write(root.join("boot_id"), "bench\n").expect("boot id");
    let mut o = PluginOptions::new(DRIVER, "efa");
    o.registrar_dir = root.join("registry");
    o.plugins_dir = root.join("plugins");
    o.cdi_root = root.join("cdi");
    o.boot_id_path = root.join("boot_id");
    let metrics = PluginMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let running = KubeletPlugin::new(BenchDriver, Arc::new(claims.clone()), o, metrics)
        .start(token.clone())
        .await
        .expect("plugin starts");
    running.sockets.plugin.clone()
}

/// A tonic server with the DRA service and nothing else in front of it.
struct Bare;

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for Bare {
    async fn node_prepare_resources(
        &self,
        _: tonic::Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1::NodePrepareResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn node_unprepare_resources(
        &self,
        _: tonic::Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1::NodeUnprepareResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
}

/// Prepare/unprepare through the plugin with its files under `root`; with
/// `one_at_a_time`, each round also writes a CDI spec and then the
/// checkpoint as separate atomic replacements (what a prepare did before
/// the two were committed together), interleaved so that the disk's mood
/// hits both alike.
async fn prepare_unprepare_rows(
    label: &str,
    root: &Path,
    rounds: usize,
    one_at_a_time: Option<&(CdiWriter, CheckpointStore, Checkpoint)>,
) {
    let claims = InMemoryClaimSource::new();
    for i in 0..rounds + 5 {
        claims.insert(claim(i));
    }
    let token = CancellationToken::new();
    let socket = plugin(root, &claims, &token).await;
    let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&socket).await.expect("connect"),
    );
    let (mut prepare, mut unprepare, mut separate) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + 5 {
        if let Some((cdi, store, checkpoint)) = one_at_a_time {
            let edits = vec![DeviceEdits {
                device: "efa-0".into(),
                edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: "/dev/infiniband/uverbs0".into(),
                        host_path: None,
                    }],
                    env: BTreeMap::new(),
                },
            }];
            let started = Instant::now();
            cdi.write(&format!("uid-{i}"), &edits).expect("cdi write");
            store.save(checkpoint).expect("save");
            if i >= 5 {
                separate.push(started.elapsed());
            }
        }
        let started = Instant::now();
        let r = client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![wire_claim(i)],
            })
            .await
            .expect("prepare");
        let prepared = started.elapsed();
        assert!(r.into_inner().claims.values().all(|c| c.error.is_empty()));
        let started = Instant::now();
        client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![wire_claim(i)],
            })
            .await
            .expect("unprepare");
        // The first few are warm-up.
        if i >= 5 {
            prepare.push(prepared);
            unprepare.push(started.elapsed());
        }
    }
    if one_at_a_time.is_some() {
        Stats(separate).line("  interleaved: spec, then checkpoint");
    }
    Stats(prepare).line(&format!("prepare, {label}"));
    Stats(unprepare).line(&format!("unprepare, {label}"));
    token.cancel();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let disk_parent = args
        .next()
        .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let disk = tempfile::tempdir_in(&disk_parent).expect("data dir on disk");
    println!("rounds {rounds}; data dir {}", disk.path().display());

    // The HTTP/2 + gRPC floor: a bare tonic server.
    let bare_dir = tempfile::tempdir().expect("temp dir");
    let bare_socket = bare_dir.path().join("bare.sock");
    let listener = tokio::net::UnixListener::bind(&bare_socket).expect("bind");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dra_v1::dra_plugin_server::DraPluginServer::new(Bare))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let bare = dra_v1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&bare_socket).await.expect("connect"),
    );
    time(rounds * 10, |_| {
        let mut c = bare.clone();
        async move {
            c.node_prepare_resources(dra_v1::NodePrepareResourcesRequest::default())
                .await
                .expect("call");
        }
    })
    .await
    .line("grpc empty, bare tonic");

    // The same call through the plugin's socket (relay included).
    let token = CancellationToken::new();
    let relayed_dir = tempfile::tempdir().expect("temp dir");
    let socket = plugin(relayed_dir.path(), &InMemoryClaimSource::new(), &token).await;
    let relayed = dra_v1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&socket).await.expect("connect"),
    );
    time(rounds * 10, |_| {
        let mut c = relayed.clone();
        async move {
            c.node_prepare_resources(dra_v1::NodePrepareResourcesRequest::default())
                .await
                .expect("call");
        }
    })
    .await
    .line("grpc empty, plugin (relay)");
    token.cancel();

    // The two durable writes of a prepare, alone.
    let cdi = CdiWriter::new(&disk.path().join("cdi-alone"), DRIVER, "efa");
    time(rounds, |i| {
        let edits = vec![DeviceEdits {
            device: format!("efa-{i}"),
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/infiniband/uverbs0".into(),
                    host_path: None,
                }],
                env: BTreeMap::new(),
            },
        }];
        let uid = format!("uid-{i}");
        let cdi = &cdi;
        async move {
            cdi.write(&uid, &edits).expect("cdi write");
        }
    })
    .await
    .line("cdi spec write (disk)");
    std::fs::write(disk.path().join("boot_id"), "bench\n").expect("boot id");
    let store = CheckpointStore::new(
        disk.path(),
        disk.path().join("boot_id"),
        disk.path().join("cdi-alone"),
        PluginMetrics::register(&prometheus::Registry::new()).expect("metrics"),
    );
    let mut checkpoint = Checkpoint {
        version: dra_core::testing::CHECKPOINT_VERSION,
        boot_id: "bench".into(),
        claims: BTreeMap::new(),
    };
    for i in 0..4 {
        checkpoint.claims.insert(
            format!("uid-{i}"),
            PreparedClaim {
                namespace: "ns".into(),
                name: format!("c{i}"),
                devices: vec![],
                cdi_spec_path: disk.path().join("x.json"),
            },
        );
    }
    time(rounds, |_| {
        let (store, checkpoint) = (&store, &checkpoint);
        async move { store.save(checkpoint).expect("save") }
    })
    .await
    .line("checkpoint save (disk)");
    time(rounds, |_| {
        let store = &store;
        async move {
            store.load().expect("load");
        }
    })
    .await
    .line("checkpoint load");

    let plugin_dir = disk.path().join("plugin");
    std::fs::create_dir(&plugin_dir).expect("plugin dir");
    prepare_unprepare_rows(
        "data on disk",
        &plugin_dir,
        rounds,
        Some(&(cdi, store, checkpoint)),
    )
    .await;
    match tempfile::tempdir_in("/dev/shm") {
        Ok(shm) => prepare_unprepare_rows("data on tmpfs", shm.path(), rounds, None).await,
        Err(e) => println!("no /dev/shm ({e}): tmpfs rows skipped"),
    }
}
