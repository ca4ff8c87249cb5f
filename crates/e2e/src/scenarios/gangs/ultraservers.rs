//! The shadow UltraServers of scenario 33: three UltraServers of four
//! shadow nodes, and gangs of 5, of 4 and of 2 whole trn2u nodes on them
//! (the module docs of `gangs` say what each proves).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};

use super::super::aws_claims::ULTRASERVER;
use super::super::{kit, shadow};
use super::binding::{BIND, Gangs, ID_2, ID_4};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

/// The shadow UltraServers' numbers (ids from `sysfs_fixtures::ultraserver_ids`;
/// server 0's are the real `us-*` nodes').
const SERVERS: [u32; 3] = [1, 2, 3];
/// Labels of the real node a shadow node takes (besides the server ids).
const COPIED_LABELS: [&str; 4] = [
    "node.kubernetes.io/instance-type",
    "neuron.amazonaws.com/ultraserver-mode",
    "neuron.amazonaws.com/ultraserver-node-id-2",
    "neuron.amazonaws.com/ultraserver-node-id-4",
];

fn shadow_name(server: u32, node: u32) -> String {
    format!("shadow-u{server}-n{node}")
}

/// The objects of the gang example, and the holder example.
pub struct Manifests {
    pub group: Value,
    pub template: Value,
    pub pod: Value,
    holder: Vec<Value>,
}

impl Manifests {
    pub fn read(tb: &impl Testbed) -> Result<Self> {
        let gang = kit::example(
            tb,
            &examples_dir().join("multi-node/ultraserver-gang.yaml"),
            None,
        )?;
        let find = |kind: &str| {
            gang.iter()
                .find(|o| o["kind"] == kind)
                .cloned()
                .ok_or_else(|| anyhow!("ultraserver-gang.yaml has no {kind}"))
        };
        let holder = kit::example(
            tb,
            &examples_dir().join("neuron/neuron-1-chips-with-efas.yaml"),
            None,
        )?;
        Ok(Manifests {
            group: find("PodGroup")?,
            template: find("ResourceClaimTemplate")?,
            pod: find("Pod")?,
            holder,
        })
    }

    /// Applies the claim templates of the gang and of the holder.
    pub async fn apply_templates(&self, tb: &impl Testbed, ns: &str) -> Result<()> {
        let holder_template: Vec<Value> = (self.holder.iter())
            .filter(|o| o["kind"] == "ResourceClaimTemplate")
            .cloned()
            .collect();
        ensure!(
            holder_template.len() == 1,
            "neuron-1-chips-with-efas.yaml: want one ResourceClaimTemplate"
        );
        kit::apply_all(tb, ns, std::slice::from_ref(&self.template)).await?;
        kit::apply_all(tb, ns, &holder_template).await
    }

    /// PodGroup `name` of `size` on label `key`, and its pods `name-0…`,
    /// pinned to shadow nodes.
    fn gang(&self, name: &str, size: usize, key: &str) -> (Value, Vec<Value>) {
        let mut group = self.group.clone();
        group["metadata"]["name"] = json!(name);
        group["spec"]["schedulingPolicy"]["gang"]["minCount"] = json!(size);
        group["spec"]["schedulingConstraints"]["topology"] = json!([{ "key": key }]);
        let pods = (0..size)
            .map(|i| {
                let mut pod = self.pod.clone();
                pod["metadata"]["name"] = json!(format!("{name}-{i}"));
                pod["spec"]["schedulingGroup"]["podGroupName"] = json!(name);
                shadow::pin_to_shadows(&mut pod);
                pod
            })
            .collect();
        (group, pods)
    }
}

/// Shadow node name → (server, node index, server id 2, server id 4).
pub type Layout = BTreeMap<String, (u32, u32, String, String)>;

