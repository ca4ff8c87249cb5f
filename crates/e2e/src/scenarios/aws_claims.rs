//! Claims written for AWS's Neuron DRA driver, unchanged, on ours (26), and
//! Trn2 UltraServers (27): four trn2u kubelets of one UltraServer, groups of
//! 4 and of 2 pods each on one set with consistent ids, and the clear
//! refusal of a mode a node does not support.
//!
//! The pods here carry the required pod affinity on the UltraServer label
//! themselves: at the scheduler, that is what LeaderWorkerSet's
//! `exclusive-topology` annotation becomes (its webhook writes it into each
//! pod of a group). LeaderWorkerSet itself, built from its Go module, runs
//! the same group in the long run `cargo xtask lws` (`long_runs::lws`),
//! which reuses the checks below (hence `pub`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};

use super::kit::{self, attr_int, attr_str};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

const RUNNING: Duration = Duration::from_secs(120);
const GONE: Duration = Duration::from_secs(90);

fn aws_example(name: &str) -> std::path::PathBuf {
    examples_dir().join("aws-neuron").join(name)
}

/// The one pod of an example.
fn pod_name(objs: &[Value]) -> Result<String> {
    objs.iter()
        .find(|o| o["kind"] == "Pod")
        .and_then(|p| p["metadata"]["name"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("example without a pod"))
}

/// Scenario 26: every claim shape of `examples/aws-neuron` (as AWS's Neuron
/// DRA examples write them) runs on trn2 and gets what it asked for.
pub async fn aws_neuron_claims(tb: &impl Testbed, ns: &str) -> Result<()> {
    let published = kit::devices(tb, "trn2", DriverKind::Neuron).await?;
    ensure!(
        (0..16).all(|i| published.contains_key(&format!("neurondevice{i}"))),
        "trn2 does not publish AWS's device names neurondevice0..15: {:?}",
        published.keys().collect::<Vec<_>>()
    );
    // (file, chips, LNC, what else the allocation must satisfy)
    type Check = fn(&[(String, BTreeMap<String, i64>)]) -> Result<()>;
    let any: Check = |_| Ok(());
    let row: Check = |d| {
        let rows: BTreeSet<i64> = d.iter().map(|(_, a)| a["topology4_id"]).collect();
        ensure!(rows.len() == 1, "not one row: {d:?}");
        Ok(())
    };
    let second_half: Check = |d| {
        ensure!(
            d.iter()
                .all(|(_, a)| a["topology8_id"] == 1 && a["deviceId"] >= 8),
            "not chips 8-15: {d:?}"
        );
        Ok(())
    };
    let cases: [(&str, usize, &str, Check); 4] = [
        ("one-device.yaml", 1, "2", any),
        ("four-devices-one-row.yaml", 4, "1", row),
        ("eight-devices-second-half.yaml", 8, "2", second_half),
        ("all-devices.yaml", 16, "2", any),
    ];
    for (file, chips, lnc, check) in cases {
        let objs = kit::example(tb, &aws_example(file), Some("trn2"))?;
        let pod = pod_name(&objs)?;
        kit::apply_all(tb, ns, &objs).await?;
        kit::running(tb, ns, &pod, RUNNING)
            .await
            .with_context(|| format!("examples/aws-neuron/{file}"))?;
        let allocated = kit::pod_devices(tb, ns, &pod).await?;
        ensure!(allocated.len() == chips, "{file}: allocated {allocated:?}");
        let mut devs = Vec::new();
        for a in &allocated {
            let d = kit::published(tb, a).await?;
            ensure!(
                attr_str(&d, "resourceType").as_deref() == Some("neuron_device"),
                "{file}: {} is not a chip",
                a.device
            );
            let ints: BTreeMap<String, i64> = ["deviceId", "topology4_id", "topology8_id"]
                .into_iter()
                .filter_map(|k| Some((k.to_owned(), attr_int(&d, k)?)))
                .collect();
            ensure!(
                ints.len() == 3,
                "{file}: {} lacks AWS's attributes",
                a.device
            );
            devs.push((a.device.clone(), ints));
        }
        check(&devs).with_context(|| format!("examples/aws-neuron/{file}"))?;
        let report = kit::probe(tb, ns, &pod).await?;
        let nodes = report.devices_with_prefix("/dev/neuron");
        ensure!(nodes.len() == chips, "{file}: the container sees {nodes:?}");
        ensure!(
            report
                .env
                .get("NEURON_LOGICAL_NC_CONFIG")
                .map(String::as_str)
                == Some(lnc),
            "{file}: NEURON_LOGICAL_NC_CONFIG={:?}, want {lnc}",
            report.env.get("NEURON_LOGICAL_NC_CONFIG")
        );
        kit::delete_pods(tb, ns, &[&pod], GONE).await?;
    }
    Ok(())
}

/// The 4 nodes of the UltraServer: fixture names and testbed node names.
/// Node 3 lacks the 1-node mode (its `ultraserver_mode` is `1,2,3`), for the
/// refusal.
pub const ULTRASERVER: [(&str, &str); 4] = [
    ("us-0", "trn2u.48xlarge@node0"),
    ("us-1", "trn2u.48xlarge@node1"),
    ("us-2", "trn2u.48xlarge@node2"),
    ("us-3", "trn2u.48xlarge@node3-modes1_2_3"),
];

const LABEL_SERVER_ID_2: &str = "neuron.amazonaws.com/ultraserver-server-id-2";
const LABEL_SERVER_ID_4: &str = "neuron.amazonaws.com/ultraserver-server-id-4";

/// A claim template for the whole node with `UltraServerConfig{mode}`.
fn node_template(name: &str, mode: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "node", "exactly": {
                "deviceClassName": "neuron.aws.com", "count": 1,
                "selectors": [{"cel": {"expression":
                    "device.attributes[\"neuron.aws.com\"].resourceType == \"neuron_node\""}}]}}],
            "config": [{"requests": ["node"], "opaque": {"driver": "neuron.aws.com", "parameters":
                {"apiVersion": "neuron.aws.com/v1", "kind": "UltraServerConfig", "ultraserverMode": mode}}}]
        }}}
    })
}

