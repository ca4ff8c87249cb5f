//! `cargo xtask bench scheduler --gang`: a gang of whole-node pods against
//! the same pods scheduled one by one (issue 50).
//!
//! Per repetition, on the shape's shadow fleet: a PodGroup
//! (`scheduling.k8s.io/v1beta1`, `schedulingPolicy.gang.minCount` = the
//! pod count, no topology constraint) and its pods, each naming it in
//! `spec.schedulingGroup` and holding its own claims of a whole node's
//! devices ([`whole_node_claims`]); and the same pods and claims with no
//! PodGroup. Each is timed from its first create (the PodGroup's for the
//! gang) to its last pod bound, as the claim phases are ([`super::phase`]);
//! the order of the two alternates between repetitions, and everything is
//! deleted (claims deallocated, PodGroup gone) before the next. The control
//! plane runs with `GenericWorkload` and its runtime-config on
//! ([`local_cluster::versions::opt_in`]), so 1.37 or later.
//!
//! Whether the API server kept the pods' `schedulingGroup` (it drops the
//! field with the gate off) is read back and reported, so a run where the
//! pods were not a gang cannot pass for one.

use std::time::Instant;

use futures::{StreamExt, TryStreamExt, stream};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

use super::claims::{ClaimKind, EFA_DRIVER, GPU_DRIVER, pod};
use super::phase::{BindWatch, CONCURRENCY, Subjects};
use super::report::{GangRun, GangTimes};
use super::shapes::Shape;
use crate::bench::rounds::kube_err;
use local_cluster::error::{Error, Result};

/// How the gang phase runs.
#[derive(Debug, Clone, Copy)]
pub struct GangOptions {
    /// Pods of the gang (its `minCount`), and of the independent set.
    pub pods: usize,
    /// Repetitions of each; the report gives every time and their median.
    pub repetitions: usize,
}

/// The most devices one claim's allocation may hold
/// (`resource.k8s.io/v1` `AllocationResultsMaxSize`; the scheduler refuses
/// a claim that would exceed it, as a scheduling error).
pub const CLAIM_DEVICE_LIMIT: u32 = 32;

/// One claim `name` of p5's GPUs `gpus` (indexes of requests), each with
/// the 4 EFAs of its PCIe root.
fn p5_claim(name: &str, gpus: std::ops::Range<u32>) -> Value {
    let mut requests = Vec::new();
    let mut constraints = Vec::new();
    for i in gpus {
        let (gpu, efas) = (format!("gpu{i}"), format!("efas{i}"));
        requests.push(json!({"name": gpu, "exactly": {"deviceClassName": GPU_DRIVER, "count": 1}}));
        requests
            .push(json!({"name": efas, "exactly": {"deviceClassName": EFA_DRIVER, "count": 4}}));
        constraints.push(json!({
            "requests": [gpu, efas],
            "matchAttribute": "resource.kubernetes.io/pcieRoot",
        }));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
    })
}

/// A whole node of `shape` as the claims of pod `pod` (`<pod>-<i>`), and a
/// name for them: p5's 8 GPUs, each with the 4 EFAs of its PCIe root, as
/// two claims of 4 GPUs and 16 EFAs (40 devices do not fit one claim,
/// [`CLAIM_DEVICE_LIMIT`]); trn2's 16 chips and 16 EFAs on one
/// `devicegroup16_id`; trn2u's whole-node device.
pub fn whole_node_claims(shape: Shape, pod: &str) -> (String, Vec<Value>) {
    let name = |i: usize| format!("{pod}-{i}");
    match shape {
        Shape::P5 => (
            "8gpu-32efa-by-pcieroot".into(),
            vec![p5_claim(&name(0), 0..4), p5_claim(&name(1), 4..8)],
        ),
        Shape::Trn2Cores | Shape::Trn2Chips | Shape::Trn2Aws => {
            let kind = ClaimKind::NeuronWithEfas {
                chips: 16,
                efas: 16,
            };
            (kind.name(), vec![kind.claim(&name(0))])
        }
        Shape::Trn2u => (
            ClaimKind::UltraServerNode.name(),
            vec![ClaimKind::UltraServerNode.claim(&name(0))],
        ),
    }
}

/// The PodGroup `name`: all `pods` pods bind together or none does.
pub fn pod_group(name: &str, pods: usize) -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": pods}}},
    })
}

