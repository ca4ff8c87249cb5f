//! Part of scenario 11: what the Neuron driver's credentials may do to Node
//! objects. RBAC grants it `patch` on every Node (it writes its own
//! UltraServer labels); the chart's Node admission policy narrows that to
//! its own Node and to the `neuron.amazonaws.com/ultraserver-*` labels.
//! Each forbidden change is tried once, as a dry-run patch with the driver's
//! node-bound token, so that admission runs on the real API server and
//! nothing is stored.

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::kit;
use crate::testbed::{DriverKind, Testbed};

/// The labels the Neuron driver owns on its Node.
const PREFIX: &str = "neuron.amazonaws.com/ultraserver-";
/// The policy's refusal of a change to another Node (its name follows).
const OTHER_NODE: &str = "may not modify Node";
/// The policy's refusal of a label outside [`PREFIX`].
const LABELS: &str = "may only change the neuron.amazonaws.com/ultraserver-* labels of its Node";
/// The policy's refusal of any other change of the Node.
const REST: &str = "may change nothing of a Node but its neuron.amazonaws.com/ultraserver-* labels";

fn dry() -> PatchParams {
    PatchParams {
        dry_run: true,
        ..Default::default()
    }
}

/// `result` is a refusal whose message contains `want` (the API server
/// answers a policy's denial with 422, RBAC's with 403).
fn refused(result: Result<Node, kube::Error>, want: &str, what: &str) -> Result<()> {
    match result {
        Ok(_) => bail!("the trn2 Neuron driver's token: {what} was allowed (dry run)"),
        Err(kube::Error::Api(e)) => {
            ensure!(
                (e.code == 403 || e.code == 422) && e.message.contains(want),
                "the trn2 Neuron driver's token: {what}: expected a denial (403/422) containing {want:?}, got {} {}",
                e.code,
                e.message
            );
            Ok(())
        }
        Err(e) => bail!("the trn2 Neuron driver's token: {what}: {e}"),
    }
}

/// As the Neuron driver on trn2: changing an UltraServer label of its own
/// Node is allowed; another label (added or removed), an annotation, an
/// owner reference, a finalizer, the spec (unschedulable, a taint), the
/// status, and any change of another Node are each refused.
pub async fn neuron_driver_node(tb: &impl Testbed) -> Result<()> {
    let kubeconfig = tb.driver_kubeconfig("trn2", DriverKind::Neuron)?;
    let as_driver: Api<Node> = Api::all(crate::client_from_kubeconfig(&kubeconfig).await?);
    let own = kit::node_name(tb, "trn2");
    let other = kit::node_name(tb, "p5");
    let node = Api::<Node>::all(tb.client())
        .get(&own)
        .await
        .with_context(|| format!("reading Node {own}"))?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let patch = |p: Value| Patch::Merge(p);

    // Allowed: an UltraServer label, changed where the driver set one,
    // else added.
    let (key, value) = labels
        .iter()
        .find(|(k, _)| k.starts_with(PREFIX))
        .map_or_else(
            || (format!("{PREFIX}e2e-probe"), "1".to_owned()),
            |(k, v)| (k.clone(), format!("{v}-e2e")),
        );
    as_driver
        .patch(&own, &dry(), &patch(json!({"metadata": {"labels": {&key: value}}})))
        .await
        .with_context(|| {
            format!("the trn2 Neuron driver changing label {key} of its own Node {own} (dry run) must be allowed")
        })?;

    // Another Node, even its UltraServer labels.
    refused(
        as_driver
            .patch(
                &other,
                &dry(),
                &patch(json!({"metadata": {"labels": {&key: "1"}}})),
            )
            .await,
        &format!("{OTHER_NODE} '{other}'"),
        &format!("labelling Node {other}"),
    )?;

    // Its own Node, anything but those labels.
    let default_ns = Api::<Namespace>::all(tb.client())
        .get("default")
        .await
        .context("reading namespace default")?;
    let owner = json!({
        "apiVersion": "v1", "kind": "Namespace", "name": "default",
        "uid": default_ns.metadata.uid.ok_or_else(|| anyhow!("namespace default without uid"))?,
    });
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .map(|t| serde_json::to_value(t).unwrap_or_default())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    taints.push(json!({"key": "e2e.aws-dra.dev/forged", "effect": "NoSchedule"}));
    let (some_label, _) = labels
        .iter()
        .find(|(k, _)| !k.starts_with(PREFIX))
        .ok_or_else(|| anyhow!("Node {own} has no label outside {PREFIX}"))?;
    let forbidden: [(&str, &str, Value); 7] = [
        (
            "adding a label outside the driver's prefix",
            LABELS,
            json!({"metadata": {"labels": {"e2e.aws-dra.dev/forged": "yes"}}}),
        ),
        (
            "removing a label outside the driver's prefix",
            LABELS,
            json!({"metadata": {"labels": {some_label: null}}}),
        ),
        (
            "adding an annotation",
            REST,
            json!({"metadata": {"annotations": {"e2e.aws-dra.dev/forged": "yes"}}}),
        ),
        (
            "adding an owner reference (the garbage collector would act on it)",
            REST,
            json!({"metadata": {"ownerReferences": [owner]}}),
        ),
        (
            "adding a finalizer",
            REST,
            json!({"metadata": {"finalizers": ["e2e.aws-dra.dev/forged"]}}),
        ),
        (
            "cordoning the Node (spec.unschedulable)",
            REST,
            json!({"spec": {"unschedulable": true}}),
        ),
        ("adding a taint", REST, json!({"spec": {"taints": taints}})),
    ];
    for (what, want, p) in forbidden {
        refused(
            as_driver.patch(&own, &dry(), &patch(p)).await,
            want,
            &format!("{what} on its own Node {own}"),
        )?;
    }

    // The status: RBAC grants no nodes/status (the policy would refuse it
    // too).
    let status = as_driver
        .patch_status(
            &own,
            &dry(),
            &patch(json!({"metadata": {"labels": {"e2e.aws-dra.dev/forged": "yes"}}})),
        )
        .await;
    match status {
        Ok(_) => bail!(
            "the trn2 Neuron driver's token: a write of Node {own}'s status was allowed (dry run)"
        ),
        Err(kube::Error::Api(e)) => ensure!(
            (e.code == 403 && e.message.contains("nodes/status"))
                || (e.code == 422 && e.message.contains("may not write a Node's status")),
            "the trn2 Neuron driver's token: a write of Node {own}'s status: expected RBAC's 403 or the policy's 422, got {} {}",
            e.code,
            e.message
        ),
        Err(e) => bail!("the trn2 Neuron driver's token: a write of Node {own}'s status: {e}"),
    }
    Ok(())
}