/// A pod of group `group` that must share `topology_key` with the group:
/// `base` (the example's pod, adapted) renamed, relabelled and pointed at
/// `template`.
fn group_pod(base: &Value, name: &str, template: &str, group: &str, topology_key: &str) -> Value {
    let mut pod = base.clone();
    pod["metadata"] = json!({"name": name, "labels": {"ultraserver-group": group}});
    pod["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": topology_key, "labelSelector": {"matchLabels": {"ultraserver-group": group}}}
    ]}});
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = json!(template);
    pod
}

/// A pod of an UltraServer group: its node and the `NEURON_*` variables
/// its container saw.
pub type Member = (String, BTreeMap<String, String>);

/// Runs a group of `size` pods on `template` (a whole-node claim template,
/// applied first), one at a time as a LeaderWorkerSet creates them, and
/// returns each pod's node and Neuron variables.
async fn run_group(
    tb: &impl Testbed,
    ns: &str,
    group: &str,
    size: usize,
    template: &Value,
    base_pod: &Value,
    topology_key: &str,
) -> Result<Vec<Member>> {
    let template_name = template["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("template without a name"))?
        .to_owned();
    kit::apply_all(tb, ns, std::slice::from_ref(template)).await?;
    let mut out = Vec::new();
    for k in 0..size {
        let name = format!("{group}-{k}");
        let pod = group_pod(base_pod, &name, &template_name, group, topology_key);
        kit::apply_all(tb, ns, &[pod]).await?;
        kit::running(tb, ns, &name, RUNNING).await?;
        out.push(whole_node_member(tb, ns, &name).await?);
    }
    Ok(out)
}

/// A running pod of an UltraServer group, with a whole-node claim: its
/// node, after checking that the claim holds that node's `neuronnode` and
/// the container sees every chip, and the `NEURON_*` variables it saw.
pub async fn whole_node_member(tb: &impl Testbed, ns: &str, name: &str) -> Result<Member> {
    let pod = kit::get_pod(tb, ns, name)
        .await?
        .ok_or_else(|| anyhow!("{name} is gone"))?;
    let node = pod
        .spec
        .and_then(|s| s.node_name)
        .ok_or_else(|| anyhow!("{name} runs on no node"))?;
    let allocated = kit::pod_devices(tb, ns, name).await?;
    ensure!(
        allocated.len() == 1 && allocated[0].device == "neuronnode" && allocated[0].pool == node,
        "{name}: allocated {allocated:?}, want the whole-node device of {node}"
    );
    let report = kit::probe(tb, ns, name).await?;
    let chips = report.devices_with_prefix("/dev/neuron");
    ensure!(chips.len() == 16, "{name} sees {chips:?}, want every chip");
    let env: BTreeMap<String, String> = report
        .env
        .into_iter()
        .filter(|(k, _)| k.starts_with("NEURON_"))
        .collect();
    Ok((node, env))
}

/// A group of 4 (mode 4) as the Neuron runtime expects it: 4 distinct
/// nodes, one `NEURON_RT_ULTRASERVER_SERVER_ID` that is a 4-node id of
/// `ids`, node ids 0-3 and `NEURON_RT_ULTRASERVER_MODE=1` in every pod.
pub fn check_group_of_4(group: &[Member], ids: &BTreeMap<String, (String, String)>) -> Result<()> {
    let nodes: BTreeSet<&str> = group.iter().map(|(n, _)| n.as_str()).collect();
    ensure!(nodes.len() == 4, "group of 4 on {nodes:?}");
    let server = env_values(group, "NEURON_RT_ULTRASERVER_SERVER_ID");
    let node_ids = env_values(group, "NEURON_RT_ULTRASERVER_NODE_ID");
    ensure!(
        server.len() == 1
            && server.iter().all(|s| ids.values().any(|(_, id4)| id4 == s))
            && node_ids == BTreeSet::from(["0", "1", "2", "3"])
            && group
                .iter()
                .all(|(_, e)| e.get("NEURON_RT_ULTRASERVER_MODE").map(String::as_str) == Some("1")),
        "group of 4 sees {group:?}"
    );
    Ok(())
}

/// The values of the variable `key` across the pods of a group (`""` for a
/// pod without it).
fn env_values<'a>(group: &'a [Member], key: &str) -> BTreeSet<&'a str> {
    group
        .iter()
        .map(|(_, e)| e.get(key).map_or("", String::as_str))
        .collect()
}

