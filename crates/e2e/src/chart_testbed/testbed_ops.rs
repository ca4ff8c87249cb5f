//! The [`Testbed`] operations of [`ChartTestbed`]: drivers started and
//! stopped through their node labels, crashes as container kills, files and
//! metrics read through the host.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::charts::{self};
use crate::testbed::{DriverKind, ImageUpgrade, NodeDir, NodeInfo, Testbed, TestbedOp};
use local_cluster::error::{Error, Result};

use super::host::{ChartHost, POD_DRIVER_LABEL};
use super::{ChartTestbed, POD_TIMEOUT, block, container_id, json_err, kube_err, pod_ready};

impl<H: ChartHost> Testbed for ChartTestbed<H> {
    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    fn nodes(&self) -> Vec<NodeInfo> {
        self.nodes
            .lock()
            .map(|n| n.iter().map(|n| n.info.clone()).collect())
            .unwrap_or_default()
    }

    async fn ensure_node(
        &self,
        name: &str,
        instance_type: &str,
        drivers: &[DriverKind],
    ) -> Result<()> {
        if self.nodes().iter().any(|n| n.name == name) {
            return Ok(());
        }
        self.setup_node(name, instance_type, drivers).await
    }

    /// Labels the node so that the DaemonSet runs a pod there, then waits
    /// for it to be ready and its pool complete. When the label is already
    /// there (the pod was killed and kubelet restarts it), waits for the
    /// restarted container instead.
    async fn start_driver(&self, node: &str, kind: DriverKind) -> Result<Duration> {
        let started = Instant::now();
        let killed = Self::lock(&self.killed)?.remove(&(node.to_string(), kind));
        if self.run_label_set(node, kind).await? {
            if killed.is_none()
                && self
                    .live_pod(node, kind)
                    .await?
                    .is_some_and(|p| pod_ready(&p))
            {
                return Err(Error::Testbed(format!(
                    "{} already runs on {node}",
                    kind.binary()
                )));
            }
        } else {
            self.set_run_label(node, kind, true).await?;
        }
        self.wait_ready(node, kind, killed.as_deref()).await?;
        self.wait_for_pool(node, kind).await?;
        let elapsed = started.elapsed();
        if let Ok(mut t) = self.start_times.lock()
            && !t.iter().any(|(n, k, _)| n == node && *k == kind)
        {
            t.push((node.to_string(), kind, elapsed));
        }
        tracing::info!(
            node,
            driver = kind.binary(),
            elapsed_ms = elapsed.as_millis() as u64,
            "pool complete"
        );
        Ok(elapsed)
    }

