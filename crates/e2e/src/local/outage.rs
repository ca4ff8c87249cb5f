//! An API server outage on the local cluster, for the scenario of a node
//! whose driver starts while the control plane is down: the API server
//! process is stopped (etcd, the controller manager, the scheduler, the
//! kubelets, containerd and the drivers keep running) and started again
//! from the same command line, and a driver's `/readyz` is read whatever
//! its status, since a driver that waits answers 503 and says for what.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::LocalTestbed;
use crate::host_env::http_get_status;
use crate::testbed::DriverKind;
use local_cluster::error::{Error, Result};

/// The control-plane process stopped for the outage.
const API_SERVER: &str = "kube-apiserver";

/// How long the API server may take to answer `/readyz` again once started.
const BACK_TIMEOUT: Duration = Duration::from_secs(120);

impl LocalTestbed {
    /// Stops the API server, runs `outage`, starts the API server again
    /// (also when `outage` failed: the scenarios after this one need it) and
    /// waits until it is ready.
    pub(super) async fn api_server_outage<R>(&self, outage: impl Future<Output = R>) -> Result<R> {
        let stopped = self.cluster.lock().await.stop_control_plane(API_SERVER)?;
        tracing::info!("kube-apiserver stopped");
        let output = outage.await;
        self.cluster.lock().await.start_control_plane(&stopped)?;
        let started = Instant::now();
        while !self.api_server_ready().await {
            if started.elapsed() > BACK_TIMEOUT {
                return Err(Error::Timeout {
                    what: "kube-apiserver /readyz after the outage".into(),
                    after: BACK_TIMEOUT,
                    logs: self.run_dir.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tracing::info!(
            back_ms = started.elapsed().as_millis() as u64,
            "kube-apiserver ready again"
        );
        Ok(output)
    }

    async fn api_server_ready(&self) -> bool {
        let mut request = http::Request::new(Vec::new());
        *request.uri_mut() = http::Uri::from_static("/readyz");
        matches!(self.client.request_text(request).await, Ok(body) if body.trim() == "ok")
    }

    /// The driver's `/readyz` on its ops port: status and body.
    pub(super) async fn readyz(&self, node: &str, kind: DriverKind) -> Result<(u16, String)> {
        let port = self.with_slot(node, kind, |_, s| s.metrics_port)?;
        tokio::task::spawn_blocking(move || {
            http_get_status(SocketAddr::from(([127, 0, 0, 1], port)), "/readyz")
        })
        .await
        .map_err(|e| Error::Testbed(format!("readyz task: {e}")))?
    }
}
