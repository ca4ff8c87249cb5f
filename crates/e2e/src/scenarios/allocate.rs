//! Scenarios about what the scheduler allocates from our slices and what the
//! container then sees: 2, 3, 4, 5, 6 and the CEL selector examples.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::agreement;
pub(super) use super::kit::stays_pending;
use super::kit::{self, Allocated, ProbeReport, attr_str};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, NodeInfo, Testbed};

pub(super) const RUNNING: Duration = Duration::from_secs(120);
pub(super) const GONE: Duration = Duration::from_secs(90);

pub(super) fn node(tb: &impl Testbed, name: &str) -> Result<NodeInfo> {
    tb.nodes()
        .into_iter()
        .find(|n| n.name == name || n.node_name == name)
        .ok_or_else(|| anyhow!("no node {name} in the testbed"))
}

/// The testbed node a pod was bound to (where a claim naming none was served).
fn node_of(tb: &impl Testbed, pod: &Pod) -> Result<NodeInfo> {
    let name = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    node(tb, name.unwrap_or_default())
}

fn of_driver(devs: &[Allocated], kind: DriverKind) -> Vec<Allocated> {
    devs.iter()
        .filter(|d| d.driver == kind.driver_name())
        .cloned()
        .collect()
}

/// The container sees exactly the uverbs nodes of `efas` (right numbers),
/// and `EFA_RDMA_DEVICES` names them.
pub(super) fn check_efa_view(
    node: &NodeInfo,
    efas: &[Allocated],
    report: &ProbeReport,
) -> Result<()> {
    let mut want = BTreeSet::new();
    let mut ibdevs = Vec::new();
    for e in efas {
        let bdf =
            kit::efa_bdf(&e.device).ok_or_else(|| anyhow!("odd EFA device name {}", e.device))?;
        let info = node
            .fixture
            .efa(&bdf)
            .ok_or_else(|| anyhow!("{}: {bdf} is not an EFA of the fixture", node.name))?;
        let path = format!("/dev/infiniband/uverbs{}", info.uverbs);
        let seen = report.devices.get(&path);
        let minor = sysfs_fixtures::UVERBS_MINOR_BASE + info.uverbs;
        let char_dev = format!("char {}:{minor}", sysfs_fixtures::UVERBS_MAJOR);
        ensure!(
            seen == Some(&char_dev),
            "{path} in the container is {seen:?}"
        );
        want.insert(path);
        ibdevs.push(info.ibdev.clone());
    }
    let got = report.devices_with_prefix("/dev/infiniband/uverbs");
    ensure!(
        got == want,
        "container sees uverbs {got:?}, allocated {want:?}"
    );
    ibdevs.sort();
    ensure!(
        report.env.get("EFA_RDMA_DEVICES") == Some(&ibdevs.join(",")),
        "EFA_RDMA_DEVICES={:?}, want {:?}",
        report.env.get("EFA_RDMA_DEVICES"),
        ibdevs.join(",")
    );
    Ok(())
}

/// The container sees exactly `/dev/neuronN` of the allocated chips.
pub(super) fn check_neuron_view(
    chips: &[Allocated],
    report: &ProbeReport,
) -> Result<BTreeSet<u32>> {
    let idx: BTreeSet<u32> = chips
        .iter()
        .map(|c| kit::neuron_index(&c.device).ok_or_else(|| anyhow!("odd chip name {}", c.device)))
        .collect::<Result<_>>()?;
    let want: BTreeSet<String> = idx.iter().map(|i| format!("/dev/neuron{i}")).collect();
    let got = report.devices_with_prefix("/dev/neuron");
    ensure!(got == want, "container sees {got:?}, allocated {want:?}");
    Ok(idx)
}

