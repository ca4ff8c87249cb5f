//! NeuronCores as partitions of their chip, and the device plugins'
//! resource names served by DRA: unchanged pods that ask for
//! `aws.amazon.com/neuroncore`, `aws.amazon.com/neurondevice` or
//! `vpc.amazonaws.com/efa` get our devices through the implicit claim of
//! the charts' extended-resource DeviceClasses; claims for cores and for
//! whole chips fill a node without overlap.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::{Value, json};

use super::allocate::{GONE, RUNNING, node};
use super::kit::{self, Allocated};
use crate::testbed::Testbed;

/// The DeviceClass of single NeuronCores the neuron chart ships.
pub(super) const CORE_CLASS: &str = "neuroncore.neuron.aws.com";

/// A probe pod asking for `limits` (extended resources), pinned to `node`:
/// what a device-plugin workload looks like.
pub(super) fn extended_resource_pod(
    tb: &impl Testbed,
    name: &str,
    node: &str,
    limits: Value,
) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "probe", "resources": {"limits": limits}}],
        },
    });
    tb.adapt_pod(&mut pod);
    pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": kit::node_name(tb, node)});
    pod
}

/// The devices of the implicit claim the scheduler made for a pod's
/// extended resources (`status.extendedResourceClaimStatus`); `None` when
/// the pod has none (its resources came from the Node, as from a device
/// plugin).
pub(super) async fn implicit_claim_devices(
    tb: &impl Testbed,
    ns: &str,
    pod: &Pod,
) -> Result<Option<Vec<Allocated>>> {
    let Some(status) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
    else {
        return Ok(None);
    };
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let claim = claims.get(&status.resource_claim_name).await?;
    let mut devices = kit::allocation(&claim);
    devices.sort();
    Ok(Some(devices))
}

/// `(chip, core)` of `neurondeviceN-core-K`.
pub(super) fn core_of(device: &str) -> Option<(u32, u32)> {
    let (chip, core) = device.strip_prefix("neurondevice")?.split_once("-core-")?;
    Some((chip.parse().ok()?, core.parse().ok()?))
}

/// Checks that a pod given `n` cores of 8-core chips sees exactly them:
/// `NEURON_RT_VISIBLE_CORES` lists their node-wide indices at LNC 1, and
/// the device nodes of their chips are there.
pub(super) async fn check_cores_pod(
    tb: &impl Testbed,
    ns: &str,
    pod: &str,
    devices: &[Allocated],
    n: usize,
) -> Result<()> {
    let cores: BTreeSet<(u32, u32)> = devices.iter().filter_map(|d| core_of(&d.device)).collect();
    ensure!(
        cores.len() == n && devices.len() == n,
        "{pod}: want {n} NeuronCore devices, allocated {devices:?}"
    );
    let report = kit::probe(tb, ns, pod).await?;
    let visible = report.env.get("NEURON_RT_VISIBLE_CORES").cloned();
    let mut want: Vec<u32> = cores.iter().map(|(chip, core)| chip * 8 + core).collect();
    want.sort_unstable();
    let listed = visible.as_deref().map(expand).transpose()?;
    ensure!(
        listed.as_ref() == Some(&want),
        "{pod}: NEURON_RT_VISIBLE_CORES={visible:?}, want the cores {want:?} (allocated {cores:?})"
    );
    ensure!(
        report
            .env
            .get("NEURON_LOGICAL_NC_CONFIG")
            .map(String::as_str)
            == Some("1"),
        "{pod}: NEURON_LOGICAL_NC_CONFIG={:?}",
        report.env.get("NEURON_LOGICAL_NC_CONFIG")
    );
    let chips: BTreeSet<String> = cores
        .iter()
        .map(|(c, _)| format!("/dev/neuron{c}"))
        .collect();
    let seen = report.devices_with_prefix("/dev/neuron");
    ensure!(
        seen == chips,
        "{pod}: device nodes {seen:?}, want exactly the chips' {chips:?}"
    );
    Ok(())
}

/// `0-2,7` → `[0, 1, 2, 7]`.
pub(super) fn expand(list: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse()?, b.parse()?);
        out.extend(a..=b);
    }
    Ok(out)
}

