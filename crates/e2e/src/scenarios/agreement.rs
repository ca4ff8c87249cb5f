//! `kubectl dra explain` against what kube-scheduler did, for every pod the
//! scenarios make.
//!
//! The seam: `kit::running` and `allocate::stays_pending` call
//! [`check_pod`] once the scheduler has decided about a pod, and
//! `scenarios::run` calls [`check_namespace`] over the pods a scenario left
//! before they are removed. The explanation comes from the library behind
//! the `kubectl-dra` binary, reading the live cluster the way the binary
//! does (`online::fetch`: slices, classes, claims, nodes, DeviceTaintRules,
//! the namespace's templates and the pod). Agreement means:
//!
//! - pod bound to a node: every claim of it is allocated, and each
//!   allocation still satisfies its claim under our CEL and constraint
//!   evaluation (the explanation lists no problems);
//! - pod reported Unschedulable: at least one of its claims is not
//!   allocatable now. When every claim looks allocatable the scheduler may
//!   not have retried since devices were freed, so it gets [`RETRY`] to
//!   bind the pod; still Pending then, or `Unknown` from us, is a
//!   disagreement.
//!
//! A disagreement fails the scenario with both sides and the whole
//! explanation. This module reads the cluster itself (no `kit` helpers),
//! since `kit` calls it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kubectl_dra::explain::{self, Allocatable, Explanation};
use kubectl_dra::{online, render, world::World};

use crate::testbed::Testbed;

/// How long the scheduler gets to bind a Pending pod that we find allocatable.
pub const RETRY: Duration = Duration::from_secs(30);

/// What the scheduler has decided about a pod.
enum Decision {
    Bound(String),
    Unschedulable(String),
    Undecided,
}

fn decision(pod: &Pod) -> Decision {
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        return Decision::Bound(node);
    }
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .map_or(Decision::Undecided, |c| {
            Decision::Unschedulable(format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            ))
        })
}

/// The pod as read with its explanations, from one snapshot of the cluster.
async fn explain_pod(
    tb: &impl Testbed,
    ns: &str,
    pod: &str,
) -> Result<Option<(Pod, Vec<Explanation>)>> {
    let inv = online::fetch(&tb.client(), ns, Some(pod))
        .await
        .context("kubectl-dra reading the cluster")?;
    let Some(p) = inv.pod(ns, pod).cloned() else {
        return Ok(None);
    };
    let world = World::new(&inv);
    let (subjects, scope) = explain::subjects_for_pod(&inv, ns, pod)
        .with_context(|| format!("kubectl-dra finding the claims of {ns}/{pod}"))?;
    let reports = subjects
        .iter()
        .map(|s| explain::explain(&world, s, &scope))
        .collect();
    Ok(Some((p, reports)))
}

/// Everything `kubectl dra explain pod` prints for these reports.
pub fn text(reports: &[Explanation]) -> String {
    reports.iter().map(render::explanation).collect()
}

/// Checks that kubectl-dra agrees with the scheduler about `pod`, waiting
/// up to [`RETRY`] for a decision; returns the rendered explanation.
pub async fn check_pod(tb: &impl Testbed, ns: &str, pod: &str) -> Result<String> {
    let deadline = Instant::now() + RETRY;
    loop {
        let (p, reports) = explain_pod(tb, ns, pod)
            .await?
            .ok_or_else(|| anyhow!("pod {ns}/{pod} is gone"))?;
        let explained = text(&reports);
        let late = Instant::now() > deadline;
        match decision(&p) {
            Decision::Bound(node) => {
                let wrong: Vec<&Explanation> = reports
                    .iter()
                    .filter(|e| e.allocatable != Allocatable::Allocated || !e.problems.is_empty())
                    .collect();
                if wrong.is_empty() {
                    return Ok(explained);
                }
                bail!(
                    "kubectl dra explain disagrees with kube-scheduler about {ns}/{pod}: the \
                     scheduler bound it to {node}, but {} of its claims are not allocated or \
                     their allocation does not satisfy the claim:\n{explained}{}",
                    wrong.len(),
                    tb.logs_hint()
                );
            }
            Decision::Unschedulable(why) => {
                if reports.iter().any(|e| e.allocatable == Allocatable::No) {
                    return Ok(explained);
                }
                if late {
                    bail!(
                        "kubectl dra explain disagrees with kube-scheduler about {ns}/{pod}: the \
                         scheduler keeps it Pending ({why}) after {RETRY:?}, but explain finds no \
                         claim of it unallocatable:\n{explained}{}",
                        tb.logs_hint()
                    );
                }
            }
            Decision::Undecided if late => bail!(
                "kube-scheduler did not decide about {ns}/{pod} within {RETRY:?}; {}",
                tb.logs_hint()
            ),
            Decision::Undecided => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// [`check_pod`] for every pod of `ns` the scheduler has decided about
/// (pods being deleted, and pods it has not tried yet, are left out);
/// returns how many were checked.
pub async fn check_namespace(tb: &impl Testbed, ns: &str) -> Result<usize> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    let mut checked = 0;
    for p in pods.list(&ListParams::default()).await?.items {
        if p.metadata.deletion_timestamp.is_some() || matches!(decision(&p), Decision::Undecided) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        check_pod(tb, ns, &name).await?;
        checked += 1;
    }
    Ok(checked)
}

/// Fails unless `explained` contains every one of `words`: the key words a
/// reader acts on (the selector, the constraint, the holding claim, the taint).
pub fn names_the_reason(pod: &str, explained: &str, words: &[&str]) -> Result<()> {
    let missing: Vec<&&str> = words.iter().filter(|w| !explained.contains(**w)).collect();
    if missing.is_empty() {
        println!("    kubectl dra explain pod {pod}:\n{explained}");
        Ok(())
    } else {
        bail!("kubectl dra explain on {pod} does not name {missing:?}:\n{explained}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_must_name_every_key_word() {
        let text = "Verdict: Not allocatable: the matchAttribute constraint on resource.kubernetes.io/pcieRoot cannot be met";
        assert!(names_the_reason("p", text, &["matchAttribute", "pcieRoot"]).is_ok());
        let err = names_the_reason("p", text, &["pcieRoot", "devicegroup4_id"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("devicegroup4_id") && !err.contains("\"pcieRoot\""),
            "{err}"
        );
    }

    #[test]
    fn decisions_follow_node_name_and_the_scheduled_condition() {
        let pod = |v: serde_json::Value| -> Pod { serde_json::from_value(v).unwrap() };
        let bound = pod(serde_json::json!({"spec": {"nodeName": "p5", "containers": []}}));
        assert!(matches!(decision(&bound), Decision::Bound(n) if n == "p5"));
        let pending = pod(
            serde_json::json!({"spec": {"containers": []}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "cannot allocate all claims"}]}}),
        );
        assert!(
            matches!(decision(&pending), Decision::Unschedulable(w) if w == "Unschedulable: cannot allocate all claims")
        );
        let fresh = pod(serde_json::json!({"spec": {"containers": []}}));
        assert!(matches!(decision(&fresh), Decision::Undecided));
    }
}
