//! How the client talks to the API server: one HTTP/2 connection when the
//! server offers it, sockets without Nagle's delay, and kept-alive TCP.
//!
//! kube's own stack (`ClientBuilder::try_from(Config)`) is HTTP/1.1 only and
//! leaves Nagle's algorithm on. Measured on a driver in `cargo xtask bench`
//! (docs/performance.md), that cost prepare most of its time:
//! - HTTP/1.1 holds one connection per request in flight, and the
//!   publisher's watch holds one for good, so a claim GET needed a
//!   connection of its own, and a burst of N prepares opened up to N;
//! - a new connection's first request waited about 40 ms: with Nagle on,
//!   it waits for the ACK of the TLS handshake's last flight, which the
//!   server delays (Linux: 40 ms) because it has nothing to send;
//! - the pool drops a connection idle for 90 s, so at a node's usual pace
//!   (a pod now and then) nearly every claim GET paid that: 44-53 ms
//!   against the API server's 1.7 ms for the same GET.
//!
//! With HTTP/2 (ALPN `h2`, then `http/1.1`) every request multiplexes onto
//! the connection the publisher's watch keeps open, as client-go's do: no
//! handshake inside a prepare, and a burst's GETs share it. Without `h2`
//! (a proxy that speaks only HTTP/1.1) it is the old behaviour, minus the
//! Nagle wait. TCP keepalive (first probe after 30 s idle, then every 10 s,
//! 3 unanswered: about a minute) finds a connection whose peer vanished (an
//! API server failover, a load balancer that forgot the flow) without a
//! wake-up of the process, and keeps a load balancer's idle timer (AWS NLB:
//! 350 s) from expiring a quiet connection.
//!
//! Everything else is kube's: base URI, retry policy, authentication
//! (including the refreshed in-cluster token), extra headers, connect and
//! read timeouts. A kubeconfig with a `proxy-url` gets kube's stack as is.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// First keepalive probe after this long without traffic.
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Between unanswered probes.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel drops the connection.
pub(crate) const KEEPALIVE_PROBES: u32 = 3;

/// The error of building the stack: kube's, or a TLS server name that is
/// not one.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StackError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("tls-server-name {name:?} is not a valid server name: {message}")]
    ServerName { name: String, message: String },
}

/// The service under every client (kube's `GenericService`).
pub(crate) type Stack = tower::util::BoxService<
    hyper::Request<kube::client::Body>,
    hyper::Response<Box<DynBody>>,
    BoxError,
>;

/// The TCP connector under TLS: no Nagle delay, kept alive.
pub(crate) fn tcp_connector() -> HttpConnector {
    let mut http = HttpConnector::new();
    // The scheme is the TLS layer's business (https_or_http below).
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http
}

/// kube's client stack for `config`, on [`tcp_connector`] with HTTP/2
/// offered. The builder still takes layers (the request deadline).
pub(crate) fn builder(config: kube::Config) -> Result<ClientBuilder<Stack>, StackError> {
    if config.proxy_url.is_some() {
        return Ok(ClientBuilder::try_from(config)?);
    }
    let tls = config.rustls_client_config()?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let server_name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            StackError::ServerName {
                name: name.clone(),
                message: e.to_string(),
            }
        })?;
        https = https
            .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(server_name));
    }
    let https = https.enable_all_versions().wrap_connector(tcp_connector());
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);

    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(pool)
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(ClientBuilder::new(service, config.default_namespace))
}