/// `0-7`, `0-3,8-11`: the format of `NEURON_RT_VISIBLE_CORES`.
pub(super) fn range_list(mut v: Vec<u32>) -> String {
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// `NEURON_RT_VISIBLE_CORES` for chips `idx` of `node` at `lnc`.
pub(super) fn visible_cores(node: &NodeInfo, idx: &BTreeSet<u32>, lnc: u32) -> Result<String> {
    let mut cores = Vec::new();
    for i in idx {
        let chip = node
            .fixture
            .neuron_chips
            .iter()
            .find(|c| c.index == *i)
            .ok_or_else(|| anyhow!("no chip {i} on {}", node.name))?;
        let per = (chip.core_count / lnc).max(1);
        cores.extend(i * per..(i + 1) * per);
    }
    Ok(range_list(cores))
}

/// Scenario 2: `examples/efa/single-efa.yaml`.
pub async fn single_efa(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), None)?;
    kit::apply_all(tb, ns, &objs).await?;
    let info = node_of(tb, &kit::running(tb, ns, "single-efa", RUNNING).await?)?;
    let devs = kit::pod_devices(tb, ns, "single-efa").await?;
    ensure!(
        devs.len() == 1 && devs[0].driver == DriverKind::Efa.driver_name(),
        "allocated {devs:?}"
    );
    ensure!(
        devs[0].pool == info.node_name,
        "EFA from pool {} for a pod on {}",
        devs[0].pool,
        info.node_name
    );
    let report = kit::probe(tb, ns, "single-efa").await?;
    check_efa_view(&info, &devs, &report)?;
    ensure!(
        report.devices.contains_key("/dev/infiniband/rdma_cm"),
        "no rdma_cm: {:?}",
        report.devices
    );
    let published = kit::devices(tb, &info.name, DriverKind::Efa).await?.len();
    kit::efa_gauges(tb, &info.name, (1, 1, published)).await?;
    kit::delete_pods(tb, ns, &["single-efa"], GONE).await?;
    kit::efa_gauges(tb, &info.name, (0, 0, published)).await?;
    Ok(())
}

async fn root_of(tb: &impl Testbed, a: &Allocated) -> Result<String> {
    let d = kit::published(tb, a).await?;
    attr_str(&d, "resource.kubernetes.io/pcieRoot")
        .ok_or_else(|| anyhow!("{} has no pcieRoot", a.device))
}

/// Scenario 3: `examples/gpu-efa/gpu-efa-same-pcie-root.yaml`.
pub async fn gpu_efa_same_root(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(
        tb,
        &examples_dir().join("gpu-efa/gpu-efa-same-pcie-root.yaml"),
        None,
    )?;
    kit::apply_all(tb, ns, &objs).await?;
    // On whichever node has a GPU: the claim names none.
    let on = node_of(tb, &kit::running(tb, ns, "gpu-efa-aligned", RUNNING).await?)?;
    let devs = kit::pod_devices(tb, ns, "gpu-efa-aligned").await?;
    let [gpus, efas] = [DriverKind::GpuTest, DriverKind::Efa].map(|k| of_driver(&devs, k));
    ensure!(gpus.len() == 1 && efas.len() == 1, "allocated {devs:?}");
    let (g, e) = (root_of(tb, &gpus[0]).await?, root_of(tb, &efas[0]).await?);
    ensure!(g == e, "GPU on {g}, EFA on {e}");
    let report = kit::probe(tb, ns, "gpu-efa-aligned").await?;
    check_efa_view(&on, &efas, &report)?;
    let gpu_index = gpus[0].device.trim_start_matches("gpu-");
    ensure!(
        report
            .devices
            .contains_key(&format!("/dev/nvidia{gpu_index}")),
        "no /dev/nvidia{gpu_index}: {:?}",
        report.devices
    );
    ensure!(
        report.env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str) == Some(gpu_index),
        "NVIDIA_VISIBLE_DEVICES"
    );
    kit::delete_pods(tb, ns, &["gpu-efa-aligned"], GONE).await?;
    Ok(())
}

/// The template of an example file (the file's only ResourceClaimTemplate).
fn template_of(objs: &[Value]) -> Result<Value> {
    objs.iter()
        .find(|o| o["kind"] == "ResourceClaimTemplate")
        .cloned()
        .ok_or_else(|| anyhow!("no ResourceClaimTemplate in the example"))
}

