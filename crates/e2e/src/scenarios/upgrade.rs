//! Scenario 24: `helm upgrade` of the drivers to a new image while pods
//! hold claims. The charts promise a seamless upgrade: the new
//! driver pod starts beside the old one with its own sockets, the old one
//! goes only once the new one is Ready, and the checkpoint carries the
//! prepared claims over. A pod that holds devices must not notice, and
//! what it holds must still be released through the new driver.
//!
//! Ten pods hold claims (single EFAs on p5 and trn2, single Neuron chips on
//! trn2); every release of both charts is upgraded
//! ([`Testbed::upgrade_driver_image`]) while the pods are watched; then new
//! pods prepare through the new drivers, and deleting the ten unprepares
//! their claims through them. Only testbeds that install the charts can do
//! this ([`crate::testbed::TestbedOp::UpgradeDriverImage`]): elsewhere the harness reports
//! the scenario as skipped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use super::allocate::{GONE, RUNNING};
use super::kit;
use super::lifecycle::{prepared, uid, wait_unprepared};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, ImageUpgrade, Testbed};

/// `(pod, node, driver)` of the pods that hold claims through the upgrade.
const HELD: [(&str, &str, DriverKind); 10] = [
    ("held-efa-p5-1", "p5", DriverKind::Efa),
    ("held-efa-p5-2", "p5", DriverKind::Efa),
    ("held-efa-p5-3", "p5", DriverKind::Efa),
    ("held-efa-p5-4", "p5", DriverKind::Efa),
    ("held-efa-p5-5", "p5", DriverKind::Efa),
    ("held-efa-trn2-1", "trn2", DriverKind::Efa),
    ("held-efa-trn2-2", "trn2", DriverKind::Efa),
    ("held-neuron-trn2-1", "trn2", DriverKind::Neuron),
    ("held-neuron-trn2-2", "trn2", DriverKind::Neuron),
    ("held-neuron-trn2-3", "trn2", DriverKind::Neuron),
];

/// Pods created once the upgrade is done: they prepare through the new pods.
const AFTER: [(&str, &str, DriverKind); 2] = [
    ("after-efa-p5", "p5", DriverKind::Efa),
    ("after-neuron-trn2", "trn2", DriverKind::Neuron),
];

/// A generous bound on the whole upgrade (both charts, every node); the
/// time is printed, not asserted beyond this.
const UPGRADE_BOUND: Duration = Duration::from_secs(300);

const EFA_TEMPLATE: &str = "single-efa";
const CHIP_TEMPLATE: &str = "one-neuron-chip";

fn template(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Neuron => CHIP_TEMPLATE,
        _ => EFA_TEMPLATE,
    }
}

/// One whole Neuron chip (not a NeuronCore, where cores are published too).
fn chip_template() -> Value {
    let driver = DriverKind::Neuron.driver_name();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": CHIP_TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [{"name": "chip", "exactly": {
            "deviceClassName": driver,
            "selectors": [{"cel": {"expression":
                format!("device.attributes[\"{driver}\"].resourceType == \"neuron_device\"")}}],
        }}]}}},
    })
}

/// What a held pod must keep: its node, driver, claim and container.
#[derive(Debug, Clone)]
struct Held {
    node: &'static str,
    kind: DriverKind,
    claim_uid: String,
    container: (String, i32),
}

/// Every held pod is still Running in the same container, never restarted.
async fn check_held(tb: &impl Testbed, ns: &str, held: &BTreeMap<&str, Held>) -> Result<()> {
    for (name, h) in held {
        let p = kit::get_pod(tb, ns, name)
            .await?
            .ok_or_else(|| anyhow!("pod {ns}/{name} is gone"))?;
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        ensure!(phase == "Running", "pod {name} is {phase}, not Running");
        let now = kit::first_container(&p);
        ensure!(
            now.as_ref() == Some(&h.container),
            "pod {name}: container (id, restarts) was {:?}, is now {now:?}",
            h.container
        );
    }
    Ok(())
}

