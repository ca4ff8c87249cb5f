//! Scenario 33: gang jobs on Trn2 UltraServers, placed by the real
//! kube-scheduler from PodGroups (`scheduling.k8s.io/v1beta1`, gang policy
//! and topology constraint), on shadow UltraServers.
//!
//! Three UltraServers of four shadow nodes (`shadow.rs`: Node objects no
//! kubelet serves), `shadow-u<S>-n<K>` for UltraServers 1-3 (server 0's ids
//! are the real `us-*` nodes'). Node K of each carries copies of the slices
//! our Neuron driver publishes on the real trn2u node `us-K` and those our
//! EFA driver publishes on `trn2` (the same hardware, trn2.48xlarge; no trn2u
//! node runs the EFA driver, and the `devicegroupN_id` values come from the
//! hardware alone, so they pair), and the UltraServer labels the Neuron
//! driver put on `us-K`, with UltraServer S's ids. Every pod asks for a
//! whole node: 16 chips and every EFA on one `devicegroup16_id`
//! (`examples/multi-node/ultraserver-gang.yaml`). A "holder" pod (one chip
//! and its EFA, `examples/neuron/neuron-1-chips-with-efas.yaml`) bound to a
//! node makes its UltraServer, or 2-node set, partly used.
//!
//! What it proves, in order: a gang of 5 on the 4-node id never binds, with
//! all 12 nodes free; with UltraServer 1 partly used, a gang of 4 binds to
//! one wholly free UltraServer, a second gang to the other, a third binds
//! nowhere (no pod bound, no claim allocated, although UltraServer 1 has 3
//! free nodes) until the holder goes, then to UltraServer 1; with 5 of the 6
//! 2-node sets partly used, a pair on the 2-node id binds to the free set, a
//! second binds nowhere (5 single free nodes) until a holder goes, then to
//! that set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ResourceExt,
};
use serde_json::{Value, json};

use super::kit;
use super::shadow;
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

/// The real UltraServer nodes whose Neuron slices and labels the shadow
/// nodes copy (the kind node list has them: scenario 27's).
const US_NODES: [(&str, &str); 4] = [
    ("us-0", "trn2u.48xlarge@node0"),
    ("us-1", "trn2u.48xlarge@node1"),
    ("us-2", "trn2u.48xlarge@node2"),
    ("us-3", "trn2u.48xlarge@node3-modes1_2_3"),
];
/// The shadow UltraServers' numbers (ids from `sysfs_fixtures::ultraserver_ids`).
const SERVERS: [u32; 3] = [1, 2, 3];
const ID_2: &str = "neuron.amazonaws.com/ultraserver-server-id-2";
const ID_4: &str = "neuron.amazonaws.com/ultraserver-server-id-4";
/// Labels of the real node a shadow node takes (besides the server ids).
const COPIED_LABELS: [&str; 4] = [
    "node.kubernetes.io/instance-type",
    "neuron.amazonaws.com/ultraserver-mode",
    "neuron.amazonaws.com/ultraserver-node-id-2",
    "neuron.amazonaws.com/ultraserver-node-id-4",
];
/// A gang that fits binds within this (the scheduler, no kubelet).
const BIND: Duration = Duration::from_secs(120);
/// A gang that does not fit is reported unschedulable within this.
const REFUSED: Duration = Duration::from_secs(90);
/// After the refusal: nothing may bind or be allocated in this time either.
const STILL: Duration = Duration::from_secs(5);
const GONE: Duration = Duration::from_secs(60);

fn shadow_name(server: u32, node: u32) -> String {
    format!("shadow-u{server}-n{node}")
}

fn pod_groups(tb: &impl Testbed, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup");
    Api::namespaced_with(tb.client(), ns, &ApiResource::from_gvk(&gvk))
}

/// The objects of the gang example, and the holder example.
struct Manifests {
    group: Value,
    template: Value,
    pod: Value,
    holder: Vec<Value>,
}

