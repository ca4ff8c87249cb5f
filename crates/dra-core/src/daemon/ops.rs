//! The operations HTTP endpoint: `/metrics`, `/healthz`, `/readyz`.
//!
//! Plain HTTP/1.1 on `--metrics-address` (default [`DEFAULT_METRICS_ADDRESS`],
//! i.e. port 8080 on the pod network, or the node's with the chart's
//! `hostNetwork`). Only `GET` and `HEAD`.
//!
//! * `/metrics`: the Prometheus text format of the registry given in.
//! * `/healthz`: `200 ok` only when the injected probe succeeds within
//!   [`PROBE_TIMEOUT`] (the drivers probe their own kubelet sockets), else
//!   `503` with the probe's message. Used as the liveness probe.
//! * `/readyz`: like `/healthz`, and additionally `503` until the process
//!   marked itself ready ([`Readiness::set`]), e.g. after registration and
//!   the first publish; a DaemonSet rollout waits for it before moving on.
//!
//! Whoever can reach the port (any pod, unless a NetworkPolicy says
//! otherwise) costs the node next to nothing however often it comes:
//!
//! * Probes: the probe runs once for all the requests that arrive while it
//!   runs (single flight), and its result answers every request for
//!   [`PROBE_REUSE`] after it finished. A storm of probes is one self-check
//!   a second.
//! * Scrapes: `/metrics` is rendered the same way, once for the scrapes
//!   that arrive together and reused for [`METRICS_REUSE`]; concurrent
//!   scrapes share one body ([`single_flight`]).
//! * Connections: at most [`slots::MAX_CONNECTIONS`] open; at the cap a new
//!   one evicts the oldest connection that has no request in progress, so
//!   slow connections cannot keep kubelet's probes out ([`slots`]). A
//!   connection gets [`HEADER_READ_TIMEOUT`] to send each request head.
//! * The server runs on a thread and runtime of its own
//!   ([`OpsServer::serve`]), so its connections never queue in front of
//!   kubelet's calls on the process's runtime.

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

use self::single_flight::{RunFuture, SingleFlight};
use self::slots::{MAX_CONNECTIONS, OpsMetrics, Slots};

/// Default `--metrics-address`.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "0.0.0.0:8080";
/// Longest a health probe may take before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a finished probe's result answers later requests.
pub(crate) const PROBE_REUSE: Duration = Duration::from_secs(1);
/// Longest the server waits for open connections on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest a connection may take to send a request's head, counted from
/// its accept and, on a kept-alive connection, from the previous answer.
/// Kubelet's prober and Prometheus send the head with the connect, so any
/// legitimate head arrives within milliseconds; 3 s still lets one whose
/// first segment was lost arrive after TCP's retransmission (1 s initial
/// timeout). A client that sends less holds its slot 3 s at most (and is
/// evicted sooner under pressure, see [`slots`]).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a rendered `/metrics` body answers later scrapes: a Prometheus
/// scrape interval is 10 s or more, so one scraper always sees a fresh
/// rendering, and a storm of scrapes renders once a second.
pub(crate) const METRICS_REUSE: Duration = Duration::from_secs(1);

/// The future a health probe returns.
pub(crate) type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The async check behind `/healthz` and `/readyz`, run at most once at a
/// time and at most about once per [`PROBE_REUSE`] (see the module doc).
#[derive(Clone)]
pub(crate) struct HealthProbe(SingleFlight<Result<(), String>>);

impl HealthProbe {
    /// Wraps any `Fn() -> impl Future<Output = Result<(), String>>`.
    pub(crate) fn new<F, Fut>(probe: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        Self(SingleFlight::new(PROBE_REUSE, move || {
            Box::pin(bounded(Box::pin(probe())))
        }))
    }

    /// How long a finished result is reused ([`PROBE_REUSE`] unless set).
    #[cfg(test)]
    pub(crate) fn reuse_for(self, reuse: Duration) -> Self {
        Self(self.0.reuse_for(reuse))
    }

    /// A probe that always succeeds (for `discover`-like tools and tests).
    #[cfg(test)]
    pub(crate) fn always_ok() -> Self {
        Self::new(|| async { Ok(()) })
    }

    /// The probe's answer: a recent one, the one in flight, or a new run.
    async fn check(&self) -> Result<(), String> {
        self.0.get().await
    }
}

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
    /// Registering the server's own metrics failed.
    #[error("registering the ops server's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What every request may use.
struct State {
    metrics: MetricsCache,
    health: HealthProbe,
    readiness: Readiness,
}

impl State {
    fn new(registry: Registry, health: HealthProbe, readiness: Readiness) -> Self {
        Self {
            metrics: MetricsCache::new(registry),
            health,
            readiness,
        }
    }
}

/// A bound, not yet serving ops server.
pub(crate) struct OpsServer {
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Slots>,
}