/// Starts the 4 kubelets of [`ULTRASERVER`] (Neuron driver only) unless
/// they run already; scenarios 27 and 33 share them.
pub async fn start_ultraserver(tb: &impl Testbed) -> Result<()> {
    for (name, fixture) in ULTRASERVER {
        tb.ensure_node(name, fixture, &[DriverKind::Neuron]).await?;
    }
    Ok(())
}

/// Scenario 27: a Trn2 UltraServer of 4 kubelets.
pub async fn ultraserver(tb: &impl Testbed, ns: &str) -> Result<()> {
    start_ultraserver(tb).await?;
    let ids = ultraserver_ids(tb).await?;
    ultraserver_groups(tb, ns, &ids).await
}

/// The 4 kubelets of [`ULTRASERVER`] (started by the caller), each checked
/// for its whole-node device and its Node's labels, with the fixture's ids:
/// testbed node name → (server id 2, server id 4).
pub async fn ultraserver_ids(tb: &impl Testbed) -> Result<BTreeMap<String, (String, String)>> {
    let nodes_api: Api<Node> = Api::all(tb.client());
    let mut ids: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (k, (name, _)) in ULTRASERVER.iter().enumerate() {
        let node_name = kit::node_name(tb, name);
        let labels = kit::wait_for(
            tb,
            &format!("UltraServer labels on {node_name}"),
            Duration::from_secs(60),
            || async {
                let node = nodes_api.get(&node_name).await?;
                let labels = node.metadata.labels.unwrap_or_default();
                Ok(labels.contains_key(LABEL_SERVER_ID_4).then_some(labels))
            },
        )
        .await?;
        let (id2, id4) = sysfs_fixtures::ultraserver_ids(0, k as u32);
        ensure!(
            labels.get(LABEL_SERVER_ID_4) == Some(&id4)
                && labels.get(LABEL_SERVER_ID_2) == Some(&id2)
                && labels.get("neuron.amazonaws.com/ultraserver-node-id-4") == Some(&k.to_string()),
            "{node_name}: labels {labels:?}, want server ids {id2}/{id4}, node {k}"
        );
        let devices = kit::devices(tb, name, DriverKind::Neuron).await?;
        let whole = devices
            .get("neuronnode")
            .ok_or_else(|| anyhow!("{node_name} publishes no neuronnode"))?;
        ensure!(
            attr_str(whole, "ultraserverServerId4").as_deref() == Some(id4.as_str())
                && attr_int(whole, "ultraserverNodeId4") == Some(k as i64),
            "{node_name}: neuronnode attributes {:?}",
            whole.attributes
        );
        ids.insert(node_name, (id2, id4));
    }
    Ok(ids)
}

