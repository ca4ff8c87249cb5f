//! The p5 phase of scenario 33: `examples/multi-node/efa-p5-job.yaml`, a
//! PodGroup gang of 4 whole p5.48xlarge nodes (8 GPUs, each with the 4 EFAs
//! of its PCIe root, as two claims per pod), on 4 shadow p5 nodes
//! `shadow-p5-n0`…`n3`, each with copies of the slices that our EFA driver
//! and the test GPU driver publish on the testbed's p5 node. With one GPU
//! and one EFA of `shadow-p5-n0` held (`examples/gpu-efa/gpu-efa-same-pcie-root.yaml`),
//! 3 nodes are free for a gang of 4: none binds and none of the 8 claims is
//! allocated. Once the holder goes, all 4 bind, one per node, each GPU
//! with EFAs of its own root.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, anyhow, ensure};
use kube::ResourceExt;
use serde_json::{Value, json};

use super::super::{kit, shadow};
use super::binding::{BIND, Gangs};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

const NODES: u32 = 4;
const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

fn shadow_name(i: u32) -> String {
    format!("shadow-p5-n{i}")
}

/// Phase 3 of scenario 33 (see the module docs). The shadow nodes go with
/// the scenario's cleanup.
pub async fn p5_job(tb: &impl Testbed, ns: &str) -> Result<()> {
    let file = "multi-node/efa-p5-job.yaml";
    let job = kit::example(tb, &examples_dir().join(file), None)?;
    let holder = kit::example(
        tb,
        &examples_dir().join("gpu-efa/gpu-efa-same-pcie-root.yaml"),
        None,
    )?;
    let of_kind = |objs: &[Value], kind: &str| -> Vec<Value> {
        objs.iter().filter(|o| o["kind"] == kind).cloned().collect()
    };
    let group = (of_kind(&job, "PodGroup").pop()).ok_or_else(|| anyhow!("{file}: no PodGroup"))?;
    let mut pods = of_kind(&job, "Pod");
    let min_count = group["spec"]["schedulingPolicy"]["gang"]["minCount"].as_u64();
    ensure!(
        min_count == Some(u64::from(NODES)) && pods.len() == NODES as usize,
        "{file}: want a gang of {NODES} and {NODES} pods, found minCount {min_count:?} and {} pods",
        pods.len()
    );
    let claims_each = pods[0]["spec"]["resourceClaims"]
        .as_array()
        .map_or(0, Vec::len);
    for pod in &mut pods {
        // The example's node selector (p5.48xlarge), and shadow nodes only.
        let selector = pod["spec"]["nodeSelector"].clone();
        shadow::pin_to_shadows(pod);
        for (k, v) in selector.as_object().into_iter().flatten() {
            pod["spec"]["nodeSelector"][k] = v.clone();
        }
    }
    let roots = pcie_roots(tb).await?;
    create_nodes(tb).await?;
    let mut templates = of_kind(&job, "ResourceClaimTemplate");
    templates.extend(of_kind(&holder, "ResourceClaimTemplate"));
    kit::apply_all(tb, ns, &templates).await?;

    let gangs = Gangs { tb, ns };
    let mut held = (of_kind(&holder, "Pod").pop()).ok_or_else(|| anyhow!("no holder pod"))?;
    let held_node = shadow_name(0);
    held["metadata"]["name"] = json!("holder-p5");
    shadow::pin_to_shadows(&mut held);
    held["spec"]["nodeSelector"]["kubernetes.io/hostname"] = json!(held_node);
    kit::apply_all(tb, ns, &[held]).await?;
    let holder = vec!["holder-p5".to_string()];
    let bound = gangs.bound(&holder, BIND).await?;
    ensure!(
        bound["holder-p5"] == held_node,
        "holder-p5 bound to {bound:?}"
    );

    let names = gangs.start(group, pods).await?;
    gangs
        .refused(&names, claims_each)
        .await
        .context("the p5 gang with 3 free nodes")?;
    gangs.delete_now(&holder).await?;
    let placed = gangs
        .bound(&names, BIND)
        .await
        .context("the p5 gang once shadow-p5-n0 is free")?;
    let nodes: BTreeSet<&String> = placed.values().collect();
    let want: BTreeSet<String> = (0..NODES).map(shadow_name).collect();
    ensure!(
        nodes.len() == names.len() && nodes.iter().all(|n| want.contains(*n)),
        "the p5 gang on {placed:?}: want each shadow p5 node once"
    );
    let (gpus, efas) = (
        roots_of(&roots, DriverKind::GpuTest),
        roots_of(&roots, DriverKind::Efa),
    );
    for (pod, node) in &placed {
        whole_node(tb, ns, pod, node, &roots)
            .await
            .with_context(|| format!("{pod} on {node}"))?;
    }
    eprintln!(
        "aws-dra-e2e: p5 gang {names:?} on {nodes:?}: each pod {gpus} GPUs and {efas} EFAs of \
         its node in {claims_each} claims, each GPU with EFAs of its PCIe root"
    );
    gangs.delete_now(&names).await
}