/// The bench's pod `name` with its `claims` (one container uses them all),
/// a member of PodGroup `group` when there is one.
pub fn member(name: &str, claims: &[String], group: Option<&str>, selector: (&str, &str)) -> Value {
    let mut p = pod(name, "", selector);
    let refs: Vec<Value> = (claims.iter().enumerate())
        .map(|(i, c)| json!({"name": format!("c{i}"), "resourceClaimName": c}))
        .collect();
    let uses: Vec<Value> = (0..claims.len())
        .map(|i| json!({"name": format!("c{i}")}))
        .collect();
    p["spec"]["resourceClaims"] = json!(refs);
    p["spec"]["containers"][0]["resources"]["claims"] = json!(uses);
    if let Some(group) = group {
        p["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    }
    p
}

fn dynamic(s: &Subjects<'_>, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::namespaced_with(s.client.clone(), s.namespace, &ApiResource::from_gvk(&gvk))
}

fn to_object(what: &str, v: Value) -> Result<DynamicObject> {
    serde_json::from_value(v).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

/// Creates `objects` through `api`, [`CONCURRENCY`] at a time.
async fn create_all(api: &Api<DynamicObject>, objects: Vec<(String, Value)>) -> Result<()> {
    stream::iter(objects.into_iter().map(|(name, v)| {
        let api = api.clone();
        async move {
            let obj = to_object(&name, v)?;
            api.create(&PostParams::default(), &obj)
                .await
                .map_err(kube_err(format!("creating {name}")))
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    Ok(())
}

/// Runs the gang and the independent pods `options.repetitions` times each.
pub async fn run(s: &Subjects<'_>, shape: Shape, options: GangOptions) -> Result<GangRun> {
    let (claim_name, _) = whole_node_claims(shape, "x");
    let mut out = GangRun {
        claim: claim_name,
        pods: options.pods,
        repetitions: options.repetitions,
        scheduling_group_kept: true,
        gang: GangTimes::default(),
        independent: GangTimes::default(),
    };
    for rep in 0..options.repetitions {
        let order = if rep % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for gang in order {
            let (bind_s, bound, kept) = once(s, shape, options.pods, rep, gang).await?;
            eprintln!(
                "scheduler: {} {}, repetition {}: {bound}/{} bound in {bind_s:.2} s",
                shape.name(),
                if gang { "gang" } else { "independent" },
                rep + 1,
                options.pods
            );
            if gang {
                out.scheduling_group_kept &= kept;
                out.gang.push(bind_s, bound, options.pods);
            } else {
                out.independent.push(bind_s, bound, options.pods);
            }
        }
    }
    Ok(out)
}

/// One set of `pods` pods, as a gang or not: (seconds to the last bind,
/// pods bound, every pod kept its `schedulingGroup`).
async fn once(
    s: &Subjects<'_>,
    shape: Shape,
    pods: usize,
    rep: usize,
    gang: bool,
) -> Result<(f64, usize, bool)> {
    let prefix = format!("{}-r{rep}", if gang { "gang" } else { "solo" });
    let names: Vec<String> = (0..pods).map(|i| format!("{prefix}-{i:03}")).collect();
    let claims = dynamic(s, "resource.k8s.io", "v1", "ResourceClaim");
    let pods_api = dynamic(s, "", "v1", "Pod");
    let groups = dynamic(s, "scheduling.k8s.io", "v1beta1", "PodGroup");
    let mut claim_objects = Vec::new();
    let mut claim_names = Vec::new();
    for n in &names {
        let mut mine = Vec::new();
        for c in whole_node_claims(shape, n).1 {
            let name = c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            claim_objects.push((format!("claim {name}"), c));
            mine.push(name);
        }
        claim_names.push(mine);
    }
    create_all(&claims, claim_objects).await?;

    let mut watch = BindWatch::start(s.client, s.namespace).await?;
    let group = gang.then_some(prefix.as_str());
    let t0 = Instant::now();
    if let Some(group) = group {
        create_all(
            &groups,
            vec![(format!("PodGroup {group}"), pod_group(group, pods))],
        )
        .await?;
    }
    let pod_objects = (names.iter().zip(&claim_names))
        .map(|(n, c)| (format!("pod {n}"), member(n, c, group, s.selector)))
        .collect();
    create_all(&pods_api, pod_objects).await?;
    let bound = watch.wait(&names, t0 + s.timeout).await;
    drop(watch);
    let last = bound.values().max().map_or(t0, |t| *t);
    let bind_s = last.duration_since(t0).as_secs_f64();
    let mut kept = true;
    if let Some(group) = group {
        for n in &names {
            let p = pods_api
                .get(n)
                .await
                .map_err(kube_err(format!("reading pod {n}")))?;
            kept &= p.data["spec"]["schedulingGroup"]["podGroupName"] == group;
        }
    }
    super::phase::clean_up(s, Some(&groups)).await?;
    Ok((bind_s, bound.len(), kept))
}

#[cfg(test)]
#[path = "gang_tests.rs"]
mod tests;
