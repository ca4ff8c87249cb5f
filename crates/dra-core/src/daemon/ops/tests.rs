use super::*;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One raw HTTP/1.1 request over TCP; returns (status, body).
async fn get(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.expect("read");
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn endpoints_over_tcp() {
    let registry = Registry::new();
    let counter = prometheus::IntCounter::new("aws_dra_test_total", "test").expect("counter");
    registry
        .register(Box::new(counter.clone()))
        .expect("register");
    counter.inc_by(7);

    let healthy = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let (h, c) = (healthy.clone(), calls.clone());
    let probe = HealthProbe::new(move || {
        let ok = h.load(Ordering::SeqCst);
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            if ok {
                Ok(())
            } else {
                Err("plugin socket not answering".to_string())
            }
        }
    })
    // Every request sees the current state (reuse is tested below).
    .reuse_for(Duration::ZERO);
    let readiness = Readiness::default();
    let server = OpsServer::bind(
        "127.0.0.1:0".parse().expect("addr"),
        registry,
        probe,
        readiness.clone(),
    )
    .await
    .expect("bind");
    let addr = server.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async {
        let _ = stop_rx.await;
    }));

    let (status, body) = get(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("aws_dra_test_total 7"), "{body}");

    assert_eq!(
        get(addr, "GET", "/healthz").await,
        (200, "ok\n".to_string())
    );
    assert_eq!(
        get(addr, "GET", "/readyz").await.0,
        503,
        "not ready before set"
    );
    readiness.set(true);
    assert_eq!(get(addr, "GET", "/readyz").await.0, 200);

    healthy.store(false, Ordering::SeqCst);
    assert_eq!(
        get(addr, "GET", "/healthz").await,
        (503, "unhealthy: plugin socket not answering\n".to_string())
    );
    assert_eq!(get(addr, "GET", "/readyz").await.0, 503);
    assert_eq!(calls.load(Ordering::SeqCst), 4, "probe runs per request");

    assert_eq!(get(addr, "GET", "/nope").await.0, 404);
    assert_eq!(get(addr, "POST", "/metrics").await.0, 405);
    assert_eq!(get(addr, "HEAD", "/metrics").await.0, 200);

    stop_tx.send(()).expect("stop");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops")
        .expect("join");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed after shutdown"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_probe_times_out() {
    let probe = HealthProbe::new(|| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    });
    let err = probe.check().await.expect_err("times out");
    assert!(err.contains("did not answer"), "{err}");
}

#[tokio::test]
async fn bind_error_names_address() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("addr");
    let err = OpsServer::bind(
        addr,
        Registry::new(),
        HealthProbe::always_ok(),
        Readiness::default(),
    )
    .await
    .err()
    .expect("address in use");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

/// Probes that arrive together share one run, and a finished run answers
/// every probe of the next [`PROBE_REUSE`]: a thousand probes in a second
/// cost one self-check, then the next second one more.
#[tokio::test(start_paused = true)]
async fn concurrent_probes_share_one_run_and_its_result_is_reused_for_a_second() {
    let runs = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(true));
    let (r, h) = (runs.clone(), healthy.clone());
    let probe = HealthProbe::new(move || {
        r.fetch_add(1, Ordering::SeqCst);
        let ok = h.load(Ordering::SeqCst);
        async move {
            // A self-check takes a moment: the storm arrives meanwhile.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if ok {
                Ok(())
            } else {
                Err("wedged".to_string())
            }
        }
    });
    let storm = (0..1_000).map(|_| {
        let probe = probe.clone();
        tokio::spawn(async move { probe.check().await })
    });
    for answer in futures::future::join_all(storm).await {
        assert_eq!(answer.unwrap(), Ok(()));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "one run for the whole storm"
    );

    // Within the reuse window: the same answer, no new run, even though
    // the state changed meanwhile.
    healthy.store(false, Ordering::SeqCst);
    tokio::time::advance(PROBE_REUSE / 2).await;
    assert_eq!(probe.check().await, Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Past it: a new run, which sees the change.
    tokio::time::advance(PROBE_REUSE).await;
    assert_eq!(probe.check().await, Err("wedged".to_string()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A failure is reused the same way.
    assert_eq!(probe.check().await, Err("wedged".to_string()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A probe whose requester went away (the HTTP client hung up) still
/// finishes for the next requester instead of starting over.
#[tokio::test(start_paused = true)]
async fn a_run_outlives_the_request_that_started_it() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let probe = HealthProbe::new(move || {
        r.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        }
    });
    let first = tokio::spawn({
        let probe = probe.clone();
        async move { probe.check().await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    first.abort();
    assert_eq!(probe.check().await, Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A client that shuts its side after the request (`nc -N`) still gets the
/// answer. The connection is served as `serve` serves one, over a pipe on
/// which the server sees the request and the end of input together: with
/// hyper's default (no half-close) it closes at that EOF with nothing
/// written.
#[test]
fn a_half_closed_connection_is_answered() {
    let answer = fuzz::ops_exchange(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", true, true);
    let raw = String::from_utf8_lossy(&answer);
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw:?}");
    assert!(raw.ends_with("\r\n\r\nok\n"), "{raw:?}");
    let answer = fuzz::ops_exchange(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false, false);
    let raw = String::from_utf8_lossy(&answer);
    assert!(
        raw.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{raw:?}"
    );
}
