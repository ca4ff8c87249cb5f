//! The operations HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.
//!
//! Plain HTTP/1.1 on `--metrics-address` (default [`DEFAULT_METRICS_ADDRESS`],
//! i.e. port 8080 on the pod network; the drivers do not use `hostNetwork`, so
//! the port cannot clash with other node agents). Only `GET` and `HEAD`.
//!
//! * `/metrics`: the Prometheus text format of the registry given in.
//! * `/healthz`: `200 ok` only when the injected probe succeeds within
//!   [`PROBE_TIMEOUT`] (the drivers probe their own kubelet sockets), else
//!   `503` with the probe's message. Used as the liveness probe.
//! * `/readyz`: like `/healthz`, and additionally `503` until the process
//!   marked itself ready ([`Readiness::set`]), e.g. after registration and
//!   the first publish; a DaemonSet rollout waits for it before moving on.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;

/// Default `--metrics-address`.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "0.0.0.0:8080";
/// Longest a health probe may take before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the server waits for open connections on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The future a health probe returns.
pub(crate) type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// An async check run for every `/healthz` and `/readyz` request.
#[derive(Clone)]
pub(crate) struct HealthProbe(Arc<dyn Fn() -> ProbeFuture + Send + Sync>);

impl HealthProbe {
    /// Wraps any `Fn() -> impl Future<Output = Result<(), String>>`.
    pub(crate) fn new<F, Fut>(probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        Self(Arc::new(move || Box::pin(probe())))
    }

    /// A probe that always succeeds (for `discover`-like tools and tests).
    #[cfg(test)]
    pub(crate) fn always_ok() -> Self {
        Self::new(|| async { Ok(()) })
    }

    async fn check(&self) -> Result<(), String> {
        match tokio::time::timeout(PROBE_TIMEOUT, (self.0)()).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "health probe did not answer within {PROBE_TIMEOUT:?}"
            )),
        }
    }
}

impl std::fmt::Debug for HealthProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HealthProbe")
    }
}

/// A shared "ready" flag, false until set, and what the process still
/// waits for (`/readyz` says it while not ready; see `daemon::ready`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Readiness(Arc<AtomicBool>, Arc<std::sync::Mutex<String>>);

impl Readiness {
    /// Marks the process ready (or not).
    pub(crate) fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Current value.
    pub(crate) fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Records what readiness waits for, in words (`the API server`).
    pub(crate) fn set_waiting_for(&self, what: String) {
        *self.1.lock().unwrap_or_else(|e| e.into_inner()) = what;
    }

    /// What readiness waits for; `still starting` before anyone said.
    pub(crate) fn waiting_for(&self) -> String {
        let what = self.1.lock().unwrap_or_else(|e| e.into_inner());
        if what.is_empty() {
            "still starting".to_owned()
        } else {
            format!("waiting for {what}")
        }
    }
}

/// The ops server could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpsError {
    /// Binding the listen address failed.
    #[error("binding the metrics/health address {address}: {source}")]
    Bind {
        /// Requested address.
        address: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

struct State {
    registry: Registry,
    health: HealthProbe,
    readiness: Readiness,
}

/// A bound, not yet serving ops server.
pub(crate) struct OpsServer {
    listener: TcpListener,
    state: Arc<State>,
}

impl OpsServer {
    /// Binds `address` (use port 0 to let the OS pick, see [`Self::local_addr`]).
    pub(crate) async fn bind(
        address: SocketAddr,
        registry: Registry,
        health: HealthProbe,
        readiness: Readiness,
    ) -> Result<Self, OpsError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| OpsError::Bind { address, source })?;
        Ok(Self {
            listener,
            state: Arc::new(State {
                registry,
                health,
                readiness,
            }),
        })
    }

    /// The address actually bound.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` completes, then gives open connections a short
    /// grace period. Accept errors (e.g. out of file descriptors) are logged
    /// and retried, never fatal.
    pub(crate) async fn serve(self, shutdown: impl Future<Output = ()>) {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(address = ?self.local_addr(), "ops server listening (/metrics, /healthz, /readyz)");
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                () = &mut shutdown => break,
            };
            let stream = match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "ops server accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let state = self.state.clone();
            let service = service_fn(move |req| handle(state.clone(), req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(error) = conn.await {
                    tracing::debug!(%error, "ops connection ended with an error");
                }
            });
        }
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
        }
        tracing::info!("ops server stopped");
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".into(),
        ));
    }
    let response = match req.uri().path() {
        "/metrics" => metrics(&state.registry),
        "/healthz" => match state.health.check().await {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => {
                tracing::warn!(reason = %why, "health check failed");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("unhealthy: {why}\n"),
                )
            }
        },
        "/readyz" if !state.readiness.is_ready() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", state.readiness.waiting_for()),
        ),
        "/readyz" => match state.health.check().await {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /healthz, /readyz\n".into(),
        ),
    };
    Ok(response)
}

fn metrics(registry: &Registry) -> Response<Full<Bytes>> {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut body) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {error}\n"),
        );
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    if let Ok(v) = HeaderValue::from_str(encoder.format_type()) {
        response.headers_mut().insert(CONTENT_TYPE, v);
    }
    response
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
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
        });
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
}