impl Manifests {
    fn read(tb: &impl Testbed) -> Result<Self> {
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

/// Scenario 33 (see the module docs).
pub async fn ultraserver_gangs(tb: &impl Testbed, ns: &str) -> Result<()> {
    for (name, fixture) in US_NODES {
        tb.ensure_node(name, fixture, &[DriverKind::Neuron]).await?;
    }
    let manifests = Manifests::read(tb)?;
    let result = async {
        let layout = create_ultraservers(tb).await?;
        kit::apply_all(tb, ns, std::slice::from_ref(&manifests.template)).await?;
        let holder_template: Vec<Value> = (manifests.holder.iter())
            .filter(|o| o["kind"] == "ResourceClaimTemplate")
            .cloned()
            .collect();
        ensure!(
            holder_template.len() == 1,
            "neuron-1-chips-with-efas.yaml: want one ResourceClaimTemplate"
        );
        kit::apply_all(tb, ns, &holder_template).await?;
        let run = Run {
            tb,
            ns,
            manifests: &manifests,
            layout: &layout,
        };
        run.too_large().await?;
        run.groups_of_4().await?;
        run.pairs().await
    }
    .await;
    let cleanup = cleanup(tb, ns).await;
    result?;
    cleanup
}

/// Shadow node name → (server, node index, server id 2, server id 4).
type Layout = BTreeMap<String, (u32, u32, String, String)>;

/// The 12 shadow nodes with their slices and labels.
async fn create_ultraservers(tb: &impl Testbed) -> Result<Layout> {
    let nodes: Api<Node> = Api::all(tb.client());
    let trn2 = kit::node_name(tb, "trn2");
    let efa = DriverKind::Efa.driver_name();
    let neuron = DriverKind::Neuron.driver_name();
    let mut layout = Layout::new();
    for (k, (real, _)) in US_NODES.iter().enumerate() {
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

struct Run<'a, T: Testbed> {
    tb: &'a T,
    ns: &'a str,
    manifests: &'a Manifests,
    layout: &'a Layout,
}

impl<T: Testbed> Run<'_, T> {
    /// Creates PodGroup `name` and its `size` pods on `key`; returns the pod names.
    async fn start_gang(&self, name: &str, size: usize, key: &str) -> Result<Vec<String>> {
        let (group, pods) = self.manifests.gang(name, size, key);
        kit::apply_all(self.tb, self.ns, &[group]).await?;
        kit::apply_all(self.tb, self.ns, &pods).await?;
        Ok((0..size).map(|i| format!("{name}-{i}")).collect())
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
        kit::apply_all(self.tb, self.ns, &[pod]).await?;
        let bound = self.bound(std::slice::from_ref(&name), BIND).await?;
        ensure!(
            bound[&name] == node,
            "holder {name} bound to {}",
            bound[&name]
        );
        Ok(name)
    }

    /// Waits until every pod of `pods` is bound; pod → node.
    async fn bound(&self, pods: &[String], timeout: Duration) -> Result<BTreeMap<String, String>> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let started = Instant::now();
        let out = kit::wait_for(self.tb, &format!("{pods:?} bound"), timeout, || async {
            let mut out = BTreeMap::new();
            for p in pods {
                let node = (api.get(p).await?.spec).and_then(|s| s.node_name);
                let Some(node) = node else { return Ok(None) };
                out.insert(p.clone(), node);
            }
            Ok(Some(out))
        })
        .await?;
        eprintln!(
            "aws-dra-e2e: {pods:?} bound in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(out)
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
            let devices = kit::pod_devices(self.tb, self.ns, pod).await?;
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

    /// The gang's pods are reported unschedulable, and for a while after,
    /// none is bound and none of their claims is allocated.
    async fn refused(&self, pods: &[String]) -> Result<String> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let started = Instant::now();
        let why = kit::wait_for(
            self.tb,
            &format!("{pods:?} unschedulable"),
            REFUSED,
            || async {
                let mut why = None;
                for p in pods {
                    let pod = api.get(p).await?;
                    match kit::unschedulable(&pod) {
                        Some((reason, message)) => why = Some(format!("{reason}: {message}")),
                        None => return Ok(None),
                    }
                }
                Ok(why)
            },
        )
        .await?;
        tokio::time::sleep(STILL).await;
        let bound: Vec<String> = self.bound_now(pods).await?;
        let allocated = self.allocated_claims(pods).await?;
        ensure!(
            bound.is_empty() && allocated.is_empty(),
            "a gang that does not fit: pods bound {bound:?}, claims allocated {allocated:?}"
        );
        eprintln!(
            "aws-dra-e2e: {pods:?} unschedulable after {:.1}s, none bound and no claim \
             allocated {}s later; the scheduler said {why:?}",
            started.elapsed().as_secs_f64() - STILL.as_secs_f64(),
            STILL.as_secs()
        );
        Ok(why)
    }

    async fn bound_now(&self, pods: &[String]) -> Result<Vec<String>> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let mut out = Vec::new();
        for p in pods {
            if let Some(node) = (api.get(p).await?.spec).and_then(|s| s.node_name) {
                out.push(format!("{p} on {node}"));
            }
        }
        Ok(out)
    }

    /// Allocated claims owned by any of `pods` (every claim of the
    /// namespace is read, so a claim generated late is seen too).
    async fn allocated_claims(&self, pods: &[String]) -> Result<Vec<String>> {
        let claims: Api<ResourceClaim> = Api::namespaced(self.tb.client(), self.ns);
        let mut seen = 0;
        let mut out = Vec::new();
        for c in claims.list(&ListParams::default()).await?.items {
            let owned = (c.owner_references().iter()).any(|o| pods.contains(&o.name));
            if !owned {
                continue;
            }
            seen += 1;
            if !kit::allocation(&c).is_empty() {
                out.push(c.name_any());
            }
        }
        ensure!(
            seen == pods.len(),
            "{} claims owned by {pods:?}, want one each",
            seen
        );
        Ok(out)
    }

    /// Deletes pods at once (no kubelet confirms) and waits until gone.
    async fn delete_now(&self, pods: &[String]) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.tb.client(), self.ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        for p in pods {
            api.delete(p, &now)
                .await
                .with_context(|| format!("deleting {p}"))?;
        }
        kit::wait_for(self.tb, &format!("{pods:?} gone"), GONE, || async {
            for p in pods {
                if api.get_opt(p).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await
    }

    /// A gang of 5 on the 4-node id: all 12 nodes free, never binds.
    async fn too_large(&self) -> Result<()> {
        let pods = self.start_gang("big", 5, ID_4).await?;
        self.refused(&pods).await?;
        self.delete_now(&pods).await
    }

    /// Groups of 4 with UltraServer 1 partly used.
    async fn groups_of_4(&self) -> Result<()> {
        let holder = self.hold(&shadow_name(1, 0)).await?;
        let id4 = |s: u32| sysfs_fixtures::ultraserver_ids(s, 0).1;
        let mut used = BTreeSet::new();
        let mut all = Vec::new();
        for gang in ["g4a", "g4b"] {
            let pods = self.start_gang(gang, 4, ID_4).await?;
            let placed = self.bound(&pods, BIND).await?;
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
        self.refused(&pods)
            .await
            .context("g4c, no UltraServer wholly free")?;
        self.delete_now(std::slice::from_ref(&holder)).await?;
        let placed = self
            .bound(&pods, BIND)
            .await
            .context("g4c once UltraServer 1 freed")?;
        let set = self.check_together(&placed, ID_4).await.context("g4c")?;
        ensure!(
            set == id4(1),
            "g4c not on the freed UltraServer 1: {placed:?}"
        );
        all.extend(pods);
        self.delete_now(&all).await
    }

    /// Pairs on the 2-node id, with 5 of the 6 sets partly used.
    async fn pairs(&self) -> Result<()> {
        let mut holders = BTreeMap::new();
        for (server, node) in [(1, 0), (1, 2), (2, 0), (2, 2), (3, 0)] {
            holders.insert((server, node), self.hold(&shadow_name(server, node)).await?);
        }
        let free = sysfs_fixtures::ultraserver_ids(3, 2).0;
        let pods = self.start_gang("p2a", 2, ID_2).await?;
        let placed = self.bound(&pods, BIND).await?;
        let set = self.check_together(&placed, ID_2).await.context("p2a")?;
        ensure!(
            set == free,
            "p2a not on the one free pair (u3 n2+n3): {placed:?}"
        );
        let mut all = pods;
        let pods = self.start_gang("p2b", 2, ID_2).await?;
        self.refused(&pods)
            .await
            .context("p2b, no pair wholly free")?;
        let freed = holders.remove(&(2, 2)).unwrap_or_default();
        self.delete_now(&[freed]).await?;
        let placed = self
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
        self.delete_now(&all).await
    }
}

/// Pods, then PodGroups (their protection finalizer goes once no pod
/// names them), then the shadow nodes and slices.
async fn cleanup(tb: &impl Testbed, ns: &str) -> Result<()> {
    let pods = shadow::remove(tb, ns, GONE).await;
    let groups = pod_groups(tb, ns);
    let deleted = async {
        groups
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .context("deleting the PodGroups")?;
        kit::wait_for(tb, &format!("the PodGroups of {ns} gone"), GONE, || async {
            Ok(groups
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await
    }
    .await;
    pods.and(deleted)
}
