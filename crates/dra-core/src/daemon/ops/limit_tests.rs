//! The ops server's bounds: the connection cap and who gets a slot at it,
//! the header timeout, and one `/metrics` rendering for concurrent scrapes.

use super::*;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One raw `GET` over a new connection; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A connection that sends one byte of a request head and holds.
async fn slow(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"G").await.expect("write");
    s
}

/// Whether the server closed `s` within `within` (EOF or reset, with
/// nothing written before it).
async fn closed(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(within, s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!(
            "the server wrote to a connection without a request: {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(_) => false,
    }
}

/// The value of the unlabelled or `label`led sample `name` in `registry`.
fn sample(registry: &Registry, name: &str, label: Option<&str>) -> f64 {
    let family = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} is not registered"));
    let metric = family
        .get_metric()
        .iter()
        .find(|m| label.is_none_or(|l| m.get_label().iter().any(|p| p.value() == l)))
        .unwrap_or_else(|| panic!("no {name} {label:?}"));
    if family.get_field_type() == prometheus::proto::MetricType::COUNTER {
        metric.get_counter().value()
    } else {
        metric.get_gauge().value()
    }
}

/// Waits (bounded) until `name` reads `want`.
async fn until(registry: &Registry, name: &str, label: Option<&str>, want: f64) {
    let t = std::time::Instant::now();
    while sample(registry, name, label) != want {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{name} {label:?} stays {} (want {want})",
            sample(registry, name, label)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const OPEN: &str = "aws_dra_ops_connections_open";
const REJECTED: &str = "aws_dra_ops_connections_rejected_total";

/// A server on 127.0.0.1:0 with at most `cap` connections; its address,
/// its registry and the sender that stops it.
async fn start(
    cap: usize,
    probe: HealthProbe,
) -> (SocketAddr, Registry, tokio::sync::oneshot::Sender<()>) {
    let registry = Registry::new();
    let readiness = Readiness::default();
    readiness.set(true);
    let server = OpsServer::bind(
        "127.0.0.1:0".parse().expect("addr"),
        registry.clone(),
        probe,
        readiness,
    )
    .await
    .expect("bind")
    .max_connections(cap);
    let addr = server.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    (addr, registry, stop)
}

/// An attacker holds every slot with connections that sent one byte: a
/// probe still gets in and is answered, the oldest slow connection making
/// room, and the other slow connections stay open. Each newcomer evicts
/// the next oldest.
#[tokio::test]
async fn at_the_cap_a_probe_evicts_the_oldest_slow_connection_and_is_answered() {
    const CAP: usize = 4;
    let (addr, registry, _stop) = start(CAP, HealthProbe::always_ok()).await;
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(slow(addr).await);
    }
    until(&registry, OPEN, None, CAP as f64).await;

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_string()));
    assert!(
        closed(&mut held[0], Duration::from_secs(1)).await,
        "the oldest slow connection is evicted"
    );
    for s in &mut held[1..] {
        assert!(
            !closed(s, Duration::from_millis(50)).await,
            "younger ones stay"
        );
    }
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 1.0);
    assert_eq!(sample(&registry, REJECTED, Some("refused")), 0.0);

    // The probe's slot is free again: one more slow connection fits
    // without eviction, and the next request evicts the next oldest.
    until(&registry, OPEN, None, (CAP - 1) as f64).await;
    held.push(slow(addr).await);
    until(&registry, OPEN, None, CAP as f64).await;
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 1.0);
    assert_eq!(get(addr, "/readyz").await.0, 200);
    assert!(closed(&mut held[1], Duration::from_secs(1)).await);
    for s in &mut held[2..] {
        assert!(!closed(s, Duration::from_millis(50)).await);
    }
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 2.0);
    until(&registry, OPEN, None, (CAP - 1) as f64).await;
}

/// When every slot is serving a request (here: waiting for a wedged
/// probe), a new connection is closed unanswered and counted; once the
/// requests are answered, the slots serve again.
#[tokio::test]
async fn with_every_slot_serving_a_new_connection_is_closed_at_once() {
    let release = Arc::new(tokio::sync::Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let probe = {
        let (release, calls) = (release.clone(), calls.clone());
        HealthProbe::new(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            let release = release.clone();
            async move {
                release.notified().await;
                Ok(())
            }
        })
    };
    let (addr, registry, _stop) = start(1, probe).await;
    let waiting = tokio::spawn(get(addr, "/healthz"));
    let t = std::time::Instant::now();
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the probe never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let mut refused = TcpStream::connect(addr).await.expect("connect");
    assert!(
        closed(&mut refused, Duration::from_secs(2)).await,
        "closed with nothing written"
    );
    assert_eq!(sample(&registry, REJECTED, Some("refused")), 1.0);
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 0.0);

    release.notify_one();
    assert_eq!(waiting.await.expect("join").0, 200);
    assert_eq!(get(addr, "/healthz").await.0, 200);
}