/// s17: device-plugin resource names served by DRA, unchanged pods.
pub async fn extended_resources(tb: &impl Testbed, ns: &str) -> Result<()> {
    let p5 = node(tb, "p5")?;
    // aws.amazon.com/neuroncore: 2 -> exactly two cores.
    let pods = [
        extended_resource_pod(tb, "cores", "trn2", json!({"aws.amazon.com/neuroncore": 2})),
        extended_resource_pod(
            tb,
            "chip",
            "trn2",
            json!({"aws.amazon.com/neurondevice": 1}),
        ),
        extended_resource_pod(tb, "efas", "p5", json!({"vpc.amazonaws.com/efa": 4})),
    ];
    kit::apply_all(tb, ns, &pods).await?;
    let mut got: BTreeMap<&str, Vec<Allocated>> = BTreeMap::new();
    for name in ["cores", "chip", "efas"] {
        let pod = kit::running(tb, ns, name, RUNNING).await?;
        let devices = implicit_claim_devices(tb, ns, &pod)
            .await?
            .ok_or_else(|| anyhow!("pod {name} runs without an implicit DRA claim"))?;
        got.insert(name, devices);
    }
    check_cores_pod(tb, ns, "cores", &got["cores"], 2).await?;

    let chip = &got["chip"];
    ensure!(
        chip.len() == 1 && kit::neuron_index(&chip[0].device).is_some(),
        "neurondevice: 1 must be one whole chip, got {chip:?}"
    );
    let index = kit::neuron_index(&chip[0].device).unwrap_or_default();
    let core_chips: BTreeSet<u32> = got["cores"]
        .iter()
        .filter_map(|d| core_of(&d.device))
        .map(|c| c.0)
        .collect();
    ensure!(
        !core_chips.contains(&index),
        "the whole chip {index} was given while cores of it are held ({core_chips:?})"
    );
    let report = kit::probe(tb, ns, "chip").await?;
    let seen = report.devices_with_prefix("/dev/neuron");
    ensure!(
        seen == BTreeSet::from([format!("/dev/neuron{index}")]),
        "neurondevice pod sees {seen:?}, want /dev/neuron{index}"
    );

    let efas = &got["efas"];
    ensure!(
        efas.len() == 4 && efas.iter().all(|d| d.driver == "efa.networking.k8s.aws"),
        "vpc.amazonaws.com/efa: 4 allocated {efas:?}"
    );
    let want: BTreeSet<String> = efas
        .iter()
        .map(|d| {
            kit::efa_uverbs(&p5.fixture, &d.device)
                .map(|u| format!("/dev/infiniband/uverbs{u}"))
                .ok_or_else(|| anyhow!("{} is not an EFA of p5", d.device))
        })
        .collect::<Result<_>>()?;
    let report = kit::probe(tb, ns, "efas").await?;
    let seen = report.devices_with_prefix("/dev/infiniband/uverbs");
    ensure!(
        seen == want,
        "efa pod sees {seen:?}, want its 4 EFAs' {want:?}"
    );
    kit::delete_pods(tb, ns, &["cores", "chip", "efas"], GONE).await?;
    Ok(())
}

/// A claim template for `count` devices of `class`, optionally tied by one
/// `matchAttribute`, with an optional LNC.
fn template(name: &str, class: &str, count: u32, same: Option<&str>, lnc: Option<u32>) -> Value {
    let mut spec = json!({
        "requests": [{"name": "r", "exactly": {"deviceClassName": class, "count": count}}],
    });
    if let Some(attr) = same {
        spec["constraints"] = json!([{"requests": ["r"], "matchAttribute": attr}]);
    }
    if let Some(v) = lnc {
        spec["config"] = json!([{"opaque": {"driver": "neuron.aws.com", "parameters": {
            "apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig", "logicalNeuronCore": v}}}]);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": spec}},
    })
}

