//! Scenario 33: gang jobs placed by the real kube-scheduler from PodGroups
//! (`scheduling.k8s.io/v1beta1`, gang policy, topology constraint): on the
//! real trn2u kubelets, on shadow Trn2 UltraServers and on shadow p5 nodes.
//!
//! 1. Real kubelets (`real_kubelets.rs`): the PodGroup of
//!    `examples/multi-node/ultraserver-gang.yaml` (gang of 4 on the 4-node
//!    id) with four whole-node pods (`neuronnode`, `UltraServerConfig` mode
//!    4) on `us-0`…`us-3`, scenario 27's UltraServer: all four Running, one
//!    per node, on one UltraServer, each container with the runtime's
//!    UltraServer variables. Removed before the next phase.
//! 2. Shadow UltraServers (`ultraservers.rs`): three UltraServers of four
//!    shadow nodes (`shadow.rs`: Node objects no kubelet serves),
//!    `shadow-u<S>-n<K>` for UltraServers 1-3. Node K of each carries
//!    copies of the slices our Neuron driver publishes on the real trn2u
//!    node `us-K` and those our EFA driver publishes on `trn2` (the same
//!    hardware, trn2.48xlarge; no trn2u node runs the EFA driver, and the
//!    `devicegroupN_id` values come from the hardware alone, so they pair),
//!    and the UltraServer labels the Neuron driver put on `us-K`, with
//!    UltraServer S's ids. Every pod asks for a whole node: 16 chips and
//!    every EFA on one `devicegroup16_id` (the example's template). A
//!    "holder" pod (one chip and its EFA,
//!    `examples/neuron/neuron-1-chips-with-efas.yaml`) bound to a node makes
//!    its UltraServer, or 2-node set, partly used. In order: a gang of 5 on
//!    the 4-node id never binds, with all 12 nodes free; with UltraServer 1
//!    partly used, a gang of 4 binds to one wholly free UltraServer, a
//!    second gang to the other, a third binds nowhere (no pod bound, no
//!    claim allocated, although UltraServer 1 has 3 free nodes) until the
//!    holder goes, then to UltraServer 1; with 5 of the 6 2-node sets partly
//!    used, a pair on the 2-node id binds to the free set, a second binds
//!    nowhere (5 single free nodes) until a holder goes, then to that set.
//! 3. Shadow p5 nodes (`p5.rs`): `examples/multi-node/efa-p5-job.yaml`, a
//!    gang of 4 whole p5.48xlarge nodes (8 GPUs with the EFAs of their PCIe
//!    roots), binds nowhere while one of the 4 p5 nodes is partly used, and
//!    on all 4 once it is free.

mod binding;
mod p5;
mod real_kubelets;
mod ultraservers;

use anyhow::{Context, Result};
use kube::api::{DeleteParams, ListParams};

use super::aws_claims;
use super::{kit, shadow};
use crate::testbed::Testbed;
use binding::{GONE, Gangs, pod_groups};
use ultraservers::{Manifests, Run, create_ultraservers};

/// Scenario 33 (see the module docs).
pub async fn ultraserver_gangs(tb: &impl Testbed, ns: &str) -> Result<()> {
    aws_claims::start_ultraserver(tb).await?;
    let manifests = Manifests::read(tb)?;
    let result = async {
        real_kubelets::gang_on_kubelets(tb, ns, &manifests)
            .await
            .context("phase 1, real kubelets")?;
        let layout = create_ultraservers(tb).await?;
        manifests.apply_templates(tb, ns).await?;
        let run = Run {
            gangs: Gangs { tb, ns },
            manifests: &manifests,
            layout: &layout,
        };
        run.too_large().await?;
        run.groups_of_4().await?;
        run.pairs().await.context("phase 2, shadow UltraServers")?;
        p5::p5_job(tb, ns).await.context("phase 3, shadow p5 nodes")
    }
    .await;
    let cleanup = cleanup(tb, ns).await;
    result?;
    cleanup
}

/// Pods, then PodGroups (their protection finalizer goes once no pod
/// names them), then the shadow nodes and slices. Phase 1 has removed its
/// pods from the real kubelets itself, with their grace period.
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
