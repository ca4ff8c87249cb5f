//! Device taints on our devices, as an administrator sets them: a
//! `DeviceTaintRule` (GA in Kubernetes 1.37) takes one EFA out of service.
//!
//! This is what `docs/operations.md` tells operators to do for maintenance
//! (and what our own health taints will build on): the scheduler must stop
//! handing the tainted device to new claims, a claim that tolerates the
//! taint must still get it, and removing the rule must give it back. The
//! rule is cluster-scoped, so it is deleted whatever the outcome, before the
//! next scenario runs.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use serde_json::{Value, json};

use super::agreement;
use super::allocate::{GONE, RUNNING, stays_pending};
use super::kit::{self, attr_str};
use crate::manifests;
use crate::testbed::{DriverKind, Testbed};

const TAINT_KEY: &str = "e2e.aws-dra.dev/maintenance";

/// Scenario 14: a `DeviceTaintRule` with effect `NoSchedule` on one EFA of p5.
pub async fn device_taint_rule(tb: &impl Testbed, ns: &str) -> Result<()> {
    let devices = kit::devices(tb, "p5", DriverKind::Efa).await?;
    let (device, published) = devices
        .iter()
        .next()
        .ok_or_else(|| anyhow!("p5 publishes no EFA"))?;
    let bdf = attr_str(published, "resource.kubernetes.io/pciBusID")
        .ok_or_else(|| anyhow!("{device} has no pciBusID"))?;
    let rule = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": format!("{ns}-{device}")},
        "spec": {
            "deviceSelector": {
                "driver": DriverKind::Efa.driver_name(),
                "pool": kit::node_name(tb, "p5"),
                "device": device,
            },
            "taint": {"key": TAINT_KEY, "value": ns, "effect": "NoSchedule"},
        },
    });
    manifests::apply(&tb.client(), &rule, None)
        .await
        .context("creating the DeviceTaintRule")?;
    let result = with_rule(tb, ns, device, &bdf, &rule).await;
    let removed = manifests::delete(&tb.client(), &rule, None).await;
    result?;
    removed.context("deleting the DeviceTaintRule")?;
    Ok(())
}

/// A template for exactly the EFA at `bdf`, tolerating the taint or not.
fn pinned_template(name: &str, bdf: &str, tolerate: bool) -> Value {
    let mut request = json!({
        "deviceClassName": DriverKind::Efa.driver_name(),
        "selectors": [{"cel": {"expression": format!(
            "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"{bdf}\""
        )}}],
    });
    if tolerate {
        request["tolerations"] =
            json!([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "efa", "exactly": request}]}}},
    })
}

async fn with_rule(
    tb: &impl Testbed,
    ns: &str,
    device: &str,
    bdf: &str,
    rule: &Value,
) -> Result<()> {
    kit::apply_all(
        tb,
        ns,
        &[
            pinned_template("untolerated", bdf, false),
            pinned_template("tolerating", bdf, true),
        ],
    )
    .await?;
    // The scheduler sees the rule through its informer; give it a moment so
    // that the pending pod below is not just racing the rule.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. Not tolerated: the only device that fits is tainted, so the pod stays Pending.
    let untolerated = kit::pod_with_claim(tb, "untolerated", Some("untolerated"), None, Some("p5"));
    kit::apply_all(tb, ns, &[untolerated]).await?;
    let (reason, message, explained) = stays_pending(tb, ns, "untolerated").await?;
    ensure!(
        reason == "Unschedulable",
        "a claim for the tainted {device} without a toleration: scheduler said {reason}: {message}"
    );
    let rule_name = rule["metadata"]["name"].as_str().unwrap_or_default();
    agreement::names_the_reason(
        "untolerated",
        &explained,
        &[
            &format!(
                "taint {TAINT_KEY}={ns}:NoSchedule (from DeviceTaintRule {rule_name}) is not tolerated"
            ),
            &format!("pciBusID == \"{bdf}\""),
        ],
    )?;

    // 2. Tolerated: the claim gets exactly the tainted device and the pod runs.
    let tolerating = kit::pod_with_claim(tb, "tolerating", Some("tolerating"), None, Some("p5"));
    kit::apply_all(tb, ns, &[tolerating]).await?;
    kit::running(tb, ns, "tolerating", RUNNING).await?;
    let devs = kit::pod_devices(tb, ns, "tolerating").await?;
    ensure!(
        devs.len() == 1 && devs[0].device == device,
        "a claim tolerating the taint on {device} got {devs:?}"
    );
    kit::delete_pods(tb, ns, &["tolerating"], GONE).await?;

    // 3. Rule gone: a claim without a toleration gets the device again. A
    // fresh pod, so that the check does not hang on when the scheduler
    // retries the waiting one.
    kit::delete_pods(tb, ns, &["untolerated"], GONE).await?;
    manifests::delete(&tb.client(), rule, None)
        .await
        .context("deleting the DeviceTaintRule")?;
    let after = kit::pod_with_claim(tb, "after-rule", Some("untolerated"), None, Some("p5"));
    kit::apply_all(tb, ns, &[after]).await?;
    kit::running(tb, ns, "after-rule", RUNNING)
        .await
        .context("a pod for the formerly tainted EFA after the rule was deleted")?;
    let devs = kit::pod_devices(tb, ns, "after-rule").await?;
    ensure!(
        devs.len() == 1 && devs[0].device == device,
        "after the rule was deleted the claim got {devs:?}, not {device}"
    );
    kit::delete_pods(tb, ns, &["after-rule"], GONE).await?;
    Ok(())
}
