//! [`Testbed::upgrade_driver_image`](crate::testbed::Testbed::upgrade_driver_image)
//! on [`ChartTestbed`]: `helm upgrade` of a driver's releases to a new image,
//! then a wait for the DaemonSets' rolling update to finish.
//!
//! What changes: the image *tag* (and, through
//! [`Testbed::upgrade_driver_with`](crate::testbed::Testbed::upgrade_driver_with),
//! the chart values it is given). The new tag names the same image (the
//! same driver binaries), added to every node's containerd with
//! [`ChartHost::tag_image`], so no registry is needed; the pod template's
//! image reference changes, so the DaemonSet controller rolls every pod as
//! it would for a new release. That exercises what an upgrade relies on (a
//! new pod beside the old one with its own sockets, the readiness gate, the
//! old pod's graceful stop, the new pod taking over the checkpoint), not a
//! change of checkpoint or CDI format between driver versions.
//!
//! With host networking (the local cluster, no CNI) the old and new pod of a
//! node share one network namespace: the surge pod could neither bind the
//! old pod's metrics port nor be scheduled next to it (a host-network pod's
//! container ports are host ports). The upgrade therefore also moves such a
//! release to a fresh metrics port; on a pod network the port stays.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::charts::{self, Chart};
use crate::host_env::free_port;
use crate::testbed::{DriverKind, ImageUpgrade};
use local_cluster::error::{Error, Result};

use super::host::ChartHost;
use super::{ChartTestbed, Unit, kube_err, pod_ready, pod_stuck};

/// How long a release may take to roll out (measured: seconds per node).
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(240);

fn pod_image(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.containers.first()?.image.as_deref()
}

/// `name (phase, ready, image)` of each pod, for error messages.
fn pods_summary(pods: &[Pod]) -> String {
    let lines: Vec<String> = pods
        .iter()
        .map(|p| {
            format!(
                "{} ({}{}, ready {}, image {})",
                p.metadata.name.as_deref().unwrap_or("?"),
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("?"),
                if p.metadata.deletion_timestamp.is_some() {
                    ", terminating"
                } else {
                    ""
                },
                pod_ready(p),
                pod_image(p).unwrap_or("?")
            )
        })
        .collect();
    if lines.is_empty() {
        "no pods".into()
    } else {
        lines.join("; ")
    }
}

impl<H: ChartHost> ChartTestbed<H> {
    pub(super) async fn upgrade_image(
        &self,
        kind: DriverKind,
        set: &[(&str, &str)],
    ) -> Result<ImageUpgrade> {
        let chart = kind.chart().ok_or_else(|| {
            Error::Testbed(format!(
                "{} is not installed from a chart: nothing to upgrade",
                kind.binary()
            ))
        })?;
        let n = self.upgrades.fetch_add(1, Ordering::SeqCst) + 1;
        let repository = self.deployment.image_repository.clone();
        let tag = format!("{}-upgrade-{n}", self.deployment.image_tag);
        let from = format!("{repository}:{}", self.deployment.image_tag);
        let image = format!("{repository}:{tag}");
        let nodes: Vec<(String, String)> = Self::lock(&self.nodes)?
            .iter()
            .map(|n| (n.info.name.clone(), n.layout.node_name.clone()))
            .collect();
        for (_, node_name) in &nodes {
            self.host.tag_image(node_name, &from, &image)?;
        }
        let units: Vec<Unit> = Self::lock(&self.units)?
            .iter()
            .filter(|u| u.kind == kind)
            .cloned()
            .collect();

        let started = Instant::now();
        for unit in &units {
            let port = if self.deployment.unique_metrics_ports {
                Some(free_port()?)
            } else {
                None
            };
            self.helm_upgrade_image(chart, &unit.release, &tag, port, set)?;
            if let Some(port) = port {
                for u in Self::lock(&self.units)?
                    .iter_mut()
                    .filter(|u| u.release == unit.release)
                {
                    u.metrics_port = port;
                }
            }
        }
        let mut rolled = Vec::new();
        for unit in &units {
            for (role, node_name) in &nodes {
                let serves = unit.node.as_ref().is_none_or(|n| n == node_name)
                    && self.node_info(role)?.drivers.contains(&kind)
                    && self.run_label_set(role, kind).await?;
                if serves {
                    self.wait_rolled_out(role, kind, &image, started).await?;
                    rolled.push((role.clone(), started.elapsed()));
                }
            }
            self.wait_daemonset_done(&unit.release, started).await?;
        }
        let rollout = started.elapsed();
        tracing::info!(
            driver = kind.binary(),
            image,
            rollout_ms = rollout.as_millis() as u64,
            "upgraded"
        );
        Ok(ImageUpgrade {
            image,
            releases: units.into_iter().map(|u| u.release).collect(),
            nodes: rolled,
            rollout,
        })
    }