/// [`check_held`] every 500 ms until `done`; returns how many checks passed.
async fn watch_held(
    tb: &impl Testbed,
    ns: &str,
    held: &BTreeMap<&str, Held>,
    done: &AtomicBool,
) -> Result<u32> {
    let mut checks = 0;
    loop {
        let last = done.load(Ordering::SeqCst);
        check_held(tb, ns, held)
            .await
            .with_context(|| format!("during the upgrade, after {checks} good checks"))?;
        checks += 1;
        if last {
            return Ok(checks);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Warning events of the namespace as `object: reason: message`; fails on
/// any about preparing or unpreparing devices (kubelet's
/// `FailedPrepareDynamicResources` and the like).
async fn no_prepare_warnings(tb: &impl Testbed, ns: &str) -> Result<()> {
    let api: Api<Event> = Api::namespaced(tb.client(), ns);
    let warnings: Vec<String> = api
        .list(&ListParams::default().fields("type=Warning"))
        .await?
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{}: {}: {}",
                e.involved_object.name.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect();
    let bad: Vec<&String> = warnings
        .iter()
        .filter(|w| {
            let w = w.to_lowercase();
            w.contains("prepare") || w.contains("dynamicresource")
        })
        .collect();
    ensure!(
        bad.is_empty(),
        "warning events about devices: {bad:?}; {}",
        tb.logs_hint()
    );
    if !warnings.is_empty() {
        println!("    other warning events (not about devices): {warnings:?}");
    }
    Ok(())
}

/// A counter of the driver's `/metrics` (0 when it has no such sample yet).
async fn claims_total(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
    labels: &str,
) -> Result<f64> {
    let metrics = tb.driver_metrics(node, kind).await?;
    Ok(kit::gauge(&metrics, "aws_dra_plugin_claims_total", labels).unwrap_or(0.0))
}

fn print_upgrade(u: &ImageUpgrade, kind: DriverKind) {
    let nodes: Vec<String> = u
        .nodes
        .iter()
        .map(|(n, d)| format!("{n} {:.1} s", d.as_secs_f64()))
        .collect();
    println!(
        "    {} upgraded to {} ({}): rollout {:.1} s (node done after: {})",
        kind.binary(),
        u.image,
        u.releases.join(", "),
        u.rollout.as_secs_f64(),
        nodes.join(", ")
    );
}

pub async fn upgrade_while_held(tb: &impl Testbed, ns: &str) -> Result<()> {
    let efa: Vec<Value> = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), None)?
        .into_iter()
        .filter(|o| o["kind"] == "ResourceClaimTemplate")
        .collect();
    kit::apply_all(tb, ns, &efa).await?;
    kit::apply_all(tb, ns, &[chip_template()]).await?;
    let pod = |name: &str, node: &str, kind: DriverKind| {
        kit::pod_with_claim(tb, name, Some(template(kind)), None, Some(node))
    };
    let pods: Vec<Value> = HELD.iter().map(|(n, node, k)| pod(n, node, *k)).collect();
    kit::apply_all(tb, ns, &pods).await?;

    let mut held = BTreeMap::new();
    for (name, node, kind) in HELD {
        let p = kit::running(tb, ns, name, RUNNING).await?;
        let container =
            kit::first_container(&p).ok_or_else(|| anyhow!("{name} has no container"))?;
        ensure!(container.1 == 0, "{name} restarted before the upgrade");
        let claim = kit::pod_claims(tb, ns, name)
            .await?
            .pop()
            .ok_or_else(|| anyhow!("{name} has no claim"))?;
        let claim_uid = uid(&claim);
        ensure!(
            prepared(tb, node, kind, &claim_uid)? == (true, true),
            "claim of {name} not in {node}'s checkpoint and CDI dir before the upgrade"
        );
        held.insert(
            name,
            Held {
                node,
                kind,
                claim_uid,
                container,
            },
        );
    }

    // Both charts, one after the other, while the pods are watched.
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (upgraded, watched) = tokio::join!(
        async {
            let mut out = Vec::new();
            for kind in [DriverKind::Efa, DriverKind::Neuron] {
                let u = tb.upgrade_driver_image(kind).await;
                out.push((kind, u));
                if out.last().is_some_and(|(_, u)| u.is_err()) {
                    break;
                }
            }
            done.store(true, Ordering::SeqCst);
            out
        },
        watch_held(tb, ns, &held, &done),
    );
    let total = started.elapsed();
    for (kind, u) in upgraded {
        let u = u.with_context(|| format!("upgrading {}", kind.binary()))?;
        print_upgrade(&u, kind);
    }
    let checks = watched?;
    println!(
        "    both charts upgraded in {:.1} s; the 10 held pods checked {checks} times meanwhile",
        total.as_secs_f64()
    );
    ensure!(
        total < UPGRADE_BOUND,
        "the upgrade took {total:?}, over {UPGRADE_BOUND:?}"
    );
    check_held(tb, ns, &held)
        .await
        .context("after the upgrade")?;
    for h in held.values() {
        ensure!(
            prepared(tb, h.node, h.kind, &h.claim_uid)? == (true, true),
            "claim {} lost its checkpoint entry or CDI spec on {} in the upgrade",
            h.claim_uid,
            h.node
        );
    }
    no_prepare_warnings(tb, ns).await?;

    // New claims are prepared by the new pods.
    let after: Vec<Value> = AFTER.iter().map(|(n, node, k)| pod(n, node, *k)).collect();
    kit::apply_all(tb, ns, &after).await?;
    let mut after_claims = Vec::new();
    for (name, node, kind) in AFTER {
        kit::running(tb, ns, name, RUNNING)
            .await
            .with_context(|| format!("new pod {name} after the upgrade"))?;
        let claim = kit::pod_claims(tb, ns, name)
            .await?
            .pop()
            .ok_or_else(|| anyhow!("{name} has no claim"))?;
        after_claims.push((node, kind, uid(&claim)));
        let ok = claims_total(tb, node, kind, "operation=\"prepare\",result=\"success\"").await?;
        ensure!(
            ok >= 1.0,
            "{} on {node} (new pod) counts {ok} successful prepares after {name} ran",
            kind.binary()
        );
    }

    // Deleting the held pods unprepares their claims through the new pods.
    let names: Vec<&str> = HELD.iter().map(|h| h.0).collect();
    kit::delete_pods(tb, ns, &names, GONE).await?;
    for h in held.values() {
        wait_unprepared(tb, h.node, h.kind, &h.claim_uid).await?;
    }
    let mut per_driver: BTreeMap<(&str, DriverKind), usize> = BTreeMap::new();
    for h in held.values() {
        *per_driver.entry((h.node, h.kind)).or_default() += 1;
    }
    for ((node, kind), n) in per_driver {
        let ok = claims_total(tb, node, kind, "operation=\"unprepare\",result=\"success\"").await?;
        let failed =
            claims_total(tb, node, kind, "operation=\"unprepare\",result=\"error\"").await?;
        if ok < n as f64 || failed > 0.0 {
            bail!(
                "{} on {node} (new pod): {ok} unprepares succeeded and {failed} failed; \
                 {n} held claims were released there",
                kind.binary()
            );
        }
        println!(
            "    {} on {node}: the new pod unprepared {ok} claims, 0 failed",
            kind.binary()
        );
    }
    no_prepare_warnings(tb, ns).await?;

    let names: Vec<&str> = AFTER.iter().map(|a| a.0).collect();
    kit::delete_pods(tb, ns, &names, GONE).await?;
    for (node, kind, claim_uid) in &after_claims {
        wait_unprepared(tb, node, *kind, claim_uid).await?;
    }
    Ok(())
}