/// `(driver, device) → pcieRoot` of every device our EFA driver and the
/// test GPU driver publish on the testbed's p5 (the shadows' copies carry
/// the same).
type Roots = BTreeMap<(String, String), String>;

async fn pcie_roots(tb: &impl Testbed) -> Result<Roots> {
    let mut roots = Roots::new();
    for kind in [DriverKind::Efa, DriverKind::GpuTest] {
        for (name, device) in kit::devices(tb, "p5", kind).await? {
            let root = kit::attr_str(&device, PCIE_ROOT).ok_or_else(|| {
                anyhow!("p5: {name} of {} has no {PCIE_ROOT}", kind.driver_name())
            })?;
            roots.insert((kind.driver_name().to_owned(), name), root);
        }
    }
    Ok(roots)
}

fn roots_of(roots: &Roots, kind: DriverKind) -> usize {
    roots
        .keys()
        .filter(|(d, _)| d == kind.driver_name())
        .count()
}

/// The shadow p5 nodes, with the instance type the example selects.
async fn create_nodes(tb: &impl Testbed) -> Result<()> {
    let p5 = kit::node_name(tb, "p5");
    let labels = BTreeMap::from([(INSTANCE_TYPE.to_owned(), "p5.48xlarge".to_owned())]);
    let sources = [
        (p5.as_str(), DriverKind::Efa.driver_name()),
        (p5.as_str(), DriverKind::GpuTest.driver_name()),
    ];
    for i in 0..NODES {
        let name = shadow_name(i);
        let copied = shadow::create_from(tb, &name, &labels, &sources).await?;
        ensure!(
            copied >= 2,
            "{name}: copied {copied} slices of {p5}, want at least one per driver"
        );
    }
    Ok(())
}

/// Pod `pod`'s claims hold every GPU and every EFA of `node` between them,
/// and each claim's `pcieRoot` constraints hold (each GPU's EFAs on its root).
async fn whole_node(
    tb: &impl Testbed,
    ns: &str,
    pod: &str,
    node: &str,
    roots: &Roots,
) -> Result<()> {
    let mut all = BTreeSet::new();
    for claim in kit::pod_claims(tb, ns, pod).await? {
        let allocated = kit::allocation(&claim);
        ensure!(
            allocated.iter().all(|a| a.pool == node),
            "{} holds devices of other nodes: {allocated:?}",
            claim.name_any()
        );
        // request → the roots of its devices
        let mut by_request: BTreeMap<&str, BTreeSet<&String>> = BTreeMap::new();
        for a in &allocated {
            let root = (roots.get(&(a.driver.clone(), a.device.clone())))
                .ok_or_else(|| anyhow!("{} {} is not a p5 device", a.driver, a.device))?;
            by_request.entry(&a.request).or_default().insert(root);
            all.insert((a.driver.clone(), a.device.clone()));
        }
        let constraints = (claim.spec.devices.as_ref())
            .and_then(|d| d.constraints.clone())
            .unwrap_or_default();
        for c in constraints {
            if c.match_attribute.as_deref() != Some(PCIE_ROOT) {
                continue;
            }
            let requests = c.requests.unwrap_or_default();
            let seen: BTreeSet<&&String> = (requests.iter())
                .flat_map(|r| by_request.get(r.as_str()).into_iter().flatten())
                .collect();
            ensure!(
                seen.len() == 1,
                "{}: requests {requests:?} on roots {seen:?}",
                claim.name_any()
            );
        }
    }
    let want: BTreeSet<(String, String)> = roots.keys().cloned().collect();
    ensure!(
        all == want,
        "allocated {} devices, want every GPU and EFA of the node ({})",
        all.len(),
        want.len()
    );
    Ok(())
}