    /// `helm upgrade --reuse-values` with the new tag (and metrics port, and
    /// the values of `set`).
    fn helm_upgrade_image(
        &self,
        chart: Chart,
        release: &str,
        tag: &str,
        metrics_port: Option<u16>,
        set: &[(&str, &str)],
    ) -> Result<()> {
        let mut sets = vec![format!("image.tag={tag}")];
        sets.extend(metrics_port.map(|p| format!("metrics.port={p}")));
        sets.extend(set.iter().map(|(k, v)| format!("{k}={v}")));
        let mut extra = vec!["--reuse-values"];
        for s in &sets {
            extra.extend(["--set", s.as_str()]);
        }
        self.helm_upgrade(chart, release, &extra)
    }

    /// Waits until the driver's only pod on `node` runs `image` and is Ready
    /// (the old pod gone, not merely terminating).
    async fn wait_rolled_out(
        &self,
        node: &str,
        kind: DriverKind,
        image: &str,
        started: Instant,
    ) -> Result<()> {
        loop {
            let pods = self.pods(node, kind).await?;
            if let [p] = pods.as_slice()
                && pod_image(p) == Some(image)
                && pod_ready(p)
            {
                return Ok(());
            }
            if let Some(p) = pods.iter().find(|p| pod_image(p) == Some(image))
                && let Some(why) = pod_stuck(p)
            {
                return Err(Error::Testbed(format!(
                    "upgrading {} on {node} to {image}: the new pod cannot start: {why}\n{}",
                    kind.binary(),
                    self.pod_log_tail(p).await
                )));
            }
            if started.elapsed() > ROLLOUT_TIMEOUT {
                return Err(Error::Testbed(format!(
                    "upgrading {} on {node} to {image}: not rolled out after {ROLLOUT_TIMEOUT:?} \
                     (want one Ready pod with the new image, the old one gone): {}; {}",
                    kind.binary(),
                    pods_summary(&pods),
                    self.host.logs_hint()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the DaemonSet controller also reports the rollout done:
    /// its status is of the current generation and every scheduled pod is
    /// updated and available.
    async fn wait_daemonset_done(&self, name: &str, started: Instant) -> Result<()> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), charts::NAMESPACE);
        loop {
            let ds = api
                .get(name)
                .await
                .map_err(kube_err(format!("reading DaemonSet {name}")))?;
            let generation = ds.metadata.generation.unwrap_or(0);
            let st = ds.status.clone().unwrap_or_default();
            let desired = st.desired_number_scheduled;
            if st.observed_generation.unwrap_or(0) >= generation
                && st.updated_number_scheduled.unwrap_or(0) == desired
                && st.number_available.unwrap_or(0) == desired
                && st.number_ready == desired
            {
                return Ok(());
            }
            if started.elapsed() > ROLLOUT_TIMEOUT {
                return Err(Error::Testbed(format!(
                    "DaemonSet {}/{name} not rolled out after {ROLLOUT_TIMEOUT:?}: generation \
                     {generation}, status {st:?}",
                    charts::NAMESPACE
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
