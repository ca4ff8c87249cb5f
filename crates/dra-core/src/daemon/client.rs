//! The Kubernetes API client of a driver, from the usual kubeconfig
//! resolution: an explicit file, then the in-cluster service account, then
//! the default kubeconfig.
//!
//! Apart from [`crate::daemon::cli`] (which re-exports it, its public path) because
//! the runtime needs a client and the command line builds the runtime's
//! options: with the client in `cli`, the two modules imported each other.
//!
//! Every client is bounded: connecting (TCP and TLS) gets
//! [`CONNECT_TIMEOUT`], each read of a connection [`READ_TIMEOUT`] (longer
//! than a quiet watch lasts, so a watch is never cut by it), and every
//! request that is not a watch a deadline of its own
//! ([`crate::daemon::request_deadline`], `--api-request-timeout`).
//!
//! Its connections ([`connection`]) offer HTTP/2 and turn Nagle off, so the
//! watch, the claim GETs and the writes share one connection.

mod connection;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::daemon::request_deadline::RequestDeadlineLayer;

/// Longest a connection to the API server may take to open, TLS included.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection may go without a byte arriving while a request
/// waits on it: above the 290 s a watch asks the server to stay open
/// (`timeoutSeconds`), and kube's 5 s margin on top, so only a dead
/// connection reaches it.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// No usable cluster configuration.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The explicit kubeconfig could not be used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// File given with `--kubeconfig`/`KUBECONFIG`.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster config nor the default kubeconfig worked.
    #[error("no cluster configuration: in-cluster: {incluster}; default kubeconfig: {kubeconfig}")]
    NotFound {
        /// In-cluster failure.
        incluster: kube::config::InClusterError,
        /// Default kubeconfig failure.
        kubeconfig: kube::config::KubeconfigError,
    },
    /// The configuration was found but a client could not be built from it.
    #[error("building the Kubernetes client: {0}")]
    Build(#[from] connection::StackError),
}

/// Builds a client: an explicit `--kubeconfig` (or `KUBECONFIG`, its env twin)
/// wins; otherwise the in-cluster service account; otherwise the default
/// kubeconfig (`~/.kube/config`). Each non-watch request gets
/// `request_timeout`. Nothing is sent to the API server here.
pub(crate) async fn kube_client(
    kubeconfig: Option<&Path>,
    request_timeout: Duration,
) -> Result<kube::Client, ClientError> {
    // rustls refuses to guess when feature unification compiles in more than
    // one crypto provider (a dependency can pull in aws-lc-rs next to kube's
    // ring); pick ring for the whole process. Err only means one is already set.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let options = kube::config::KubeConfigOptions::default();
    let mut config = match kubeconfig {
        Some(path) => {
            let wrap = |source| ClientError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(wrap)?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(wrap)?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(incluster) => {
                kube::Config::from_kubeconfig(&options)
                    .await
                    .map_err(|kubeconfig| ClientError::NotFound {
                        incluster,
                        kubeconfig,
                    })?
            }
        },
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    // The read timeout counts from the request, not from when its pooled
    // connection last saw a byte.
    config.reset_reader_on_write = true;
    Ok(connection::builder(config)?
        .with_layer(&RequestDeadlineLayer::new(request_timeout))
        .build())
}
