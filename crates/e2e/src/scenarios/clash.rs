//! Scenario 25: no silent clash. A stand-in for another publisher of our
//! hardware writes ResourceSlices under another identity (the test GPU
//! driver's ServiceAccount token, with a field manager of its own), as
//! DRANET and AWS's Neuron DRA driver would:
//!
//! 1. a `dra.net` slice on trn1 naming one of our EFAs' PCI addresses: the
//!    EFA driver withdraws exactly that EFA (gauge, Node event); a claim for
//!    every EFA of the node gets distinct EFAs, none at the stand-in's PCI
//!    address, and the last stays Pending; when the stand-in's slice is
//!    deleted the EFA is published again and the Pending claim gets it.
//! 2. a `neuron.aws.com` slice on trn2 in our pool, written by the stand-in:
//!    the Neuron driver withdraws its whole pool and never deletes or
//!    modifies the stand-in's slice; when it is deleted our pool comes back.
//!
//! The stand-in has no kubelet plugin, so no pod can be prepared with its
//! device; "no device allocated twice" is shown from our side: none of our
//! allocations carries an address the stand-in publishes, and the scheduler
//! has one EFA fewer to give.
//!
//! Device names are read from the published slices, never spelled here: the
//! Neuron driver's names change with the move to AWS's `neurondevice<N>`.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::allocate::{GONE, RUNNING, node};
use super::kit::{self, attr_str};
use crate::testbed::{DriverKind, Testbed};

/// The Node event reason and the gauge the drivers use (dra-core's publisher).
const EVENT_REASON: &str = "DevicesPublishedByAnotherDriver";
const GAUGE: &str = "aws_dra_publish_withheld_devices";
const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// How long a driver may take to react to a slice event (watch + reconcile).
const REACT: Duration = Duration::from_secs(30);

/// The stand-in's client: another identity than the drivers' and the
/// test's, the test GPU driver's ServiceAccount (`gpu-test-driver`, allowed
/// to write ResourceSlices of any driver by its RBAC, bound by no admission
/// policy), the way a third-party driver with its own RBAC would write.
async fn stand_in_client(tb: &impl Testbed) -> Result<kube::Client> {
    let kubeconfig = tb
        .driver_kubeconfig("p5", DriverKind::GpuTest)
        .context("the test GPU driver's credentials for the stand-in")?;
    Ok(crate::client_from_kubeconfig(&kubeconfig).await?)
}

fn write_as(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.to_owned()),
        ..Default::default()
    }
}

/// The value of the clash gauge for `other` on a driver.
async fn withheld(tb: &impl Testbed, node: &str, kind: DriverKind, other: &str) -> Result<f64> {
    let metrics = tb.driver_metrics(node, kind).await?;
    Ok(kit::gauge(&metrics, GAUGE, &format!("other_driver=\"{other}\"")).unwrap_or(0.0))
}

/// Waits for the clash Node event of `node` that names `slice`.
async fn clash_event(tb: &impl Testbed, node: &str, slice: &str) -> Result<Event> {
    let events: Api<Event> = Api::namespaced(tb.client(), "default");
    let selector =
        format!("involvedObject.kind=Node,involvedObject.name={node},reason={EVENT_REASON}");
    kit::wait_for(
        tb,
        &format!("Node event {EVENT_REASON} on {node} naming {slice}"),
        REACT,
        || async {
            Ok(events
                .list(&ListParams::default().fields(&selector))
                .await?
                .items
                .into_iter()
                .find(|e| e.message.as_deref().is_some_and(|m| m.contains(slice))))
        },
    )
    .await
}

/// Scenario 25.
pub async fn no_silent_clash(tb: &impl Testbed, ns: &str) -> Result<()> {
    dranet_beside_efa(tb, ns).await?;
    aws_neuron_beside_ours(tb).await
}

