//! Liveness: talk to ourselves over the sockets kubelet uses.
//!
//! `self_check` calls registration `GetInfo` and an empty v1
//! `NodePrepareResources`, each with a timeout, so `/healthz` fails when
//! either socket or server is wedged, not merely when the process is gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use crate::kubelet::proto::{dra_v1, pluginregistration as reg};

const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum SelfCheckError {
    #[error("connecting to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("{call} over {path}: {status}")]
    Call {
        call: &'static str,
        path: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("{call} over {path}: no answer within {CALL_TIMEOUT:?}")]
    Timeout { call: &'static str, path: PathBuf },
}

/// Opens a gRPC channel over a Unix socket.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API but unused: the connector dials the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// GetInfo over the registration socket, then an empty NodePrepareResources
/// over the plugin socket. Returns what registration reported.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub async fn self_check(
    registration_socket: &Path,
    plugin_socket: &Path,
) -> Result<reg::PluginInfo, SelfCheckError> {
    let connect = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SelfCheckError::Connect { path, source }
    };
    let call = |call: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |status| SelfCheckError::Call {
            call,
            path,
            status: Box::new(status),
        }
    };
    let timeout = |call: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |_| SelfCheckError::Timeout { call, path }
    };

    let channel = unix_channel(registration_socket)
        .await
        .map_err(connect(registration_socket))?;
    let info = tokio::time::timeout(
        CALL_TIMEOUT,
        reg::registration_client::RegistrationClient::new(channel).get_info(reg::InfoRequest {}),
    )
    .await
    .map_err(timeout("GetInfo", registration_socket))?
    .map_err(call("GetInfo", registration_socket))?
    .into_inner();

    let channel = unix_channel(plugin_socket)
        .await
        .map_err(connect(plugin_socket))?;
    tokio::time::timeout(
        CALL_TIMEOUT,
        dra_v1::dra_plugin_client::DraPluginClient::new(channel)
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![] }),
    )
    .await
    .map_err(timeout("NodePrepareResources", plugin_socket))?
    .map_err(call("NodePrepareResources", plugin_socket))?;
    Ok(info)
}