    fn kill_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        let pod = block(&self.handle, self.live_pod(node, kind))?
            .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
        let id = container_id(&pod).ok_or_else(|| {
            Error::Testbed(format!("{} pod on {node} has no container", kind.binary()))
        })?;
        let node_name = self.layout(node)?.node_name;
        self.host.kill_container(&node_name, &id)?;
        Self::lock(&self.killed)?.insert((node.to_string(), kind), id);
        Ok(())
    }

    /// Removes the node label; the DaemonSet controller deletes the pod and
    /// kubelet stops it gracefully (SIGTERM).
    async fn stop_driver(&self, node: &str, kind: DriverKind) -> Result<()> {
        self.set_run_label(node, kind, false).await?;
        let started = Instant::now();
        while !self.pods(node, kind).await?.is_empty() {
            if started.elapsed() > POD_TIMEOUT {
                let release = self.unit(node, kind).map(|u| u.release).unwrap_or_default();
                return Err(Error::Testbed(format!(
                    "{} pod of {release} on {node} still there {POD_TIMEOUT:?} after its label was removed",
                    kind.binary()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    fn driver_running(&self, node: &str, kind: DriverKind) -> bool {
        block(&self.handle, self.live_pod(node, kind))
            .ok()
            .flatten()
            .is_some_and(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some())
            })
    }

    /// A token bound to the driver's own pod, as the pod's projected token
    /// is (so it carries the node name the admission policy checks).
    fn driver_kubeconfig(&self, node: &str, kind: DriverKind) -> Result<PathBuf> {
        block(&self.handle, async {
            let pod = self
                .live_pod(node, kind)
                .await?
                .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
            let name = pod.metadata.name.clone().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let sa = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default();
            let request: TokenRequest = serde_json::from_value(json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {
                    "audiences": [],
                    "expirationSeconds": 3600,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
                },
            }))
            .map_err(json_err("token request"))?;
            let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), charts::NAMESPACE);
            let issued: TokenRequest = sas
                .create_subresource("token", &sa, &PostParams::default(), &request)
                .await
                .map_err(kube_err(format!("requesting a token for {sa}")))?;
            let token = issued
                .status
                .map(|s| s.token)
                .ok_or_else(|| Error::Testbed(format!("token request for {sa} has no status")))?;
            self.host.kubeconfig_for_token(
                &format!("{}-{node}-pod", kind.binary()),
                &format!("system:serviceaccount:{}:{sa}", charts::NAMESPACE),
                &token,
            )
        })
    }

    /// Through the API server's pod proxy, as a scraper without node access would.
    async fn driver_metrics(&self, node: &str, kind: DriverKind) -> Result<String> {
        let unit = self.unit(node, kind)?;
        let pod = self
            .live_pod(node, kind)
            .await?
            .ok_or_else(|| Error::Testbed(format!("no {} pod on {node}", kind.binary())))?;
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}:{}/proxy/metrics",
            charts::NAMESPACE,
            pod.metadata.name.unwrap_or_default(),
            unit.metrics_port
        );
        let req = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|e| Error::Testbed(format!("building {path}: {e}")))?;
        self.client
            .request_text(req)
            .await
            .map_err(kube_err(format!("GET {path}")))
    }

    fn driver_rss_kib(&self, node: &str, kind: DriverKind) -> Option<u64> {
        let pod = block(&self.handle, self.live_pod(node, kind)).ok()??;
        let id = container_id(&pod)?;
        let node_name = self.layout(node).ok()?.node_name;
        self.host.container_rss_kib(&node_name, &id)
    }

    fn fixture_sysfs(&self, node: &str) -> Result<PathBuf> {
        Ok(self.layout(node)?.host_sysfs)
    }

    fn node_dir_files(&self, node: &str, dir: NodeDir) -> Result<Vec<String>> {
        let l = self.layout(node)?;
        let path = dir.of(Path::new(&l.paths.cdi_root));
        let mut names = self
            .host
            .list_dir(&l.node_name, &path.display().to_string())?;
        names.sort();
        Ok(names)
    }

    fn node_dir_file(&self, node: &str, dir: NodeDir, name: &str) -> Result<Option<Vec<u8>>> {
        let l = self.layout(node)?;
        let path = dir.of(Path::new(&l.paths.cdi_root)).join(name);
        self.host
            .read_file(&l.node_name, &path.display().to_string())
    }

    fn checkpoint(
        &self,
        node: &str,
        kind: DriverKind,
    ) -> Result<Option<dra_core::testing::Checkpoint>> {
        let l = self.layout(node)?;
        let path = format!(
            "{}/plugins/{}/checkpoint.json",
            l.paths.kubelet_root,
            kind.driver_name()
        );
        match self.host.read_file(&l.node_name, &path)? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Json {
                    what: format!("{path} on {}", l.node_name),
                    source,
                }),
            None => Ok(None),
        }
    }

    fn adapt_pod(&self, pod: &mut Value) {
        self.host.adapt_pod(pod);
    }

    fn logs_hint(&self) -> String {
        format!(
            "{}; driver pods: kubectl -n {} logs -l {POD_DRIVER_LABEL}=<binary>",
            self.host.logs_hint(),
            charts::NAMESPACE
        )
    }

    fn restarts_crashed_drivers(&self) -> bool {
        true
    }

    fn offers() -> &'static [TestbedOp] {
        &[TestbedOp::UpgradeDriverImage]
    }

    /// A new tag of the same image, `helm upgrade`d; see `upgrade.rs`.
    async fn upgrade_driver_image(&self, kind: DriverKind) -> Result<ImageUpgrade> {
        self.upgrade_image(kind, &[]).await
    }

    /// The same, with `--set key=value` for each of `set`.
    async fn upgrade_driver_with(
        &self,
        kind: DriverKind,
        set: &[(&str, &str)],
    ) -> Result<ImageUpgrade> {
        self.upgrade_image(kind, set).await
    }
}