/// A connection that never completes its request head is closed after
/// [`HEADER_READ_TIMEOUT`], with or without other connections about.
#[tokio::test]
async fn a_connection_without_a_request_head_is_closed_after_the_header_timeout() {
    let (addr, registry, _stop) = start(8, HealthProbe::always_ok()).await;
    let t = std::time::Instant::now();
    let mut s = slow(addr).await;
    assert!(
        closed(&mut s, HEADER_READ_TIMEOUT + Duration::from_secs(2)).await,
        "still open after {:?}",
        t.elapsed()
    );
    let took = t.elapsed();
    assert!(
        took >= HEADER_READ_TIMEOUT - Duration::from_millis(100),
        "closed after {took:?}, before the timeout"
    );
    until(&registry, OPEN, None, 0.0).await;
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 0.0);
}

/// Counts the registry's renderings: every `gather` collects it once. A
/// rendering takes a while, so that scrapes overlap it.
struct Renders(Arc<AtomicUsize>, Vec<prometheus::core::Desc>);

impl prometheus::core::Collector for Renders {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.1.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        Vec::new()
    }
}

/// Scrapes that arrive together share one rendering, and it answers the
/// scrapes of the next [`METRICS_REUSE`]; after that, a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_scrapes_share_one_rendering() {
    let (addr, registry, _stop) = start(64, HealthProbe::always_ok()).await;
    let renders = Arc::new(AtomicUsize::new(0));
    let desc = prometheus::core::Desc::new(
        "aws_dra_test_renders".into(),
        "t".into(),
        vec![],
        Default::default(),
    )
    .expect("desc");
    registry
        .register(Box::new(Renders(renders.clone(), vec![desc])))
        .expect("register");

    let t = std::time::Instant::now();
    let scrapes = (0..8).map(|_| tokio::spawn(get(addr, "/metrics")));
    let answers = futures::future::join_all(scrapes).await;
    assert!(
        t.elapsed() < METRICS_REUSE,
        "the scrapes took {:?}: not within one reuse period",
        t.elapsed()
    );
    let first = answers[0].as_ref().expect("join").clone();
    assert_eq!(first.0, 200);
    assert!(first.1.contains(OPEN), "{}", first.1);
    for answer in answers {
        assert_eq!(answer.expect("join"), first, "one body for all");
    }
    assert_eq!(renders.load(Ordering::SeqCst), 1, "one rendering");

    tokio::time::sleep(METRICS_REUSE + Duration::from_millis(100)).await;
    assert_eq!(get(addr, "/metrics").await.0, 200);
    assert_eq!(
        renders.load(Ordering::SeqCst),
        2,
        "a new one after the reuse"
    );
}

/// The same at the cache, on paused time: within the reuse period no new
/// rendering, past it one.
#[tokio::test(start_paused = true)]
async fn a_rendering_is_reused_for_its_period_only() {
    let registry = Registry::new();
    let renders = Arc::new(AtomicUsize::new(0));
    let desc = prometheus::core::Desc::new(
        "aws_dra_test_renders".into(),
        "t".into(),
        vec![],
        Default::default(),
    )
    .expect("desc");
    registry
        .register(Box::new(Renders(renders.clone(), vec![desc])))
        .expect("register");
    let cache = MetricsCache::new(registry).reuse_for(Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(cache.response().await.status(), StatusCode::OK);
    }
    assert_eq!(renders.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(4)).await;
    cache.response().await;
    assert_eq!(renders.load(Ordering::SeqCst), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    cache.response().await;
    assert_eq!(renders.load(Ordering::SeqCst), 2);
}

/// The slots alone: at the cap the oldest idle slot is evicted, a busy
/// one never; with every slot busy, nothing is admitted.
#[test]
fn the_oldest_idle_slot_is_evicted_and_a_busy_one_never() {
    let registry = Registry::new();
    let slots = Slots::new(2, OpsMetrics::register(&registry).expect("register"));
    let first = slots.admit().expect("room");
    let second = slots.admit().expect("room");
    let busy_first = first.slot.serving().expect("idle");
    let third = slots.admit().expect("the second makes room");
    assert!(second.slot.serving().is_none(), "evicted: no more requests");
    assert_eq!(sample(&registry, REJECTED, Some("evicted")), 1.0);
    let busy_third = third.slot.serving().expect("idle");
    assert!(slots.admit().is_none(), "both busy");
    assert_eq!(sample(&registry, REJECTED, Some("refused")), 1.0);
    drop(busy_first);
    let fourth = slots.admit().expect("the first, idle again, makes room");
    assert!(first.slot.serving().is_none());
    drop((first, second, busy_third));
    assert_eq!(sample(&registry, OPEN, None), 2.0);
    drop((third, fourth));
    assert_eq!(sample(&registry, OPEN, None), 0.0);
}