/// The groups of scenario 27, on the nodes of `ids`.
async fn ultraserver_groups(
    tb: &impl Testbed,
    ns: &str,
    ids: &BTreeMap<String, (String, String)>,
) -> Result<()> {
    // A group of 4 from examples/aws-neuron/ultraserver-node.yaml (its
    // template asks for mode 4): one UltraServer, every node once, ids
    // 0-3, mode X4.
    let example = kit::example(tb, &aws_example("ultraserver-node.yaml"), None)?;
    let template = example
        .iter()
        .find(|o| o["kind"] == "ResourceClaimTemplate")
        .ok_or_else(|| anyhow!("ultraserver-node.yaml has no template"))?;
    let base_pod = example
        .iter()
        .find(|o| o["kind"] == "Pod")
        .ok_or_else(|| anyhow!("ultraserver-node.yaml has no pod"))?;
    let group = run_group(tb, ns, "g4", 4, template, base_pod, LABEL_SERVER_ID_4).await?;
    check_group_of_4(&group, ids)?;
    let names: Vec<String> = (0..4).map(|k| format!("g4-{k}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    kit::delete_pods(tb, ns, &names, GONE).await?;

    // Two groups of 2: each on one 2-node set (same server_id_2), ids 0-1,
    // the vertical pair's mode (every node supports X2V).
    let mut sets = BTreeSet::new();
    for g in ["g2a", "g2b"] {
        let template = node_template(&format!("{g}-node"), 2);
        let group = run_group(tb, ns, g, 2, &template, base_pod, LABEL_SERVER_ID_2).await?;
        let server = group
            .iter()
            .map(|(n, _)| {
                ids.get(n)
                    .map(|(id2, _)| id2.clone())
                    .ok_or_else(|| anyhow!("{g}: a pod on {n}, not an UltraServer node"))
            })
            .collect::<Result<BTreeSet<String>>>()?;
        ensure!(server.len() == 1, "{g} spans 2-node sets: {group:?}");
        let env_ids = env_values(&group, "NEURON_RT_ULTRASERVER_SERVER_ID");
        let node_ids = env_values(&group, "NEURON_RT_ULTRASERVER_NODE_ID");
        ensure!(
            env_ids
                .iter()
                .copied()
                .eq(server.iter().map(String::as_str))
                && node_ids == BTreeSet::from(["0", "1"])
                && group.iter().all(|(_, e)| e
                    .get("NEURON_RT_ULTRASERVER_MODE")
                    .map(String::as_str)
                    == Some("3")),
            "{g} sees {group:?}"
        );
        sets.extend(server);
    }
    ensure!(sets.len() == 2, "the two groups of 2 share a set: {sets:?}");
    kit::delete_pods(tb, ns, &["g2a-0", "g2a-1", "g2b-0", "g2b-1"], GONE).await?;

    // A 1-node workload on the node without the 1-node mode: our message.
    kit::apply_all(tb, ns, &[node_template("g1-node", 1)]).await?;
    let pod = kit::pod_with_claim(tb, "g1-on-us-3", Some("g1-node"), None, Some("us-3"));
    kit::apply_all(tb, ns, &[pod]).await?;
    let message = kit::wait_for(
        tb,
        "FailedPrepareDynamicResources on g1-on-us-3",
        Duration::from_secs(90),
        || async {
            Ok(kit::events(tb, ns, "g1-on-us-3")
                .await?
                .into_iter()
                .find(|(r, _)| r == "FailedPrepareDynamicResources")
                .map(|(_, m)| m))
        },
    )
    .await?;
    ensure!(
        message.contains("ultraserverMode 1: a set of 1 node is not supported on this node")
            && message.contains("supported here: 2, 4"),
        "g1-on-us-3: {message}"
    );
    kit::delete_pods(tb, ns, &["g1-on-us-3"], GONE).await?;
    Ok(())
}