/// s18: claims for cores and for whole chips fill trn2 (16 chips x 8
/// cores) without overlap, and the next request stays Pending.
pub async fn cores_fill_node(tb: &impl Testbed, ns: &str) -> Result<()> {
    // (pod, template): a pair of cores on one chip; an LNC 2 logical core
    // (an even pair); 8 whole chips; then cores up to the 128 the node has.
    let plan = [
        (
            "pair",
            template("pair", CORE_CLASS, 2, Some("neuron.aws.com/deviceId"), None),
        ),
        (
            "lnc2",
            template(
                "lnc2",
                CORE_CLASS,
                2,
                Some("neuron.aws.com/lnc2CoreId"),
                Some(2),
            ),
        ),
        ("chips", template("chips", "neuron.aws.com", 8, None, None)),
        ("cores-a", template("cores-a", CORE_CLASS, 32, None, None)),
        ("cores-b", template("cores-b", CORE_CLASS, 28, None, None)),
        ("one-more", template("one-more", CORE_CLASS, 1, None, None)),
    ];
    let templates: Vec<Value> = plan.iter().map(|(_, t)| t.clone()).collect();
    kit::apply_all(tb, ns, &templates).await?;
    let mut held: BTreeMap<&str, Vec<Allocated>> = BTreeMap::new();
    for (name, _) in &plan[..5] {
        let pod = kit::pod_with_claim(tb, name, Some(name), None, Some("trn2"));
        kit::apply_all(tb, ns, &[pod]).await?;
        kit::running(tb, ns, name, RUNNING).await?;
        held.insert(name, kit::pod_devices(tb, ns, name).await?);
    }
    // The pair: two cores of one chip.
    let pair: Vec<(u32, u32)> = held["pair"]
        .iter()
        .filter_map(|d| core_of(&d.device))
        .collect();
    ensure!(
        pair.len() == 2 && pair[0].0 == pair[1].0,
        "matchAttribute deviceId: two cores of one chip, got {:?}",
        held["pair"]
    );
    // The LNC 2 logical core: cores 2k and 2k+1 of one chip, one index.
    let l2: Vec<(u32, u32)> = held["lnc2"]
        .iter()
        .filter_map(|d| core_of(&d.device))
        .collect();
    ensure!(
        l2.len() == 2 && l2[0].0 == l2[1].0 && l2[0].1 / 2 == l2[1].1 / 2,
        "matchAttribute lnc2CoreId: an even pair of one chip, got {:?}",
        held["lnc2"]
    );
    let report = kit::probe(tb, ns, "lnc2").await?;
    let want = (l2[0].0 * 4 + l2[0].1 / 2).to_string();
    ensure!(
        report.env.get("NEURON_RT_VISIBLE_CORES") == Some(&want)
            && report
                .env
                .get("NEURON_LOGICAL_NC_CONFIG")
                .map(String::as_str)
                == Some("2"),
        "LNC 2 pair {l2:?}: env {:?}, want NEURON_RT_VISIBLE_CORES={want} and LNC 2",
        report.env
    );
    // No core handed out twice, no core of a whole chip handed out.
    let mut cores: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut chips: BTreeSet<u32> = BTreeSet::new();
    for (pod, devices) in &held {
        for d in devices {
            if let Some(c) = core_of(&d.device) {
                ensure!(cores.insert(c), "core {c:?} given twice (again to {pod})");
            } else {
                let chip = kit::neuron_index(&d.device)
                    .ok_or_else(|| anyhow!("{pod} got {} (not a chip or core)", d.device))?;
                ensure!(chips.insert(chip), "chip {chip} given twice");
            }
        }
    }
    let overlap: Vec<&(u32, u32)> = cores.iter().filter(|(c, _)| chips.contains(c)).collect();
    ensure!(
        overlap.is_empty(),
        "cores of whole chips handed out: {overlap:?}"
    );
    ensure!(
        chips.len() * 8 + cores.len() == 128,
        "the node is not full: {} chips + {} cores",
        chips.len(),
        cores.len()
    );
    check_cores_pod(tb, ns, "cores-b", &held["cores-b"], 28).await?;
    // Full: one more core stays Pending with the scheduler's reason.
    let pod = kit::pod_with_claim(tb, "one-more", Some("one-more"), None, Some("trn2"));
    kit::apply_all(tb, ns, &[pod]).await?;
    let (reason, message) = kit::wait_for(
        tb,
        "one-more Unschedulable",
        std::time::Duration::from_secs(60),
        || async {
            Ok(kit::get_pod(tb, ns, "one-more")
                .await?
                .as_ref()
                .and_then(kit::unschedulable))
        },
    )
    .await?;
    ensure!(
        reason == "Unschedulable" && message.contains("cannot allocate all claims"),
        "one-more: {reason}: {message}"
    );
    let names: Vec<&str> = plan.iter().map(|(n, _)| *n).collect();
    kit::delete_pods(tb, ns, &names, GONE).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_names_and_lists() {
        assert_eq!(core_of("neurondevice15-core-7"), Some((15, 7)));
        assert_eq!(core_of("neurondevice15"), None);
        assert_eq!(expand("0-2,7").unwrap(), vec![0, 1, 2, 7]);
        assert_eq!(expand("5").unwrap(), vec![5]);
        assert!(expand("x").is_err());
    }
}
