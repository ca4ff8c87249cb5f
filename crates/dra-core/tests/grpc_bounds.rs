//! The kubelet-facing servers' bounds and input checks, on the real
//! sockets: socket modes, claim UIDs, ownership of what unprepare deletes,
//! the empty prepare of the self-check, call deadlines, request sizes,
//! concurrent streams and connections.
//!
//! Tests that wait for a bound run on tokio's paused clock (time moves
//! only when every task waits on a timer; socket I/O is real), so nothing
//! here depends on how fast the machine is.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use dra_core::testing::{
    CHECKPOINT_VERSION, Checkpoint, CheckpointStore, ClaimSource, ClaimSourceError,
    ConnectionLimits, Frame, InMemoryClaimSource, PREFACE, PluginMetrics, PluginOptions,
    PreparedClaim, dra_v1, unix_channel,
};
use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::Code;

mod support;
use support::Plugin;

const DRIVER: &str = "bounds.example.com";
const CLASS: &str = "bounds";
const UID: &str = "5b000000-0000-4000-8000-000000000001";

/// An API server that never answers.
struct Hung;

impl ClaimSource for Hung {
    fn get<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        Box::pin(std::future::pending())
    }
}

impl Plugin {
    fn checkpoint(&self) -> CheckpointStore {
        CheckpointStore::new(
            &self.running.sockets.data_dir,
            self.root().join("boot_id"),
            self.cdi_root(),
            PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
        )
    }
    async fn client(
        &self,
    ) -> dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        dra_v1::dra_plugin_client::DraPluginClient::new(unix_channel(self.dra()).await.unwrap())
    }
}

async fn start(claims: Arc<dyn ClaimSource>, configure: impl FnOnce(&mut PluginOptions)) -> Plugin {
    support::start(DRIVER, CLASS, claims, configure).await
}

async fn start_default() -> Plugin {
    support::start_empty(DRIVER, CLASS, |_| {}).await
}

fn claim(uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: "c".into(),
    }
}

#[tokio::test]
async fn both_sockets_are_private_to_their_owner() {
    let p = start_default().await;
    for socket in [&p.running.sockets.registration, &p.running.sockets.plugin] {
        let mode = std::fs::metadata(socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}: {mode:o}", socket.display());
    }
    // Nothing of the bind is left beside them.
    for dir in [
        p.running.sockets.registration.parent().unwrap(),
        p.running.sockets.plugin.parent().unwrap(),
    ] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name();
            assert!(!name.to_string_lossy().starts_with('.'), "{name:?}");
        }
    }
}

/// The self-check's empty prepare touches no state: it answers while
/// another process holds the prepare lock and while the checkpoint is one
/// this build refuses (a real prepare is then refused, as it should be).
#[tokio::test]
async fn an_empty_prepare_takes_no_lock_and_reads_no_checkpoint() {
    let p = start_default().await;
    let data_dir = &p.running.sockets.data_dir;
    let newer = format!(
        r#"{{"version":{},"bootId":"boot-1","claims":{{}}}}"#,
        CHECKPOINT_VERSION + 1
    );
    std::fs::write(data_dir.join("checkpoint.json"), &newer).unwrap();
    let mut client = p.client().await;

    let real = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim(UID)],
        })
        .await
        .unwrap()
        .into_inner();
    let refused = &real.claims[UID].error;
    assert!(refused.contains("newer than this build"), "{real:?}");

    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("prepare.lock"))
        .unwrap();
    lock.lock().unwrap();
    let empty = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(empty.claims.is_empty());
    lock.unlock().unwrap();
    assert_eq!(
        std::fs::read_to_string(data_dir.join("checkpoint.json")).unwrap(),
        newer
    );
}

/// A claim UID that is not a Kubernetes UID fails the call before it can
/// become a file name, in both directions.
#[tokio::test]
async fn claim_uids_that_are_not_kubernetes_uids_are_refused() {
    let p = start_default().await;
    let outside = p.root().join("victim.json");
    std::fs::write(&outside, "keep").unwrap();
    let mut client = p.client().await;
    for bad in [
        "../victim",
        "uid-1",
        "",
        "5b000000-0000-4000-8000-00000000000/",
    ] {
        let claims = vec![claim(UID), claim(bad)];
        let prepare = client
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: claims.clone(),
            })
            .await
            .unwrap_err();
        let unprepare = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims })
            .await
            .unwrap_err();
        for status in [prepare, unprepare] {
            assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
            assert!(
                status.message().contains("not a Kubernetes UID"),
                "{status:?}"
            );
        }
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
}