/// The All example's template renamed, with the efas request's selector
/// replaced by `selector` (or removed).
fn all_variant(all: &[Value], name: &str, selector: Option<&str>) -> Result<Value> {
    let mut t = template_of(all)?;
    t["metadata"]["name"] = json!(name);
    let efas = t["spec"]["spec"]["devices"]["requests"]
        .as_array_mut()
        .and_then(|r| r.iter_mut().find(|r| r["name"] == "efas"))
        .and_then(|r| r["exactly"].as_object_mut())
        .ok_or_else(|| anyhow!("the All example lost its `efas` request"))?;
    match selector {
        Some(cel) => efas.insert("selectors".into(), json!([{"cel": {"expression": cel}}])),
        None => efas.remove("selectors"),
    };
    Ok(t)
}

/// Scenario 4: GPU + all EFAs on its root.
///
/// What the real scheduler (1.34.4) does with `allocationMode: All` and a
/// `matchAttribute` constraint: `All` takes every matching device of the
/// node, and the constraint must hold for all of them. So the example names
/// the root in a selector (→ the 4 EFAs of pci0000:44 and the GPU there);
/// `count: 4` finds any root. `All` without naming a root fails on p5 before
/// the constraint is even tried: 32 EFAs + 1 GPU exceed the 32 results a
/// claim may hold; and `All` over a set spanning several roots (NUMA 0's 16
/// EFAs) is unsatisfiable. Both stay Pending with the scheduler's reason.
pub async fn gpu_all_efas_on_root(tb: &impl Testbed, ns: &str) -> Result<()> {
    // a) allocationMode: All, root named by the selector.
    let all = kit::example(
        tb,
        &examples_dir().join("gpu-efa/gpu-all-efas-on-root.yaml"),
        None,
    )?;
    kit::apply_all(tb, ns, &all).await?;
    let pod = kit::pod_with_claim(tb, "all-on-root", Some("gpu-all-efas-on-root"), None, None);
    kit::apply_all(tb, ns, &[pod]).await?;
    // The claims name no node: checked against the fixture of the node the
    // scheduler chose (p5, the only GPU node the testbeds start, today).
    let on_a = node_of(tb, &kit::running(tb, ns, "all-on-root", RUNNING).await?)?;
    let devs = kit::pod_devices(tb, ns, "all-on-root").await?;
    let [gpus, efas] = [DriverKind::GpuTest, DriverKind::Efa].map(|k| of_driver(&devs, k));
    let on_root = (on_a.fixture.efas.iter()).filter(|e| e.pcie_root == "pci0000:44");
    ensure!(
        gpus.len() == 1 && efas.len() == on_root.count() && efas.len() == 4,
        "allocated {devs:?}"
    );
    ensure!(
        root_of(tb, &gpus[0]).await? == "pci0000:44",
        "GPU not on pci0000:44"
    );
    for e in &efas {
        ensure!(
            root_of(tb, e).await? == "pci0000:44",
            "{} not on pci0000:44",
            e.device
        );
    }
    check_efa_view(&on_a, &efas, &kit::probe(tb, ns, "all-on-root").await?)?;

    // b) count: 4 on whatever root has a free GPU.
    let count = kit::example(
        tb,
        &examples_dir().join("gpu-efa/gpu-efas-on-root-count.yaml"),
        None,
    )?;
    kit::apply_all(tb, ns, &count).await?;
    let pod = kit::pod_with_claim(
        tb,
        "count-on-root",
        Some("gpu-4-efas-same-root"),
        None,
        None,
    );
    kit::apply_all(tb, ns, &[pod]).await?;
    let on_b = node_of(tb, &kit::running(tb, ns, "count-on-root", RUNNING).await?)?;
    let devs = kit::pod_devices(tb, ns, "count-on-root").await?;
    let [gpus, efas] = [DriverKind::GpuTest, DriverKind::Efa].map(|k| of_driver(&devs, k));
    ensure!(gpus.len() == 1 && efas.len() == 4, "allocated {devs:?}");
    let root = root_of(tb, &gpus[0]).await?;
    ensure!(
        on_b.name != on_a.name || root != "pci0000:44",
        "second claim got the first one's root"
    );
    for e in &efas {
        ensure!(
            root_of(tb, e).await? == root,
            "{} not on the GPU's root {root}",
            e.device
        );
    }
    check_efa_view(&on_b, &efas, &kit::probe(tb, ns, "count-on-root").await?)?;

    // c) All without naming a root. On p5 that is all 32 EFAs plus the GPU:
    // more than the 32 results a claim may hold, and the scheduler says so.
    let any_root = all_variant(&all, "gpu-all-efas-any-root", None)?;
    kit::apply_all(tb, ns, &[any_root]).await?;
    let pod = kit::pod_with_claim(
        tb,
        "all-any-root",
        Some("gpu-all-efas-any-root"),
        None,
        None,
    );
    kit::apply_all(tb, ns, &[pod]).await?;
    let (reason, message, explained) = stays_pending(tb, ns, "all-any-root").await?;
    ensure!(
        message.contains("exceeds the claim limit of 32"),
        "scheduler said {reason}: {message}"
    );
    // A GPU node is closest; named only when there is one (`p5`, `chart-p5`).
    let gpu_nodes: Vec<String> = (tb.nodes().into_iter())
        .filter(|n| n.drivers.contains(&DriverKind::GpuTest))
        .map(|n| n.node_name)
        .collect();
    let closest = match gpu_nodes.as_slice() {
        [only] => format!("closest: node {only}"),
        _ => "closest: node ".to_owned(),
    };
    agreement::names_the_reason(
        "all-any-root",
        &explained,
        &[
            "matchAttribute constraint on resource.kubernetes.io/pcieRoot",
            closest.as_str(),
            "request \"efas\" has 4 of 32 (all matching devices)",
            "Request \"efas\" takes all matching devices",
        ],
    )?;
    // d) All over the 16 EFAs of NUMA node 0 (4 roots; 17 devices fit in a
    // claim): the pcieRoot constraint must hold for every one of them, so
    // no node satisfies it.
    let numa0 = all_variant(
        &all,
        "gpu-all-numa0-efas",
        Some(r#"device.attributes["resource.kubernetes.io"].?numaNode.orValue(-1) == 0"#),
    )?;
    kit::apply_all(tb, ns, &[numa0]).await?;
    let pod = kit::pod_with_claim(tb, "all-numa0", Some("gpu-all-numa0-efas"), None, None);
    kit::apply_all(tb, ns, &[pod]).await?;
    let (reason, message, explained) = stays_pending(tb, ns, "all-numa0").await?;
    ensure!(
        reason == "Unschedulable" && message.contains("cannot allocate all claims"),
        "scheduler said {reason}: {message}"
    );
    agreement::names_the_reason(
        "all-numa0",
        &explained,
        &[
            "matchAttribute constraint on resource.kubernetes.io/pcieRoot",
            "numaNode.orValue(-1) == 0",
            "(all matching devices)",
        ],
    )?;

    kit::delete_pods(
        tb,
        ns,
        &["all-on-root", "count-on-root", "all-any-root", "all-numa0"],
        GONE,
    )
    .await?;
    Ok(())
}

/// Scenario 5: `examples/neuron/neuron-{8,4,1,16}-chips-with-efas.yaml` on trn2.
pub async fn neuron_groups(tb: &impl Testbed, ns: &str) -> Result<()> {
    let trn2 = node(tb, "trn2")?;
    // 8 first: smaller claims first could split both 8-groups.
    for batch in [&[8u32, 4, 1][..], &[16]] {
        let mut pods = Vec::new();
        for n in batch {
            let file = examples_dir().join(format!("neuron/neuron-{n}-chips-with-efas.yaml"));
            let objs = kit::example(tb, &file, Some("trn2"))?;
            kit::apply_all(tb, ns, &objs).await?;
            let pod = format!("neuron-{n}-chips-with-efas");
            kit::running(tb, ns, &pod, RUNNING).await?;
            let devs = kit::pod_devices(tb, ns, &pod).await?;
            let [chips, efas] = [DriverKind::Neuron, DriverKind::Efa].map(|k| of_driver(&devs, k));
            ensure!(
                chips.len() == *n as usize && efas.len() == *n as usize,
                "{pod}: allocated {devs:?}"
            );
            let attr = format!("resource.aws.com/devicegroup{n}_id");
            let mut groups = BTreeSet::new();
            for d in chips.iter().chain(&efas) {
                let p = kit::published(tb, d).await?;
                groups.insert(
                    attr_str(&p, &attr).ok_or_else(|| anyhow!("{} lacks {attr}", d.device))?,
                );
            }
            ensure!(groups.len() == 1, "{pod}: {attr} values {groups:?}");
            let report = kit::probe(tb, ns, &pod).await?;
            let idx = check_neuron_view(&chips, &report)?;
            check_efa_view(&trn2, &efas, &report)?;
            let lnc: u32 = report
                .env
                .get("NEURON_LOGICAL_NC_CONFIG")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("{pod}: no NEURON_LOGICAL_NC_CONFIG: {:?}", report.env))?;
            ensure!(lnc == 2, "{pod}: trn2 default LNC is 2, got {lnc}");
            let want = visible_cores(&trn2, &idx, lnc)?;
            ensure!(
                report.env.get("NEURON_RT_VISIBLE_CORES") == Some(&want),
                "{pod}: NEURON_RT_VISIBLE_CORES={:?}, want {want}",
                report.env.get("NEURON_RT_VISIBLE_CORES")
            );
            pods.push(pod);
        }
        let names: Vec<&str> = pods.iter().map(String::as_str).collect();
        kit::delete_pods(tb, ns, &names, GONE).await?;
    }
    Ok(())
}

