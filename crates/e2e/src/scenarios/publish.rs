//! Scenarios about what the drivers publish: slices (1) and who may write
//! them (11; the Node part in `node_policy`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::kit::{self, attr_int, attr_str};
use crate::testbed::{DriverKind, NodeInfo, Testbed};

/// Every slice of every driver: name → (uid, resourceVersion).
async fn slice_versions(tb: &impl Testbed) -> Result<BTreeMap<String, (String, String)>> {
    let api: Api<ResourceSlice> = Api::all(tb.client());
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                (
                    s.metadata.uid.clone().unwrap_or_default(),
                    s.metadata.resource_version.clone().unwrap_or_default(),
                ),
            )
        })
        .collect())
}

fn check_pool(node: &NodeInfo, kind: DriverKind, slices: &[ResourceSlice]) -> Result<()> {
    let what = format!("{} on {}", kind.driver_name(), node.name);
    ensure!(!slices.is_empty(), "{what}: no slices");
    let complete = crate::pools::pool_complete(slices);
    ensure!(
        complete == Some(kind.expected_devices(&node.fixture)),
        "{what}: pool has {complete:?} devices, fixture has {}",
        kind.expected_devices(&node.fixture)
    );
    for s in slices {
        ensure!(
            s.spec.pool.name == node.node_name,
            "{what}: pool {}",
            s.spec.pool.name
        );
        ensure!(
            s.spec.node_name.as_deref() == Some(node.node_name.as_str()),
            "{what}: nodeName"
        );
        let owner = s
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .ok_or_else(|| anyhow!("{what}: slice without an owner reference"))?;
        ensure!(
            owner.kind == "Node" && owner.name == node.node_name,
            "{what}: owner {owner:?}"
        );
    }
    Ok(())
}

async fn check_attributes(tb: &impl Testbed, node: &NodeInfo) -> Result<()> {
    let f = &node.fixture;
    let mut efa_groups: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    if node.drivers.contains(&DriverKind::Efa) {
        let devs = kit::devices(tb, &node.name, DriverKind::Efa).await?;
        for efa in &f.efas {
            let d = devs
                .values()
                .find(|d| {
                    attr_str(d, "resource.kubernetes.io/pciBusID").as_deref()
                        == Some(efa.bdf.as_str())
                })
                .ok_or_else(|| anyhow!("{}: no EFA device with pciBusID {}", node.name, efa.bdf))?;
            let want_root = Some(efa.pcie_root.clone());
            ensure!(
                attr_str(d, "resource.kubernetes.io/pcieRoot") == want_root,
                "{}: {} pcieRoot",
                node.name,
                d.name
            );
            ensure!(
                attr_int(d, "resource.kubernetes.io/numaNode") == efa.numa_node.map(i64::from),
                "{}: {} numaNode",
                node.name,
                d.name
            );
            ensure!(
                attr_str(d, "rdmaDevice").as_deref() == Some(efa.ibdev.as_str()),
                "{}: {} rdmaDevice",
                node.name,
                d.name
            );
            ensure!(
                attr_str(d, "instanceType").as_deref() == Some(node.instance_type()),
                "{}: {} instanceType",
                node.name,
                d.name
            );
            for n in [
                "devicegroup1_id",
                "devicegroup4_id",
                "devicegroup8_id",
                "devicegroup16_id",
            ] {
                if let Some(v) = attr_str(d, &format!("resource.aws.com/{n}")) {
                    efa_groups.entry(n).or_default().insert(v);
                }
            }
        }
    }
    if node.drivers.contains(&DriverKind::Neuron) {
        let devs = kit::devices(tb, &node.name, DriverKind::Neuron).await?;
        let mut chip_groups: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for chip in &f.neuron_chips {
            let name = format!("neurondevice{}", chip.index);
            let d = devs
                .get(&name)
                .ok_or_else(|| anyhow!("{}: no Neuron device {name}", node.name))?;
            ensure!(
                attr_int(d, "deviceId") == Some(i64::from(chip.index)),
                "{}: {name} deviceId",
                node.name
            );
            ensure!(
                attr_int(d, "coreCount") == Some(i64::from(chip.core_count)),
                "{}: {name} coreCount",
                node.name
            );
            ensure!(
                attr_str(d, "instanceType").as_deref() == Some(node.instance_type()),
                "{}: {name} instanceType",
                node.name
            );
            for n in [
                "devicegroup1_id",
                "devicegroup4_id",
                "devicegroup8_id",
                "devicegroup16_id",
            ] {
                let v = attr_str(d, &format!("resource.aws.com/{n}"))
                    .ok_or_else(|| anyhow!("{}: {name} has no resource.aws.com/{n}", node.name))?;
                chip_groups.entry(n).or_default().insert(v);
            }
        }
        // The pairing contract: on EFA-enabled Neuron instances both drivers
        // publish the same group values.
        if node.drivers.contains(&DriverKind::Efa) {
            for (n, values) in &chip_groups {
                let efa = efa_groups.get(n).cloned().unwrap_or_default();
                ensure!(
                    efa.is_subset(values) && !efa.is_empty(),
                    "{}: EFA {n} values {efa:?} are not among the chips' {values:?}",
                    node.name
                );
            }
            let g4 = chip_groups.get("devicegroup4_id").map_or(0, BTreeSet::len);
            ensure!(
                g4 == f.neuron_chips.len() / 4,
                "{}: {g4} distinct devicegroup4_id values",
                node.name
            );
        }
    }
    if node.drivers.contains(&DriverKind::GpuTest) {
        let devs = kit::devices(tb, &node.name, DriverKind::GpuTest).await?;
        for gpu in &f.gpus {
            let name = format!("gpu-{}", gpu.index);
            let d = devs
                .get(&name)
                .ok_or_else(|| anyhow!("{}: no GPU {name}", node.name))?;
            ensure!(
                attr_str(d, "resource.kubernetes.io/pcieRoot").as_deref()
                    == Some(gpu.pcie_root.as_str()),
                "{name} pcieRoot"
            );
            ensure!(
                attr_str(d, "resource.kubernetes.io/pciBusID").as_deref() == Some(gpu.bdf.as_str()),
                "{name} pciBusID"
            );
        }
    }
    Ok(())
}

