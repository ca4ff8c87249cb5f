//! s19: the steps of `docs/migration.md`, run on the trn2 node.
//!
//! The node starts as a device-plugin node: the Neuron driver is not
//! running and the node advertises `aws.amazon.com/neuroncore` in its
//! status, as the kubelet does for a registered device plugin (the
//! stand-in: no process serves the devices, which is all the scheduler,
//! the kubelet and our guard look at). A workload pod asking for
//! `aws.amazon.com/neuroncore: 2` runs there without any claim. Then:
//! 1. the driver refuses to start beside the device plugin (the guard);
//! 2. the device plugin is removed: its pods drained, its resource at 0
//!    (what the kubelet leaves when a device plugin goes away);
//! 3. the driver starts and publishes the node's chips and cores;
//! 4. the same pod, unchanged, runs again, now on DRA (an implicit claim
//!    for two NeuronCores, the runtime told exactly those);
//! 5. the node's allocatable still shows no device-plugin resource while
//!    DRA serves it, so a driver restart passes the guard.

use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};

use super::registration::{REGISTRATION_WAIT, registered_on};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::allocate::{GONE, RUNNING, node};
use super::kit;
use super::partitions::{check_cores_pod, extended_resource_pod, implicit_claim_devices};
use crate::testbed::{DriverKind, Testbed};

const RESOURCE: &str = "aws.amazon.com/neuroncore";
/// How long a started driver has to publish before it counts as refused: a
/// driver that starts publishes its pool within about 3.5 s of its start,
/// its container's start included (the charts testbed's start → slices
/// figures), so 15 s leaves it four times that.
const REFUSAL_WINDOW: Duration = Duration::from_secs(15);

/// Sets the device plugin's resource in the node's capacity and
/// allocatable (`None`: 0, as the kubelet leaves it).
async fn advertise(tb: &impl Testbed, node_name: &str, count: Option<u32>) -> Result<()> {
    let nodes: Api<Node> = Api::all(tb.client());
    let value = count.unwrap_or(0).to_string();
    let patch = json!({"status": {
        "capacity": {RESOURCE: value},
        "allocatable": {RESOURCE: value},
    }});
    nodes
        .patch_status(node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn allocatable(tb: &impl Testbed, node_name: &str) -> Result<Option<String>> {
    let nodes: Api<Node> = Api::all(tb.client());
    let node = nodes.get(node_name).await?;
    Ok(node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get(RESOURCE).map(|q| q.0.clone())))
}

async fn neuron_slices(tb: &impl Testbed, node_name: &str) -> Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(tb.client());
    let lp = ListParams::default().fields(&format!(
        "spec.nodeName={node_name},spec.driver={}",
        DriverKind::Neuron.driver_name()
    ));
    Ok(api.list(&lp).await?.items)
}

pub async fn device_plugin_to_dra(tb: &impl Testbed, ns: &str) -> Result<()> {
    let trn2 = node(tb, "trn2")?;
    let result = steps(tb, ns, &trn2.node_name).await;
    // Whatever happened, leave the node as the next scenario expects it:
    // no device-plugin resource, the driver running.
    let restore = async {
        advertise(tb, &trn2.node_name, None).await?;
        if !tb.driver_running("trn2", DriverKind::Neuron) {
            let _ = tb.stop_driver("trn2", DriverKind::Neuron).await;
            tb.start_driver("trn2", DriverKind::Neuron).await?;
        }
        registered_on(tb, "trn2", DriverKind::Neuron, REGISTRATION_WAIT).await?;
        anyhow::Ok(())
    }
    .await;
    result?;
    restore
}

async fn steps(tb: &impl Testbed, ns: &str, node_name: &str) -> Result<()> {
    // The device-plugin node: no DRA driver, no slices, the resource
    // advertised.
    tb.stop_driver("trn2", DriverKind::Neuron).await?;
    let slices: Api<ResourceSlice> = Api::all(tb.client());
    for s in neuron_slices(tb, node_name).await? {
        let name = s.metadata.name.unwrap_or_default();
        slices.delete(&name, &DeleteParams::default()).await?;
    }
    advertise(tb, node_name, Some(128)).await?;
    let workload = || extended_resource_pod(tb, "training", "trn2", json!({RESOURCE: 2}));
    kit::apply_all(tb, ns, &[workload()]).await?;
    let pod = kit::running(tb, ns, "training", RUNNING).await?;
    ensure!(
        implicit_claim_devices(tb, ns, &pod).await?.is_none(),
        "on the device-plugin node the pod must get the resource from the node, not from DRA"
    );

    // 1. The guard: the driver does not start beside the device plugin.
    match tokio::time::timeout(REFUSAL_WINDOW, tb.start_driver("trn2", DriverKind::Neuron)).await {
        Ok(Ok(_)) => bail!("the Neuron driver started beside the device plugin's {RESOURCE}"),
        Ok(Err(e)) => tracing::info!(error = %e, "driver refused to start, as expected"),
        Err(_) => tracing::info!("driver did not publish within {REFUSAL_WINDOW:?}, as expected"),
    }
    ensure!(
        neuron_slices(tb, node_name).await?.is_empty(),
        "the refused driver published slices"
    );
    let _ = tb.stop_driver("trn2", DriverKind::Neuron).await;

    // 2. Remove the device plugin: drain its pods; its resource goes to 0.
    kit::delete_pods(tb, ns, &["training"], GONE).await?;
    advertise(tb, node_name, None).await?;

    // 3. Install the driver, and wait until kubelet has registered it.
    tb.start_driver("trn2", DriverKind::Neuron).await?;
    registered_on(tb, "trn2", DriverKind::Neuron, REGISTRATION_WAIT).await?;

    // 4. The same pod, unchanged, now served by DRA.
    kit::apply_all(tb, ns, &[workload()]).await?;
    let pod = kit::running(tb, ns, "training", RUNNING).await?;
    let devices = implicit_claim_devices(tb, ns, &pod)
        .await?
        .ok_or_else(|| anyhow!("after the migration the pod has no implicit DRA claim"))?;
    check_cores_pod(tb, ns, "training", &devices, 2).await?;

    // 5. DRA-served resources are not in the node's allocatable, so the
    //    guard tells them apart from a device plugin: a restart passes it.
    let left = allocatable(tb, node_name).await?;
    ensure!(
        left.as_deref().is_none_or(|v| v == "0"),
        "node allocatable {RESOURCE}={left:?} while DRA serves it"
    );
    tb.stop_driver("trn2", DriverKind::Neuron).await?;
    tb.start_driver("trn2", DriverKind::Neuron).await?;
    registered_on(tb, "trn2", DriverKind::Neuron, REGISTRATION_WAIT).await?;
    kit::delete_pods(tb, ns, &["training"], GONE).await?;
    Ok(())
}