/// The 12 shadow nodes with their slices and labels.
pub async fn create_ultraservers(tb: &impl Testbed) -> Result<Layout> {
    let nodes: Api<Node> = Api::all(tb.client());
    let trn2 = kit::node_name(tb, "trn2");
    let efa = DriverKind::Efa.driver_name();
    let neuron = DriverKind::Neuron.driver_name();
    let mut layout = Layout::new();
    for (k, (real, _)) in ULTRASERVER.iter().enumerate() {
        let real = kit::node_name(tb, real);
        // The Neuron driver labels its Node once it has read the UltraServer
        // files: wait for that, as scenario 27 does.
        let labels = kit::wait_for(
            tb,
            &format!("UltraServer labels on {real}"),
            Duration::from_secs(60),
            || async {
                let labels = nodes.get(&real).await?.metadata.labels.unwrap_or_default();
                Ok(labels.contains_key(ID_4).then_some(labels))
            },
        )
        .await?;
        for server in SERVERS {
            let name = shadow_name(server, k as u32);
            let (id2, id4) = sysfs_fixtures::ultraserver_ids(server, k as u32);
            let mut own: BTreeMap<String, String> = (COPIED_LABELS.iter())
                .filter_map(|l| labels.get(*l).map(|v| (l.to_string(), v.clone())))
                .collect();
            own.insert(ID_2.into(), id2.clone());
            own.insert(ID_4.into(), id4.clone());
            let copied =
                shadow::create_from(tb, &name, &own, &[(&real, neuron), (&trn2, efa)]).await?;
            ensure!(
                copied >= 2,
                "{name}: copied {copied} slices of {real} ({neuron}) and {trn2} ({efa}), \
                 want at least one of each"
            );
            layout.insert(name, (server, k as u32, id2, id4));
        }
    }
    Ok(layout)
}

/// The shadow phases, on the UltraServers of `layout`.
pub struct Run<'a, T: Testbed> {
    pub gangs: Gangs<'a, T>,
    pub manifests: &'a Manifests,
    pub layout: &'a Layout,
}

