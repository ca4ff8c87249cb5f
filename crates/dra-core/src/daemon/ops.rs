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
//!
//! Probes cost the node next to nothing however often they come: the
//! probe runs once for all the requests that arrive while it runs (single
//! flight), and its result answers every request for [`PROBE_REUSE`] after
//! it finished. A storm of probes is one self-check a second.
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

use futures::FutureExt;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Default `--metrics-address`.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "0.0.0.0:8080";
/// Longest a health probe may take before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a finished probe's result answers later requests.
pub(crate) const PROBE_REUSE: Duration = Duration::from_secs(1);
/// Longest the server waits for open connections on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest a connection may take to send a request's head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The future a health probe returns.
pub(crate) type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The async check behind `/healthz` and `/readyz`, run at most once at a
/// time and at most about once per [`PROBE_REUSE`] (see the module doc).
#[derive(Clone)]
pub(crate) struct HealthProbe {
    run: Arc<dyn Fn() -> ProbeFuture + Send + Sync>,
    last: Arc<std::sync::Mutex<LastProbe>>,
    reuse: Duration,
}

/// A probe run shared by every request that arrives while it runs.
type SharedRun = futures::future::Shared<Pin<Box<dyn Future<Output = Result<(), String>> + Send>>>;

/// The latest probe run: in flight, or finished (when, and its result).
#[derive(Default)]
enum LastProbe {
    #[default]
    Never,
    Running {
        id: u64,
        run: SharedRun,
    },
    Done {
        at: Instant,
        result: Result<(), String>,
    },
}

impl HealthProbe {
    /// Wraps any `Fn() -> impl Future<Output = Result<(), String>>`.
    pub(crate) fn new<F, Fut>(probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        Self {
            run: Arc::new(move || Box::pin(probe())),
            last: Arc::default(),
            reuse: PROBE_REUSE,
        }
    }

    /// How long a finished result is reused ([`PROBE_REUSE`] unless set).
    #[cfg(test)]
    pub(crate) fn reuse_for(mut self, reuse: Duration) -> Self {
        self.reuse = reuse;
        self
    }

    /// A probe that always succeeds (for `discover`-like tools and tests).
    #[cfg(test)]
    pub(crate) fn always_ok() -> Self {
        Self::new(|| async { Ok(()) })
    }

    /// The probe's answer: a recent one, the one in flight, or a new run.
    async fn check(&self) -> Result<(), String> {
        let (id, run) = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match &*last {
                LastProbe::Done { at, result } if at.elapsed() < self.reuse => {
                    return result.clone();
                }
                LastProbe::Running { id, run } => (*id, run.clone()),
                LastProbe::Never | LastProbe::Done { .. } => {
                    let id = RUNS.fetch_add(1, Ordering::Relaxed);
                    let run = bounded((self.run)()).boxed().shared();
                    *last = LastProbe::Running {
                        id,
                        run: run.clone(),
                    };
                    (id, run)
                }
            }
        };
        let result = run.await;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(&*last, LastProbe::Running { id: running, .. } if *running == id) {
            *last = LastProbe::Done {
                at: Instant::now(),
                result: result.clone(),
            };
        }
        result
    }
}

/// Numbers probe runs, so that only the run in flight is recorded as done.
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `probe`, failed once it has taken [`PROBE_TIMEOUT`].
async fn bounded(probe: ProbeFuture) -> Result<(), String> {
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "health probe did not answer within {PROBE_TIMEOUT:?}"
        )),
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
            let conn = http1().serve_connection(TokioIo::new(stream), service);
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

/// The HTTP/1.1 settings of every connection (the fuzz target's too).
/// Half-closed connections are answered: a client that ends its side
/// after the request (`nc -N`, some probers) gets its response, where
/// hyper's default drops the request unanswered at the first EOF (found by
/// the `ops_http` fuzz target's first input).
fn http1() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .half_close(true);
    builder
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

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzz;
#[cfg(test)]
mod tests;