async fn dranet_beside_efa(tb: &impl Testbed, ns: &str) -> Result<()> {
    // Asked for here, not left to an earlier scenario having started it.
    tb.ensure_node(
        "trn1",
        "trn1.32xlarge",
        &[DriverKind::Efa, DriverKind::Neuron],
    )
    .await?;
    let trn1 = node(tb, "trn1")?;
    let node_name = trn1.node_name.clone();
    let total = DriverKind::Efa.expected_devices(&trn1.fixture);
    ensure!(total >= 2, "trn1 has {total} EFAs, the scenario needs 2");
    let before = kit::devices(tb, "trn1", DriverKind::Efa).await?;
    let (victim, victim_bdf) = before
        .values()
        .find_map(|d| Some((d.name.clone(), attr_str(d, PCI_BUS_ID)?)))
        .ok_or_else(|| anyhow!("no EFA on trn1 publishes {PCI_BUS_ID}"))?;

    // DRANET's shape: its own attribute names, its own device name, one
    // other device (a plain NIC) that is none of ours.
    const NIC: &str = "0000:00:05.0";
    ensure!(
        !before
            .values()
            .any(|d| attr_str(d, PCI_BUS_ID).as_deref() == Some(NIC)),
        "the stand-in's plain NIC {NIC} is an EFA of trn1's fixture"
    );
    let stand_in = stand_in_client(tb).await?;
    let as_dranet: Api<ResourceSlice> = Api::all(stand_in);
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": format!("{node_name}-dra.net-")},
        "spec": {
            "driver": "dra.net",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": format!("pci-{}", victim_bdf.replace([':', '.'], "-")), "attributes": {
                    "dra.net/pciAddress": {"string": victim_bdf},
                    "dra.net/pciDevice": {"string": "Elastic Fabric Adapter (EFA)"},
                    "dra.net/rdma": {"bool": true},
                }},
                {"name": format!("pci-{}", NIC.replace([':', '.'], "-")), "attributes": {
                    "dra.net/pciAddress": {"string": NIC},
                    "dra.net/pciDevice": {"string": "Elastic Network Adapter (ENA)"},
                }},
            ],
        },
    }))?;
    let created = as_dranet
        .create(&write_as("dranet-stand-in"), &slice)
        .await
        .context("creating the DRANET stand-in's slice")?;
    let slice_name = created.metadata.name.clone().unwrap_or_default();
    println!("    stand-in dra.net slice {slice_name} lists {victim} ({victim_bdf})");

    let result: Result<()> = async {
        // Our pool loses exactly that EFA.
        kit::wait_for(
            tb,
            &format!("{victim} withdrawn from trn1's EFA pool"),
            REACT,
            || async {
                let slices = kit::slices(tb, "trn1", DriverKind::Efa).await?;
                let names: BTreeSet<String> = slices
                    .iter()
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .map(|d| d.name.clone())
                    .collect();
                Ok((crate::pools::pool_complete(&slices) == Some(total - 1)
                    && !names.contains(&victim))
                .then_some(()))
            },
        )
        .await?;
        let gauge = withheld(tb, "trn1", DriverKind::Efa, "dra.net").await?;
        ensure!(
            gauge == 1.0,
            "{GAUGE}{{other_driver=\"dra.net\"}} = {gauge}, want 1"
        );
        let event = clash_event(tb, &node_name, &slice_name).await?;
        let message = event.message.unwrap_or_default();
        ensure!(
            message.contains(&victim) && event.type_.as_deref() == Some("Warning"),
            "Node event does not name {victim}: {message}"
        );
        println!("    withdrawn: {GAUGE} 1, Node event: {message}");

        // A claim for every EFA of the node: all but one are allocated,
        // each a different EFA, none at the stand-in's address.
        let template = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-efa"},
            "spec": {"spec": {"devices": {"requests": [{"name": "efa", "exactly": {
                "deviceClassName": DriverKind::Efa.driver_name(), "count": 1,
            }}]}}},
        });
        kit::apply_all(tb, ns, &[template]).await?;
        let pods: Vec<String> = (0..total).map(|i| format!("efa-{i}")).collect();
        for p in &pods {
            let pod = kit::pod_with_claim(tb, p, Some("one-efa"), None, Some("trn1"));
            kit::apply_all(tb, ns, &[pod]).await?;
        }
        // All but one run; which one is left is the scheduler's choice. A pod
        // may read unschedulable for a moment while its claim is being
        // created, so only the final count decides.
        let phases = || async {
            let mut running = Vec::new();
            let mut other = Vec::new();
            for p in &pods {
                let phase = kit::get_pod(tb, ns, p)
                    .await?
                    .and_then(|pod| pod.status.and_then(|s| s.phase));
                if phase.as_deref() == Some("Running") {
                    running.push(p.clone());
                } else {
                    other.push(p.clone());
                }
            }
            anyhow::Ok((running, other))
        };
        let (running, pending) = kit::wait_for(
            tb,
            &format!("{} of {total} EFA pods on trn1 Running", total - 1),
            RUNNING,
            || async {
                let (running, other) = phases().await?;
                Ok((running.len() == total - 1).then_some((running, other)))
            },
        )
        .await?;
        ensure!(pending.len() == 1, "pods not running: {pending:?}");
        let last = pending[0].clone();
        kit::stays_pending(tb, ns, &last).await?;
        let (still_running, _) = phases().await?;
        ensure!(
            still_running == running,
            "{total} claims for {total} EFAs with one withheld: running {still_running:?}"
        );
        let mut addresses = BTreeSet::new();
        for p in &running {
            for a in kit::pod_devices(tb, ns, p).await? {
                let d = kit::published(tb, &a).await?;
                let bdf = attr_str(&d, PCI_BUS_ID)
                    .ok_or_else(|| anyhow!("{} has no {PCI_BUS_ID}", a.device))?;
                ensure!(bdf != victim_bdf, "{p} got {bdf}, which dra.net publishes");
                ensure!(
                    addresses.insert(bdf.clone()),
                    "{bdf} allocated twice (again to {p})"
                );
            }
        }
        println!(
            "    {} claims allocated {} distinct EFAs, none at {victim_bdf}; {last} Pending",
            running.len(),
            addresses.len()
        );

        // The stand-in goes: the EFA is back and the last claim gets it.
        as_dranet
            .delete(&slice_name, &DeleteParams::default())
            .await
            .context("deleting the stand-in's slice")?;
        kit::running(tb, ns, &last, RUNNING).await?;
        let got = kit::pod_devices(tb, ns, &last).await?;
        ensure!(
            got.len() == 1 && got[0].device == victim,
            "{last} should get the EFA published again ({victim}), got {got:?}"
        );
        let pool = kit::slices(tb, "trn1", DriverKind::Efa).await?;
        ensure!(
            crate::pools::pool_complete(&pool) == Some(total),
            "trn1's EFA pool after the stand-in left: {:?} devices, want {total}",
            crate::pools::pool_complete(&pool)
        );
        kit::wait_for(tb, &format!("{GAUGE} back to 0 on trn1"), REACT, || async {
            Ok((withheld(tb, "trn1", DriverKind::Efa, "dra.net").await? == 0.0).then_some(()))
        })
        .await?;
        println!("    stand-in gone: {victim} published again, {last} Running with it, {GAUGE} 0");
        let names: Vec<&str> = pods.iter().map(String::as_str).collect();
        kit::delete_pods(tb, ns, &names, GONE).await
    }
    .await;
    // Never leave the stand-in behind, whatever failed.
    let _ = as_dranet
        .delete(&slice_name, &DeleteParams::default())
        .await;
    result
}

