//! Part (b) and (c) of `cargo xtask chaos`, on node `p5` (EFA and the test
//! GPU driver) with a pod holding a GPU+EFA claim throughout:
//! - the kubelet stopped for 10 s and started again: the drivers keep
//!   running, the pod keeps its container, and a new pod (GPU + EFA, so
//!   both drivers must be registered with the new kubelet) runs;
//! - a simulated reboot of the EFA driver's node state: the driver reads the
//!   boot id from `/proc/sys/kernel/random/boot_id` (no override), so the
//!   reboot is simulated by writing another boot id into its checkpoint
//!   while the kubelet and the driver are down; the driver must forget the
//!   claims and remove their CDI specs, and the pod's later deletion must
//!   not get stuck on the forgotten claim;
//! - kube-apiserver stopped for 60 s, started, then etcd restarted: no
//!   driver restarts, the pod keeps its container, each driver's slices
//!   (deleted right after the return) are back complete, and a new pod runs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::cycles::NAMESPACE;
use e2e::local::LocalTestbed;
use e2e::pools::wait_pool_complete;
use e2e::scenarios::kit;
use e2e::testbed::{DriverKind, Testbed};

const RUNNING: Duration = Duration::from_secs(180);
const DRIVERS: [(&str, DriverKind); 4] = [
    ("p5", DriverKind::Efa),
    ("p5", DriverKind::GpuTest),
    ("trn2", DriverKind::Efa),
    ("trn2", DriverKind::Neuron),
];

/// What the faults showed.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct FaultFigures {
    /// Kubelet start → new pod Running, ms.
    pub kubelet_new_pod_ms: Option<u64>,
    /// Drivers restarted while the kubelet was down (pid changed).
    pub kubelet_driver_restarts: Option<u64>,
    /// The held pod's container unchanged over the kubelet restart.
    pub kubelet_pod_unaffected: Option<bool>,
    /// The claim forgotten (checkpoint entry and CDI spec gone) within 10 s
    /// of the driver's start, before any kubelet call.
    pub reboot_forgotten_at_start: Option<bool>,
    /// Driver started (kubelet still down) → claim forgotten, ms.
    pub reboot_start_ms: Option<u64>,
    /// The held pod deleted → its claim forgotten, ms.
    pub reboot_forgotten_ms: Option<u64>,
    /// A new pod ran after the simulated reboot.
    pub reboot_new_pod_ok: Option<bool>,
    /// The pod of the forgotten claim deleted → gone, ms.
    pub reboot_delete_ms: Option<u64>,
    /// Driver restarts over the API server and etcd outage.
    pub outage_driver_restarts: Option<u64>,
    pub outage_pod_unaffected: Option<bool>,
    /// `(driver on node, ms)`: slices deleted after the return → pool complete.
    pub outage_slices_ms: Vec<(String, u64)>,
    /// Return → new pod Running, ms.
    pub outage_new_pod_ms: Option<u64>,
}

pub(super) fn opt_s(v: Option<u64>) -> String {
    v.map_or("not measured".into(), |ms| {
        format!("{:.1} s", ms as f64 / 1000.0)
    })
}

pub(super) fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("not measured".into(), |x| x.to_string())
}