/// Unprepare removes only the claim's own spec in our CDI root, whatever
/// path the checkpoint recorded (it is a file on the node).
#[tokio::test]
async fn unprepare_removes_only_a_spec_that_is_ours() {
    let p = start_default().await;
    let cdi = p.cdi_root();
    std::fs::create_dir_all(&cdi).unwrap();
    let ours = |uid: &str| cdi.join(format!("k8s.{DRIVER}-{CLASS}_{uid}.json"));
    let other_uid = "5b000000-0000-4000-8000-000000000002";
    let victims = [
        p.root().join("elsewhere.json"),
        cdi.join("k8s.gpu.example.com-gpu_x.json"),
        ours(other_uid),
        cdi.join("..")
            .join(format!("k8s.{DRIVER}-{CLASS}_{UID}.json")),
    ];
    for (i, victim) in victims.iter().enumerate() {
        let uid = format!("5b000000-0000-4000-8000-00000000010{i}");
        std::fs::write(victim, "keep").unwrap();
        std::fs::write(ours(&uid), "{}").unwrap();
        let store = p.checkpoint();
        let mut checkpoint: Checkpoint = store.load().unwrap();
        checkpoint.claims.insert(
            uid.clone(),
            PreparedClaim {
                namespace: "ns".into(),
                name: "c".into(),
                devices: vec![],
                cdi_spec_path: victim.clone(),
            },
        );
        store.save(&checkpoint).unwrap();

        let answer = p
            .client()
            .await
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![claim(&uid)],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims[&uid].error, "", "{}", victim.display());
        assert_eq!(
            std::fs::read_to_string(victim).unwrap(),
            "keep",
            "{}",
            victim.display()
        );
        assert!(!ours(&uid).exists(), "the claim's own spec goes");
        assert!(!store.load().unwrap().claims.contains_key(&uid));
    }
}

/// A call that cannot finish (the API server never answers the claim GET)
/// is answered DEADLINE_EXCEEDED at its deadline: the DRA socket's is the
/// device release wait plus a margin, at least `call_deadline`.
#[tokio::test(start_paused = true)]
async fn a_call_that_cannot_finish_is_answered_at_its_deadline() {
    let p = start(Arc::new(Hung), |o| {
        o.device_release_wait = Duration::from_secs(5);
        o.connections.call_deadline = Duration::from_secs(1);
    })
    .await;
    let mut client = p.client().await;
    let started = tokio::time::Instant::now();
    let status = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim(UID)],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    // Paused clock: this is the deadline the server set, not machine speed.
    assert_eq!(
        started.elapsed().as_secs(),
        15,
        "release wait 5 s + margin 10 s"
    );
}

#[tokio::test]
async fn a_request_over_the_size_limit_is_refused() {
    let p = start_default().await;
    let mut client = p.client().await;
    let mut big = claim(UID);
    big.namespace = "n".repeat(ConnectionLimits::default().max_request_bytes + 1);
    let status = client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![big] })
        .await
        .unwrap_err();
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    // The connection is still good for a call of a sane size.
    client
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap();
}

fn preface_and_settings() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    Frame {
        frame_type: 0x4,
        flags: 0,
        stream: 0,
        payload: vec![],
    }
    .encode(&mut out);
    out
}

/// The server's first SETTINGS frame on a fresh connection.
async fn server_settings(conn: &mut UnixStream) -> Vec<(u16, u32)> {
    let mut head = [0u8; 9];
    conn.read_exact(&mut head).await.unwrap();
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    assert_eq!(head[3], 0x4, "first frame is SETTINGS");
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload).await.unwrap();
    payload
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_server_announces_its_concurrent_stream_limit() {
    let p = start(Arc::new(InMemoryClaimSource::new()), |o| {
        o.connections.max_concurrent_streams = 7;
    })
    .await;
    let mut conn = UnixStream::connect(p.dra()).await.unwrap();
    conn.write_all(&preface_and_settings()).await.unwrap();
    let settings = server_settings(&mut conn).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113 §6.5.2).
    assert!(settings.contains(&(0x3, 7)), "{settings:?}");
}

/// At the connection limit a new client waits until one closes.
#[tokio::test(start_paused = true)]
async fn connections_over_the_limit_wait_for_one_to_close() {
    let p = start(Arc::new(InMemoryClaimSource::new()), |o| {
        o.connections.max_connections = 1;
    })
    .await;
    let mut first = UnixStream::connect(p.dra()).await.unwrap();
    first.write_all(&preface_and_settings()).await.unwrap();
    server_settings(&mut first).await;

    let mut second = UnixStream::connect(p.dra()).await.unwrap();
    second.write_all(&preface_and_settings()).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_secs(60), server_settings(&mut second)).await;
    assert!(waiting.is_err(), "served beside the first connection");

    drop(first);
    server_settings(&mut second).await;
}