/// Scenario 1.
pub async fn slices(tb: &impl Testbed, _ns: &str) -> Result<()> {
    for node in tb.nodes() {
        for kind in &node.drivers {
            let s = kit::slices(tb, &node.name, *kind).await?;
            check_pool(&node, *kind, &s)?;
        }
        check_attributes(tb, &node).await?;
    }

    // Drift repair: a slice deleted by hand comes back (new object, same pool).
    let p5 = tb
        .nodes()
        .into_iter()
        .find(|n| n.name == "p5")
        .ok_or_else(|| anyhow!("no p5 node"))?;
    let before = kit::slices(tb, "p5", DriverKind::Efa).await?;
    let victim = before[0].metadata.name.clone().unwrap_or_default();
    let old_uid = before[0].metadata.uid.clone();
    let api: Api<ResourceSlice> = Api::all(tb.client());
    api.delete(&victim, &DeleteParams::default()).await?;
    kit::wait_for(
        tb,
        &format!("slice {victim} re-created"),
        Duration::from_secs(30),
        || async {
            let now = kit::slices(tb, "p5", DriverKind::Efa).await?;
            let back = now.iter().any(|s| s.metadata.uid != old_uid);
            Ok(
                (back && crate::pools::pool_complete(&now) == Some(p5.fixture.efas.len()))
                    .then_some(()),
            )
        },
    )
    .await?;

    // Restart without change writes nothing.
    let restarts = [
        ("p5", DriverKind::Efa),
        ("p5", DriverKind::GpuTest),
        ("trn2", DriverKind::Neuron),
        ("trn2", DriverKind::Efa),
    ];
    // Let the repair settle before taking the baseline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = slice_versions(tb).await?;
    for (node, kind) in restarts {
        tb.stop_driver(node, kind).await?;
        tb.start_driver(node, kind).await?;
    }
    // Give the restarted publishers time to (wrongly) write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = slice_versions(tb).await?;
    if after != baseline {
        let changed: Vec<&String> = after
            .iter()
            .filter(|(k, v)| baseline.get(*k) != Some(v))
            .map(|(k, _)| k)
            .chain(baseline.keys().filter(|k| !after.contains_key(*k)))
            .collect();
        bail!(
            "restarting the drivers rewrote slices {changed:?}; {}",
            tb.logs_hint()
        );
    }
    Ok(())
}

fn denied(result: Result<ResourceSlice, kube::Error>, want: &str, what: &str) -> Result<()> {
    match result {
        Ok(_) => bail!("{what}: was allowed"),
        Err(kube::Error::Api(e)) => {
            ensure!(
                (e.code == 403 || e.code == 422) && e.message.contains(want),
                "{what}: expected a denial containing {want:?}, got {} {}",
                e.code,
                e.message
            );
            Ok(())
        }
        Err(e) => bail!("{what}: {e}"),
    }
}