impl OpsServer {
    /// Binds `address` (use port 0 to let the OS pick, see [`Self::local_addr`])
    /// and registers the server's connection metrics in `registry`.
    pub(crate) async fn bind(
        address: SocketAddr,
        registry: Registry,
        health: HealthProbe,
        readiness: Readiness,
    ) -> Result<Self, OpsError> {
        let metrics = OpsMetrics::register(&registry)?;
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| OpsError::Bind { address, source })?;
        Ok(Self {
            listener,
            state: Arc::new(State::new(registry, health, readiness)),
            slots: Slots::new(MAX_CONNECTIONS, metrics),
        })
    }

    /// At most `cap` open connections instead of [`MAX_CONNECTIONS`].
    #[cfg(test)]
    pub(crate) fn max_connections(mut self, cap: usize) -> Self {
        self.slots = Slots::new(cap, self.slots.metrics().clone());
        self
    }

    /// The address actually bound.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` completes, then gives open connections a short
    /// grace period. Accept errors (e.g. out of file descriptors) are logged
    /// and retried, never fatal.
    ///
    /// The server runs on a thread of its own (a current-thread runtime),
    /// not on the process's runtime: the connections it accepts, whoever
    /// opens them and however fast, never queue in front of kubelet's calls
    /// on the runtime's two workers. Probes and scrapes run there too.
    pub(crate) async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let address = self.local_addr();
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let listener = match self.listener.into_std() {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, ?address, "ops server: taking the listener to its thread failed");
                return;
            }
        };
        let (state, slots) = (self.state, self.slots);
        let thread = std::thread::Builder::new()
            .name("ops-server".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => serve_on(listener, state, slots, shutdown).await,
                            Err(error) => {
                                tracing::error!(%error, "ops server: registering the listener failed");
                            }
                        }
                    }),
                    Err(error) => tracing::error!(%error, "ops server: starting its runtime failed"),
                }
                // The runtime and every connection are gone: the port is closed.
                let _ = done.send(());
            });
        if let Err(error) = thread {
            tracing::error!(%error, "ops server: starting its thread failed");
            return;
        }
        let _ = finished.await;
    }
}

/// The accept loop and its connections, on the ops server's own runtime.
async fn serve_on(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Slots>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::info!(address = ?listener.local_addr().ok(), max_connections = slots.cap(), "ops server listening (/metrics, /healthz, /readyz)");
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
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
        // At the cap, the oldest idle connection makes room; when every
        // one is serving a request, this one is closed at once.
        // Per-connection events are logged at trace level only: the
        // client decides how often they happen (the slots warn once a
        // minute at the cap).
        let Some(taken) = slots.admit() else {
            tracing::trace!("ops server: every connection slot serving; closing a new one");
            continue;
        };
        let conn_state = state.clone();
        let slot = taken.slot.clone();
        let service = service_fn(move |req| {
            let serving = slot.serving();
            let state = conn_state.clone();
            async move {
                match serving {
                    Some(_serving) => handle(state, req).await,
                    // Evicted between its head and now: it is closing.
                    None => Ok(text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "too many connections\n".into(),
                    )),
                }
            }
        });
        let conn = http1().serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let slot = taken.slot.clone();
            tokio::select! {
                ended = conn => if let Err(error) = ended {
                    tracing::trace!(%error, "ops connection ended with an error");
                },
                () = slot.evicted() => {
                    tracing::trace!("ops connection evicted to make room for a new one");
                }
            }
            drop(taken);
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
    tracing::info!("ops server stopped");
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
        "/metrics" => state.metrics.response().await,
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

/// `/metrics`, rendered at most once per [`METRICS_REUSE`]; the scrapes
/// that arrive together share one rendering and one body.
#[derive(Clone)]
struct MetricsCache(SingleFlight<Rendered>);

/// A rendered `/metrics` answer (cheap to clone: the body is shared).
#[derive(Clone)]
struct Rendered {
    status: StatusCode,
    content_type: HeaderValue,
    body: Bytes,
}

impl MetricsCache {
    fn new(registry: Registry) -> Self {
        Self(SingleFlight::new(METRICS_REUSE, move || {
            let registry = registry.clone();
            Box::pin(async move { render(&registry) }) as RunFuture<Rendered>
        }))
    }

    /// How long a rendering is reused ([`METRICS_REUSE`] unless set).
    #[cfg(test)]
    fn reuse_for(self, reuse: Duration) -> Self {
        Self(self.0.reuse_for(reuse))
    }

    async fn response(&self) -> Response<Full<Bytes>> {
        let rendered = self.0.get().await;
        let mut response = Response::new(Full::new(rendered.body));
        *response.status_mut() = rendered.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, rendered.content_type);
        response
    }
}

fn render(registry: &Registry) -> Rendered {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => Rendered {
            status: StatusCode::OK,
            content_type: HeaderValue::from_str(encoder.format_type())
                .unwrap_or_else(|_| HeaderValue::from_static("text/plain")),
            body: Bytes::from(body),
        },
        Err(error) => Rendered {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            content_type: HeaderValue::from_static("text/plain; charset=utf-8"),
            body: Bytes::from(format!("encoding metrics: {error}\n")),
        },
    }
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
mod limit_tests;
pub(crate) mod single_flight;
pub(crate) mod slots;
#[cfg(test)]
mod tests;