async fn aws_neuron_beside_ours(tb: &impl Testbed) -> Result<()> {
    let trn2 = node(tb, "trn2")?;
    let node_name = trn2.node_name.clone();
    let driver = DriverKind::Neuron.driver_name();
    let total = DriverKind::Neuron.expected_devices(&trn2.fixture);
    let ours = kit::slices(tb, "trn2", DriverKind::Neuron).await?;
    ensure!(
        crate::pools::pool_complete(&ours) == Some(total),
        "trn2's Neuron pool is not complete before the scenario"
    );
    let our_names: BTreeSet<String> = ours
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    // AWS's chips (`resourceType: neuron_device`, as both drivers publish
    // them): the names and attributes we publish, read rather than spelled,
    // without counters.
    let chips: Vec<serde_json::Value> = ours
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| kit::attr_str(d, "resourceType").as_deref() == Some("neuron_device"))
        .take(16)
        .map(|d| json!({"name": d.name, "attributes": d.attributes}))
        .collect();
    ensure!(!chips.is_empty(), "trn2 publishes no Neuron device");

    let stand_in = stand_in_client(tb).await?;
    let as_aws: Api<ResourceSlice> = Api::all(stand_in);
    // The Go helper's shape: generateName `<node>-<driver>-`, the node as
    // pool, owned by the Node.
    let node_uid = ours
        .iter()
        .find_map(|s| {
            s.metadata
                .owner_references
                .as_ref()?
                .first()
                .map(|o| o.uid.clone())
        })
        .unwrap_or_default();
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {
            "generateName": format!("{node_name}-{driver}-"),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": true}],
        },
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": chips,
        },
    }))?;
    let created = as_aws
        .create(&write_as("aws-neuron-dra-stand-in"), &slice)
        .await
        .context("creating the Neuron stand-in's slice")?;
    let slice_name = created.metadata.name.clone().unwrap_or_default();
    let version = created.metadata.resource_version.clone();
    println!(
        "    stand-in {driver} slice {slice_name} with {} devices in pool {node_name}",
        chips.len()
    );

    let result: Result<()> = async {
        kit::wait_for(tb, &format!("our {driver} slices on trn2 withdrawn"), REACT, || async {
            let left: Vec<String> = kit::slices(tb, "trn2", DriverKind::Neuron)
                .await?
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .filter(|n| *n != slice_name)
                .collect();
            Ok(left.is_empty().then_some(()))
        })
        .await?;
        let event = clash_event(tb, &node_name, &slice_name).await?;
        let gauge = withheld(tb, "trn2", DriverKind::Neuron, driver).await?;
        ensure!(
            gauge == total as f64,
            "{GAUGE}{{other_driver=\"{driver}\"}} = {gauge}, want {total}"
        );
        // The driver keeps its hands off the stand-in's slice: give it a
        // few reconcile chances (watch events of its own deletes came and
        // went), then the slice must be exactly as written.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = as_aws.get(&slice_name).await.context("the stand-in's slice is gone")?;
        ensure!(
            now.metadata.resource_version == version && now.metadata.uid == created.metadata.uid,
            "the driver modified the stand-in's slice: resourceVersion {:?} -> {:?}",
            version,
            now.metadata.resource_version
        );
        println!(
            "    withdrawn: {} slices of ours deleted, the stand-in's untouched, {GAUGE} {gauge}, Node event: {}",
            our_names.len(),
            event.message.unwrap_or_default()
        );

        as_aws
            .delete(&slice_name, &DeleteParams::default())
            .await
            .context("deleting the stand-in's slice")?;
        kit::wait_for(tb, &format!("trn2's {driver} pool back"), REACT, || async {
            let slices = kit::slices(tb, "trn2", DriverKind::Neuron).await?;
            Ok((crate::pools::pool_complete(&slices) == Some(total)).then_some(()))
        })
        .await?;
        kit::wait_for(tb, &format!("{GAUGE} back to 0 on trn2"), REACT, || async {
            Ok((withheld(tb, "trn2", DriverKind::Neuron, driver).await? == 0.0).then_some(()))
        })
        .await?;
        println!("    stand-in gone: trn2's pool of {total} devices is back, {GAUGE} 0");
        Ok(())
    }
    .await;
    let _ = as_aws.delete(&slice_name, &DeleteParams::default()).await;
    result
}