/// Scenario 6: 4 chips + 4 EFAs on trn1 (one EFA per 2 chips there).
pub async fn unsatisfiable_on_trn1(tb: &impl Testbed, ns: &str) -> Result<()> {
    tb.ensure_node(
        "trn1",
        "trn1.32xlarge",
        &[DriverKind::Efa, DriverKind::Neuron],
    )
    .await?;
    let objs = kit::example(
        tb,
        &examples_dir().join("neuron/neuron-4-chips-with-efas.yaml"),
        Some("trn1"),
    )?;
    kit::apply_all(tb, ns, &objs).await?;
    let (reason, message, explained) = stays_pending(tb, ns, "neuron-4-chips-with-efas").await?;
    ensure!(
        reason == "Unschedulable" && message.contains("cannot allocate all claims"),
        "scheduler said {reason}: {message}"
    );
    agreement::names_the_reason(
        "neuron-4-chips-with-efas",
        &explained,
        &[
            "matchAttribute constraint on resource.aws.com/devicegroup4_id",
            "request \"efas\" has 2 of 4",
        ],
    )?;
    // Control: with the 2 EFAs a trn1 4-group has, it runs there.
    let mut two = template_of(&objs)?;
    two["metadata"]["name"] = json!("trn1-4-chips-2-efas");
    for r in two["spec"]["spec"]["devices"]["requests"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if r["name"] == "efas" {
            r["exactly"]["count"] = json!(2);
        }
    }
    kit::apply_all(tb, ns, &[two]).await?;
    let pod = kit::pod_with_claim(
        tb,
        "trn1-4-chips-2-efas",
        Some("trn1-4-chips-2-efas"),
        None,
        Some("trn1"),
    );
    kit::apply_all(tb, ns, &[pod]).await?;
    kit::running(tb, ns, "trn1-4-chips-2-efas", RUNNING).await?;
    let devs = kit::pod_devices(tb, ns, "trn1-4-chips-2-efas").await?;
    ensure!(
        of_driver(&devs, DriverKind::Neuron).len() == 4
            && of_driver(&devs, DriverKind::Efa).len() == 2,
        "allocated {devs:?}"
    );
    kit::delete_pods(
        tb,
        ns,
        &["neuron-4-chips-with-efas", "trn1-4-chips-2-efas"],
        GONE,
    )
    .await?;
    Ok(())
}

