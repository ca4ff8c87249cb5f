//! Scenario 21: a bad opaque config reaches the user as a pod event with
//! the driver's exact message, and leaves nothing on the node.
//!
//! The scheduler does not read opaque parameters, so it allocates the claim;
//! the driver refuses it at prepare time. The unit-level table of every bad
//! input is in `crates/{efa,neuron}-driver/tests/bad_input.rs`; this proves
//! the last step, kubelet turning our answer into the event, on a real
//! kubelet.

use std::time::Duration;

use anyhow::{Result, anyhow, ensure};
use serde_json::json;

use super::allocate::GONE;
use super::kit;
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, Testbed};

/// What the EFA driver answers for a NeuronConfig put under its own name.
const WANT: &str = "opaque config #0 (from ResourceClaim): field `apiVersion`: \
                    \"neuron.aws.com/v1\" is not an apiVersion of this driver (accepted values: \
                    \"efa.networking.k8s.aws/v1\"); a config meant for another driver must name \
                    that driver in `opaque.driver`";

pub async fn bad_opaque_config(tb: &impl Testbed, ns: &str) -> Result<()> {
    let objs = kit::example(tb, &examples_dir().join("efa/single-efa.yaml"), Some("p5"))?;
    let mut template = objs
        .into_iter()
        .find(|o| o["kind"] == "ResourceClaimTemplate")
        .ok_or_else(|| anyhow!("efa/single-efa.yaml has no template"))?;
    template["metadata"]["name"] = json!("efa-neuron-config");
    template["spec"]["spec"]["devices"]["config"] = json!([{
        "opaque": {
            "driver": "efa.networking.k8s.aws",
            "parameters": {
                "apiVersion": "neuron.aws.com/v1",
                "kind": "NeuronConfig",
                "logicalNeuronCore": 2,
            },
        },
    }]);
    kit::apply_all(tb, ns, &[template]).await?;
    let pod = kit::pod_with_claim(
        tb,
        "bad-config",
        Some("efa-neuron-config"),
        None,
        Some("p5"),
    );
    kit::apply_all(tb, ns, &[pod]).await?;

    let message = kit::wait_for(
        tb,
        "FailedPrepareDynamicResources on bad-config",
        Duration::from_secs(90),
        || async {
            Ok(kit::events(tb, ns, "bad-config")
                .await?
                .into_iter()
                .find(|(r, _)| r == "FailedPrepareDynamicResources")
                .map(|(_, m)| m))
        },
    )
    .await?;
    let claim = kit::pod_claims(tb, ns, "bad-config")
        .await?
        .pop()
        .ok_or_else(|| anyhow!("bad-config has no claim"))?;
    let name = claim.metadata.name.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    // kubelet wraps our text; ours is the claim and the whole reason.
    let ours = format!("ResourceClaim {ns}/{name}: {WANT}");
    ensure!(
        message.contains(&ours),
        "event message {message:?} lacks the driver's message {ours:?}"
    );

    let pod = kit::get_pod(tb, ns, "bad-config")
        .await?
        .ok_or_else(|| anyhow!("bad-config vanished"))?;
    let status = pod.status.unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    ensure!(phase == "Pending", "bad-config is {phase}, want Pending");
    ensure!(
        status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_none()),
        "a container of bad-config runs"
    );
    // Nothing half-prepared: no checkpoint entry, no CDI spec.
    let in_checkpoint = tb
        .checkpoint("p5", DriverKind::Efa)?
        .is_some_and(|c| c.claims.contains_key(&uid));
    let specs: Vec<String> = tb
        .cdi_spec_files("p5")?
        .into_iter()
        .filter(|f| f.contains(&uid))
        .collect();
    ensure!(
        !in_checkpoint && specs.is_empty(),
        "refused claim {uid} left behind: checkpoint entry {in_checkpoint}, CDI specs {specs:?}"
    );
    kit::delete_pods(tb, ns, &["bad-config"], GONE).await?;
    Ok(())
}