impl FaultFigures {
    pub fn rows(&self) -> Vec<String> {
        vec![
            format!(
                "| kubelet (p5) restarted with a pod holding GPU+EFA: driver restarts | {} |",
                opt(self.kubelet_driver_restarts)
            ),
            format!(
                "| … held pod's container unchanged | {} |",
                opt(self.kubelet_pod_unaffected)
            ),
            format!(
                "| … kubelet start → new GPU+EFA pod Running | {} |",
                opt_s(self.kubelet_new_pod_ms)
            ),
            format!(
                "| simulated reboot (other boot id in the EFA checkpoint), kubelet down: driver start → claim forgotten, CDI spec removed | {} |",
                match (self.reboot_forgotten_at_start, self.reboot_start_ms) {
                    (Some(true), ms) => opt_s(ms),
                    (Some(false), _) => "not within 10 s".to_string(),
                    (None, _) => "not measured".to_string(),
                }
            ),
            format!(
                "| … kubelet back, pod of the old claim deleted → claim in neither checkpoint nor CDI | {} |",
                opt_s(self.reboot_forgotten_ms)
            ),
            format!(
                "| … pod of the forgotten claim deleted → gone | {} |",
                opt_s(self.reboot_delete_ms)
            ),
            format!(
                "| API server down 60 s, then etcd restarted: driver restarts | {} |",
                opt(self.outage_driver_restarts)
            ),
            format!(
                "| … held pod's container unchanged | {} |",
                opt(self.outage_pod_unaffected)
            ),
            format!(
                "| … slices deleted after the return → pool complete again | {} |",
                if self.outage_slices_ms.is_empty() {
                    "not measured".to_string()
                } else {
                    self.outage_slices_ms
                        .iter()
                        .map(|(d, ms)| format!("{d} {:.1} s", *ms as f64 / 1000.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            format!(
                "| … return → new pod Running | {} |",
                opt_s(self.outage_new_pod_ms)
            ),
        ]
    }
}

fn pids(tb: &LocalTestbed) -> BTreeMap<String, Option<i32>> {
    DRIVERS
        .iter()
        .map(|(n, k)| (format!("{n}/{}", k.binary()), tb.driver_pid(n, *k)))
        .collect()
}

fn restarts(before: &BTreeMap<String, Option<i32>>, tb: &LocalTestbed) -> u64 {
    let after = pids(tb);
    let running = DRIVERS
        .iter()
        .filter(|(n, k)| tb.driver_running(n, *k))
        .count();
    let changed = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .count();
    (changed + DRIVERS.len() - running) as u64
}

async fn container(tb: &LocalTestbed, pod: &str) -> Result<(String, i32)> {
    let p = kit::get_pod(tb, NAMESPACE, pod)
        .await?
        .ok_or_else(|| anyhow!("pod {pod} is gone"))?;
    let s = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .ok_or_else(|| anyhow!("pod {pod} has no container status"))?;
    Ok((s.container_id.unwrap_or_default(), s.restart_count))
}

async fn new_pod(tb: &LocalTestbed, name: &str) -> Result<Duration> {
    let t = Instant::now();
    let pod = kit::pod_with_claim(tb, name, Some("chaos-aligned"), None, Some("p5"));
    kit::apply_all(tb, NAMESPACE, &[pod]).await?;
    kit::running(tb, NAMESPACE, name, RUNNING).await?;
    Ok(t.elapsed())
}

async fn wait_ready(tb: &LocalTestbed) -> Result<()> {
    let client = tb.client();
    kit::wait_for(
        tb,
        "kube-apiserver /readyz",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let mut req = http::Request::new(Vec::new());
                *req.uri_mut() = http::Uri::from_static("/readyz");
                Ok(
                    matches!(client.request_text(req).await, Ok(b) if b.trim() == "ok")
                        .then_some(()),
                )
            }
        },
    )
    .await
}

/// Runs the three faults in order; figures are filled in as they come.
pub async fn run(tb: &LocalTestbed, f: &mut FaultFigures) -> Result<()> {
    kit::namespace(tb, NAMESPACE).await?;
    let held = "held";
    new_pod(tb, held).await.context("the held pod")?;
    kubelet_restart(tb, f, held)
        .await
        .context("kubelet restart")?;
    outage(tb, f, held)
        .await
        .context("API server and etcd outage")?;
    reboot(tb, f, held).await.context("simulated reboot")?;
    kit::delete_all_pods(tb, NAMESPACE, Duration::from_secs(120)).await?;
    Ok(())
}

async fn kubelet_restart(tb: &LocalTestbed, f: &mut FaultFigures, held: &str) -> Result<()> {
    let before = pids(tb);
    let held_before = container(tb, held).await?;
    let stopped = {
        let cluster = tb.cluster().await;
        cluster.stop_kubelet("p5", Duration::from_secs(10))?
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    let t = Instant::now();
    tb.cluster().await.start_kubelet(&stopped).await?;
    new_pod(tb, "after-kubelet").await?;
    f.kubelet_new_pod_ms = Some(t.elapsed().as_millis() as u64);
    f.kubelet_driver_restarts = Some(restarts(&before, tb));
    f.kubelet_pod_unaffected = Some(container(tb, held).await? == held_before);
    kit::delete_pods(tb, NAMESPACE, &["after-kubelet"], Duration::from_secs(120)).await
}

async fn outage(tb: &LocalTestbed, f: &mut FaultFigures, held: &str) -> Result<()> {
    let before = pids(tb);
    let held_before = container(tb, held).await?;
    let api = tb.cluster().await.stop_control_plane("kube-apiserver")?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    tb.cluster().await.start_control_plane(&api)?;
    wait_ready(tb).await?;
    let etcd = tb.cluster().await.stop_control_plane("etcd")?;
    tb.cluster().await.start_control_plane(&etcd)?;
    wait_ready(tb).await?;
    let back = Instant::now();
    let slices: Api<ResourceSlice> = Api::all(tb.client());
    let nodes = tb.nodes();
    // Every driver's slices deleted at once, then every pool timed from
    // that moment side by side (one after the other, a slow first driver
    // would hide how fast the others were).
    for (node, kind) in DRIVERS {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={node},spec.driver={}",
            kind.driver_name()
        ));
        for s in slices.list(&lp).await?.items {
            if let Some(name) = s.metadata.name {
                let _ = slices.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
    let deleted = Instant::now();
    let client = tb.client();
    let waits = DRIVERS.iter().map(|&(node, kind)| {
        let expected = nodes
            .iter()
            .find(|n| n.name == node)
            .map_or(0, |n| kind.expected_devices(&n.fixture));
        let client = client.clone();
        async move {
            let complete = wait_pool_complete(
                &client,
                node,
                kind,
                expected,
                Duration::from_secs(60),
                || Ok(()),
            )
            .await?;
            ensure!(
                complete,
                "{} on {node}: pool not complete 60 s after its slices were deleted",
                kind.binary()
            );
            Ok::<_, anyhow::Error>((
                format!("{node}/{}", kind.binary()),
                deleted.elapsed().as_millis() as u64,
            ))
        }
    });
    for done in futures::future::join_all(waits).await {
        f.outage_slices_ms.push(done?);
    }
    f.outage_driver_restarts = Some(restarts(&before, tb));
    f.outage_pod_unaffected = Some(container(tb, held).await? == held_before);
    new_pod(tb, "after-outage").await?;
    f.outage_new_pod_ms = Some(back.elapsed().as_millis() as u64);
    kit::delete_pods(tb, NAMESPACE, &["after-outage"], Duration::from_secs(120)).await
}

async fn reboot(tb: &LocalTestbed, f: &mut FaultFigures, held: &str) -> Result<()> {
    let claim = kit::pod_claims(tb, NAMESPACE, held)
        .await?
        .pop()
        .and_then(|c| c.metadata.uid)
        .ok_or_else(|| anyhow!("{held} has no claim"))?;
    let plugins = tb
        .local_node("p5")
        .await
        .ok_or_else(|| anyhow!("no node p5"))?
        .plugins_dir;
    let path = plugins
        .join(DriverKind::Efa.driver_name())
        .join("checkpoint.json");
    let stopped = tb
        .cluster()
        .await
        .stop_kubelet("p5", Duration::from_secs(10))?;
    tb.kill_driver("p5", DriverKind::Efa)?;
    kit::wait_for(
        tb,
        "efa-driver on p5 dead",
        Duration::from_secs(10),
        || async { Ok((!tb.driver_running("p5", DriverKind::Efa)).then_some(())) },
    )
    .await?;
    // Typed, so the boot id lands in the field the driver reads (an
    // untyped edit once wrote `boot_id` beside the real `bootId`, and the
    // "reboot" was no reboot at all).
    let mut cp: dra_core::testing::Checkpoint = serde_json::from_slice(&std::fs::read(&path)?)
        .with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        cp.claims.contains_key(&claim),
        "the held claim {claim} is not in {}",
        path.display()
    );
    cp.boot_id = "chaos-simulated-earlier-boot".into();
    std::fs::write(&path, serde_json::to_vec(&cp)?)?;
    tb.start_driver("p5", DriverKind::Efa).await?;
    let forgotten = || -> Result<bool> {
        let in_cp = tb
            .checkpoint("p5", DriverKind::Efa)?
            .is_some_and(|c| c.claims.contains_key(&claim));
        // Only the EFA driver's spec: the claim also holds a GPU, whose
        // driver keeps its spec until the kubelet unprepares the claim.
        let efa_spec = format!("k8s.{}-", DriverKind::Efa.driver_name());
        let cdi = tb
            .cdi_spec_files("p5")?
            .iter()
            .any(|s| s.starts_with(&efa_spec) && s.contains(&claim));
        Ok(!in_cp && !cdi)
    };
    // The driver reads its checkpoint (and compares the boot id) at start,
    // before the kubelet is back: the start alone must clean up.
    let t = Instant::now();
    let at_start = kit::wait_for(
        tb,
        "the held claim forgotten at the driver's start",
        Duration::from_secs(10),
        || async { Ok(forgotten()?.then_some(())) },
    )
    .await;
    f.reboot_forgotten_at_start = Some(at_start.is_ok());
    if at_start.is_ok() {
        f.reboot_start_ms = Some(t.elapsed().as_millis() as u64);
    }
    tb.cluster().await.start_kubelet(&stopped).await?;
    let t = Instant::now();
    kit::delete_pods(tb, NAMESPACE, &[held], Duration::from_secs(120)).await?;
    f.reboot_delete_ms = Some(t.elapsed().as_millis() as u64);
    kit::wait_for(
        tb,
        "the held claim forgotten",
        Duration::from_secs(60),
        || async { Ok(forgotten()?.then_some(())) },
    )
    .await?;
    f.reboot_forgotten_ms = Some(t.elapsed().as_millis() as u64);
    new_pod(tb, "after-reboot").await?;
    f.reboot_new_pod_ok = Some(true);
    Ok(())
}