impl<T: Testbed> Run<'_, T> {
    /// Creates PodGroup `name` and its `size` pods on `key`; returns the pod names.
    async fn start_gang(&self, name: &str, size: usize, key: &str) -> Result<Vec<String>> {
        let (group, pods) = self.manifests.gang(name, size, key);
        self.gangs.start(group, pods).await
    }

    /// A holder pod (one chip and its EFA) bound to shadow node `node`.
    async fn hold(&self, node: &str) -> Result<String> {
        let mut pod = (self.manifests.holder.iter())
            .find(|o| o["kind"] == "Pod")
            .cloned()
            .ok_or_else(|| anyhow!("the holder example has no pod"))?;
        let name = format!("holder-{node}");
        pod["metadata"]["name"] = json!(name);
        shadow::pin_to_shadows(&mut pod);
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = json!(node);
        kit::apply_all(self.gangs.tb, self.gangs.ns, &[pod]).await?;
        let bound = self.gangs.bound(std::slice::from_ref(&name), BIND).await?;
        ensure!(
            bound[&name] == node,
            "holder {name} bound to {}",
            bound[&name]
        );
        Ok(name)
    }

    /// The gang's pods are bound to distinct nodes of one set (the same
    /// value of `key`: 2-node or 4-node id), each claim holding 16 chips and
    /// EFAs of its own node only. Returns the set's value.
    async fn check_together(&self, placed: &BTreeMap<String, String>, key: &str) -> Result<String> {
        let mut sets = BTreeSet::new();
        let nodes: BTreeSet<&String> = placed.values().collect();
        ensure!(
            nodes.len() == placed.len(),
            "two pods on one node: {placed:?}"
        );
        for (pod, node) in placed {
            let (_, _, id2, id4) = (self.layout.get(node))
                .ok_or_else(|| anyhow!("{pod} on {node}, not a shadow UltraServer node"))?;
            sets.insert(if key == ID_2 {
                id2.clone()
            } else {
                id4.clone()
            });
            let devices = kit::pod_devices(self.gangs.tb, self.gangs.ns, pod).await?;
            let chips = (devices.iter())
                .filter(|d| d.driver == DriverKind::Neuron.driver_name())
                .count();
            let efas = (devices.iter())
                .filter(|d| d.driver == DriverKind::Efa.driver_name())
                .count();
            ensure!(
                chips == 16 && efas > 0 && devices.iter().all(|d| &d.pool == node),
                "{pod} on {node} was allocated {devices:?}"
            );
        }
        ensure!(sets.len() == 1, "the gang spans sets {sets:?}: {placed:?}");
        Ok(sets.into_iter().next().unwrap_or_default())
    }

    /// A gang of 5 on the 4-node id: all 12 nodes free, never binds.
    pub async fn too_large(&self) -> Result<()> {
        let pods = self.start_gang("big", 5, ID_4).await?;
        self.gangs.refused(&pods, 1).await?;
        self.gangs.delete_now(&pods).await
    }

    /// Groups of 4 with UltraServer 1 partly used.
    pub async fn groups_of_4(&self) -> Result<()> {
        let holder = self.hold(&shadow_name(1, 0)).await?;
        let id4 = |s: u32| sysfs_fixtures::ultraserver_ids(s, 0).1;
        let mut used = BTreeSet::new();
        let mut all = Vec::new();
        for gang in ["g4a", "g4b"] {
            let pods = self.start_gang(gang, 4, ID_4).await?;
            let placed = self.gangs.bound(&pods, BIND).await?;
            let set = self.check_together(&placed, ID_4).await.context(gang)?;
            ensure!(
                set != id4(1),
                "{gang} bound to the partly used UltraServer 1: {placed:?}"
            );
            ensure!(
                used.insert(set.clone()),
                "{gang} bound to an UltraServer in use: {placed:?}"
            );
            all.extend(pods);
        }
        let pods = self.start_gang("g4c", 4, ID_4).await?;
        self.gangs
            .refused(&pods, 1)
            .await
            .context("g4c, no UltraServer wholly free")?;
        self.gangs.delete_now(std::slice::from_ref(&holder)).await?;
        let placed = self
            .gangs
            .bound(&pods, BIND)
            .await
            .context("g4c once UltraServer 1 freed")?;
        let set = self.check_together(&placed, ID_4).await.context("g4c")?;
        ensure!(
            set == id4(1),
            "g4c not on the freed UltraServer 1: {placed:?}"
        );
        all.extend(pods);
        self.gangs.delete_now(&all).await
    }

    /// Pairs on the 2-node id, with 5 of the 6 sets partly used.
    pub async fn pairs(&self) -> Result<()> {
        let mut holders = BTreeMap::new();
        for (server, node) in [(1, 0), (1, 2), (2, 0), (2, 2), (3, 0)] {
            holders.insert((server, node), self.hold(&shadow_name(server, node)).await?);
        }
        let free = sysfs_fixtures::ultraserver_ids(3, 2).0;
        let pods = self.start_gang("p2a", 2, ID_2).await?;
        let placed = self.gangs.bound(&pods, BIND).await?;
        let set = self.check_together(&placed, ID_2).await.context("p2a")?;
        ensure!(
            set == free,
            "p2a not on the one free pair (u3 n2+n3): {placed:?}"
        );
        let mut all = pods;
        let pods = self.start_gang("p2b", 2, ID_2).await?;
        self.gangs
            .refused(&pods, 1)
            .await
            .context("p2b, no pair wholly free")?;
        let freed = holders.remove(&(2, 2)).unwrap_or_default();
        self.gangs.delete_now(&[freed]).await?;
        let placed = self
            .gangs
            .bound(&pods, BIND)
            .await
            .context("p2b once u2 n2 freed")?;
        let set = self.check_together(&placed, ID_2).await.context("p2b")?;
        let want = sysfs_fixtures::ultraserver_ids(2, 2).0;
        ensure!(
            set == want,
            "p2b not on the freed pair (u2 n2+n3): {placed:?}"
        );
        all.extend(pods);
        all.extend(holders.into_values());
        self.gangs.delete_now(&all).await
    }
}