/// The instance types a selector `….instanceType in ["a", "b"]` accepts
/// (the form of `examples/cel-selectors/neuron-by-instance-type.yaml`).
fn instance_types_in(expression: &str) -> Option<BTreeSet<String>> {
    let (_, rest) = expression.split_once("instanceType in [")?;
    let list = rest.split_once(']')?.0.split(',');
    list.map(|t| Some(t.trim().strip_prefix('"')?.strip_suffix('"')?.to_owned()))
        .collect()
}

/// The instance types the example's selector accepts, read from the file.
fn accepted_instance_types(objs: &[Value]) -> Result<BTreeSet<String>> {
    let t = template_of(objs)?;
    let requests = t["spec"]["spec"]["devices"]["requests"].as_array();
    (requests.into_iter().flatten())
        .flat_map(|r| r["exactly"]["selectors"].as_array().into_iter().flatten())
        .find_map(|s| instance_types_in(s["cel"]["expression"].as_str()?))
        .ok_or_else(|| anyhow!("no selector `instanceType in [...]` in the example"))
}

/// `examples/cel-selectors/*`: each template gets a pod; the allocated
/// devices satisfy the selector: only what it promises, never which node
/// they are on (kind's trn2u nodes match the instance-type example too).
pub async fn cel_selectors(tb: &impl Testbed, ns: &str) -> Result<()> {
    let dir = examples_dir().join("cel-selectors");
    let cases = [
        ("efa-by-numa-node.yaml", "efa-numa1"),
        ("neuron-by-instance-type.yaml", "neuron-on-trn2"),
        ("neuron-by-driver-version.yaml", "neuron-recent-driver"),
    ];
    let mut pods = Vec::new();
    for (file, template) in cases {
        let objs = kit::example(tb, &dir.join(file), None)?;
        let types = match template {
            "neuron-on-trn2" => accepted_instance_types(&objs)?,
            _ => BTreeSet::new(),
        };
        kit::apply_all(tb, ns, &objs).await?;
        let pod = format!("cel-{template}");
        kit::apply_all(
            tb,
            ns,
            &[kit::pod_with_claim(tb, &pod, Some(template), None, None)],
        )
        .await?;
        kit::running(tb, ns, &pod, RUNNING).await?;
        let devs = kit::pod_devices(tb, ns, &pod).await?;
        ensure!(!devs.is_empty(), "{pod}: nothing allocated");
        for a in &devs {
            let d = kit::published(tb, a).await?;
            match template {
                "efa-numa1" => ensure!(
                    kit::attr_int(&d, "resource.kubernetes.io/numaNode") == Some(1),
                    "{pod}: {} not on NUMA 1",
                    a.device
                ),
                "neuron-on-trn2" => ensure!(
                    attr_str(&d, "instanceType").is_some_and(|t| types.contains(&t)),
                    "{pod}: {} of {} has an instanceType outside {types:?}",
                    a.device,
                    a.pool
                ),
                "neuron-recent-driver" => ensure!(
                    attr_str(&d, "neuronDriverVersion").is_some_and(|v| v.starts_with("2.")),
                    "{pod}: {} neuronDriverVersion",
                    a.device
                ),
                other => bail!("{pod}: no check for template {other}"),
            }
        }
        pods.push(pod);
    }
    let names: Vec<&str> = pods.iter().map(String::as_str).collect();
    kit::delete_pods(tb, ns, &names, GONE).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_lists_merge_runs() {
        assert_eq!(range_list(vec![0, 1, 2, 3]), "0-3");
        assert_eq!(range_list(vec![8, 9, 0, 1]), "0-1,8-9");
        assert_eq!(range_list(vec![5]), "5");
        assert_eq!(range_list(vec![]), "");
    }

    /// s12 reads the accepted instance types from the example file, which
    /// must keep a form it can read.
    #[test]
    fn s12_reads_the_instance_types_of_its_example() {
        let file = examples_dir().join("cel-selectors/neuron-by-instance-type.yaml");
        let types = accepted_instance_types(&crate::manifests::read(&file).unwrap()).unwrap();
        let want = ["trn2.48xlarge", "trn2u.48xlarge"].map(String::from);
        assert_eq!(types, BTreeSet::from(want));
        let one = instance_types_in(r#"x.instanceType in [ "a.b" ]"#);
        assert_eq!(one, Some(BTreeSet::from(["a.b".to_owned()])));
        for other in [
            r#"x.instanceType == "a""#,
            "x.instanceType in []",
            "x.instanceType in [",
        ] {
            assert_eq!(instance_types_in(other), None, "{other}");
        }
    }
}
