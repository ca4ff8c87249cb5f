//! The real-kubelet phase of scenario 33: a PodGroup gang of four
//! whole-node pods on the four trn2u kubelets `us-0`…`us-3` (scenario 27's
//! UltraServer 0), each claim the node's `neuronnode` with
//! `UltraServerConfig` mode 4 (`examples/aws-neuron/ultraserver-node.yaml`'s
//! template), the PodGroup and the pods those of
//! `examples/multi-node/ultraserver-gang.yaml`. Here the containers start:
//! every one must see the UltraServer variables the Neuron runtime reads,
//! checked as scenario 27 checks its group of 4.
//!
//! It removes what it made whether it passed or not, the pods with their
//! grace period (the kubelets stop them and our driver unprepares), then
//! the generated claims and the PodGroup, so that a later scenario finds
//! the `us-*` nodes idle.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ResourceExt};
use serde_json::{Value, json};

use super::super::aws_claims;
use super::super::{kit, shadow};
use super::binding::{Gangs, ID_4, pod_groups};
use super::ultraservers::Manifests;
use crate::host_env::examples_dir;
use crate::testbed::Testbed;

const GROUP: &str = "us0-job";
/// Bound, prepared and started by four kubelets.
const RUNNING: Duration = Duration::from_secs(180);
/// Stopped by the kubelets and unprepared, claims and PodGroup gone.
const GONE: Duration = Duration::from_secs(120);

/// Phase 1 of scenario 33 (see the module docs); the `us-*` kubelets are
/// started by the caller.
pub async fn gang_on_kubelets(tb: &impl Testbed, ns: &str, gang: &Manifests) -> Result<()> {
    // The labels and whole-node devices of us-0…us-3, checked as in s27.
    let ids = aws_claims::ultraserver_ids(tb).await?;
    let aws = kit::example(
        tb,
        &examples_dir().join("aws-neuron/ultraserver-node.yaml"),
        None,
    )?;
    let template = (aws.iter())
        .find(|o| o["kind"] == "ResourceClaimTemplate")
        .ok_or_else(|| anyhow!("ultraserver-node.yaml has no template"))?;
    let template_name = template["metadata"]["name"].clone();
    ensure!(
        gang.group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
            && gang.group["spec"]["schedulingConstraints"]["topology"][0]["key"] == ID_4,
        "ultraserver-gang.yaml's PodGroup is no longer a gang of 4 on {ID_4}: {}",
        gang.group
    );
    let mut group = gang.group.clone();
    group["metadata"]["name"] = json!(GROUP);
    let pods: Vec<Value> = (0..4)
        .map(|i| {
            let mut pod = gang.pod.clone();
            pod["metadata"]["name"] = json!(format!("{GROUP}-{i}"));
            pod["spec"]["schedulingGroup"]["podGroupName"] = json!(GROUP);
            pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template_name.clone();
            // Real nodes only: shadow UltraServers carry copies of the
            // whole-node devices (none exist yet in this phase, but one
            // left behind by an aborted run must not take a pod).
            pod["spec"]["affinity"] = json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": shadow::LABEL, "operator": "DoesNotExist"}]}
            ]}}});
            pod
        })
        .collect();
    let names: Vec<String> = (0..4).map(|i| format!("{GROUP}-{i}")).collect();
    let result = async {
        kit::apply_all(tb, ns, std::slice::from_ref(template)).await?;
        let started = Instant::now();
        let gangs = Gangs { tb, ns };
        gangs.start(group, pods).await?;
        let placed = gangs.bound(&names, RUNNING).await?;
        for name in &names {
            kit::running(tb, ns, name, RUNNING).await?;
        }
        let running = started.elapsed().as_secs_f64();
        let mut members = Vec::new();
        for name in &names {
            members.push(aws_claims::whole_node_member(tb, ns, name).await?);
        }
        let used: BTreeSet<&String> = placed.values().collect();
        let servers: BTreeSet<&String> = (used.iter())
            .map(|n| ids.get(*n).map(|(_, id4)| id4))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("a pod on a node that is not us-*: {placed:?}"))?;
        ensure!(
            used.len() == 4 && servers.len() == 1,
            "the gang on {placed:?}, UltraServers {servers:?}: want each us-* node once"
        );
        aws_claims::check_group_of_4(&members, &ids).context("the PodGroup gang on us-*")?;
        eprintln!(
            "aws-dra-e2e: PodGroup {GROUP} on the kubelets {used:?} (UltraServer {servers:?}): \
             all 4 Running {running:.1}s after creation, each with its node's neuronnode and \
             NEURON_RT_ULTRASERVER_{{SERVER_ID,NODE_ID 0-3,MODE=1}}"
        );
        Ok(())
    }
    .await;
    let cleanup = remove(tb, ns, &names).await;
    result?;
    cleanup
}

/// The pods (with their grace period), then their generated claims and the
/// PodGroup; each waited for.
async fn remove(tb: &impl Testbed, ns: &str, pods: &[String]) -> Result<()> {
    let refs: Vec<&str> = pods.iter().map(String::as_str).collect();
    kit::delete_pods(tb, ns, &refs, GONE).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    kit::wait_for(
        tb,
        &format!("the claims of {pods:?} gone"),
        GONE,
        || async {
            let left = (claims.list(&ListParams::default()).await?.items.iter())
                .any(|c| (c.owner_references().iter()).any(|o| pods.contains(&o.name)));
            Ok((!left).then_some(()))
        },
    )
    .await?;
    let groups = pod_groups(tb, ns);
    match groups.delete(GROUP, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e).context(format!("deleting PodGroup {GROUP}")),
    }
    kit::wait_for(tb, &format!("PodGroup {GROUP} gone"), GONE, || async {
        Ok(groups.get_opt(GROUP).await?.is_none().then_some(()))
    })
    .await
}