/// Scenario 11.
pub async fn node_isolation(tb: &impl Testbed, _ns: &str) -> Result<()> {
    let kubeconfig = tb.driver_kubeconfig("p5", DriverKind::Efa)?;
    let driver = crate::client_from_kubeconfig(&kubeconfig).await?;

    // The token is bound to a pod on p5, so it carries the node name.
    let review: SelfSubjectReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
    }))?;
    let reviews: Api<SelfSubjectReview> = Api::all(driver.clone());
    let me = reviews
        .create(&PostParams::default(), &review)
        .await
        .context("SelfSubjectReview with the p5 EFA driver token")?;
    let user = me
        .status
        .and_then(|s| s.user_info)
        .ok_or_else(|| anyhow!("SelfSubjectReview without userInfo"))?;
    let (ns, sa) = DriverKind::Efa.service_account();
    ensure!(
        user.username.as_deref() == Some(format!("system:serviceaccount:{ns}:{sa}").as_str()),
        "username {:?}",
        user.username
    );
    let node_name = user
        .extra
        .as_ref()
        .and_then(|e| e.get("authentication.kubernetes.io/node-name"))
        .cloned();
    ensure!(
        node_name == Some(vec![kit::node_name(tb, "p5")]),
        "the bound token carries node-name {node_name:?} (extra {:?}); ServiceAccountTokenPodNodeInfo off?",
        user.extra
    );

    let as_driver: Api<ResourceSlice> = Api::all(driver.clone());
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let slice_for = |node: &str| -> Result<ResourceSlice> {
        let node = kit::node_name(tb, node);
        Ok(serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("e2e-forged-{node}")},
            "spec": {
                "driver": DriverKind::Efa.driver_name(), "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "efa-forged"}],
            },
        }))?)
    };
    let trn2_slice = kit::slices(tb, "trn2", DriverKind::Efa)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("trn2 has no EFA slice"))?;
    let trn2_name = trn2_slice.metadata.name.clone().unwrap_or_default();
    // A change as the driver makes one: a replace (the chart grants no
    // patch on slices), here of the slice with one label more.
    let labelled = |slice: &ResourceSlice| {
        let mut slice = slice.clone();
        slice
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("forged".into(), "yes".into());
        slice
    };
    let want = &format!(
        "may not modify ResourceSlices of node '{}'",
        kit::node_name(tb, "trn2")
    );

    // Allowed on its own node (dry run: admission runs, nothing is stored).
    as_driver
        .create(&dry, &slice_for("p5")?)
        .await
        .context("p5's EFA driver creating a p5 slice (dry run) must be allowed")?;
    let own = kit::slices(tb, "p5", DriverKind::Efa).await?;
    let own_name = own[0].metadata.name.clone().unwrap_or_default();
    as_driver
        .replace(&own_name, &dry, &labelled(&own[0]))
        .await
        .context("p5's EFA driver changing its own slice (dry run) must be allowed")?;

    // Denied on trn2: create, change, delete.
    denied(
        as_driver.create(&dry, &slice_for("trn2")?).await,
        want,
        "create a trn2 slice",
    )?;
    denied(
        as_driver
            .replace(&trn2_name, &dry, &labelled(&trn2_slice))
            .await,
        want,
        "change trn2's slice",
    )?;
    let del = as_driver
        .delete(
            &trn2_name,
            &DeleteParams {
                dry_run: true,
                ..Default::default()
            },
        )
        .await;
    match del {
        Ok(_) => bail!("p5's EFA driver deleting trn2's slice {trn2_name} was allowed"),
        Err(kube::Error::Api(e)) => ensure!(
            e.message.contains(want),
            "delete denial: {} {}",
            e.code,
            e.message
        ),
        Err(e) => bail!("delete: {e}"),
    }

    // And a driver may not touch another driver's slices on its own node.
    let trn2_efa =
        crate::client_from_kubeconfig(&tb.driver_kubeconfig("trn2", DriverKind::Efa)?).await?;
    let neuron_slice = kit::slices(tb, "trn2", DriverKind::Neuron)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("trn2 has no Neuron slice"))?;
    let as_trn2_efa: Api<ResourceSlice> = Api::all(trn2_efa);
    denied(
        as_trn2_efa
            .replace(
                neuron_slice.metadata.name.as_deref().unwrap_or_default(),
                &dry,
                &labelled(&neuron_slice),
            )
            .await,
        "may only modify ResourceSlices of driver efa.networking.k8s.aws",
        "trn2's EFA driver changing the Neuron slice",
    )?;

    // The Neuron driver may patch Nodes: only its own, only its labels.
    super::node_policy::neuron_driver_node(tb).await
}
