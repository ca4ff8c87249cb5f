//! Scenario 20: kubectl-dra's CEL against the real kube-scheduler, in one
//! batch, and the reason it gives for a device another claim holds.
//!
//! 1. CEL differential: every selector expression below goes, in one batch,
//!    into its own claim (`allocationMode: All`, `adminAccess: true`, so
//!    that the claims do not compete for devices) with its own pod, pinned
//!    to the [`shadow`] nodes (copies of every node's slices, no kubelet:
//!    the pods are allocated by the real scheduler but never run). Where
//!    the scheduler allocates, our evaluation must select exactly the
//!    devices it allocated on that node; where it does not, ours must find
//!    no device on any node, or a runtime error; and `explain`'s verdict must
//!    be allocatable / not allocatable accordingly. An expression the API
//!    server refuses never reaches the scheduler: kubectl-dra must call it an
//!    invalid selector for that release, and must accept every other one.
//!    One that kubectl-dra cannot decide is a failure. The selectors are in
//!    `data/cel-selectors.txt` (at least 200).
//! 2. Holding claim: every trn2 EFA held by one claim, a second claim wants
//!    one of them: Pending, and explain names the holder.
//!
//! The other Pending cases (4 chips + 4 EFAs on trn1, All across roots,
//! taints) are checked where their scenarios make them, through
//! [`super::agreement`], which also checks every pod of this one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubectl_dra::cel::{Environment, Outcome, Release, Selector};
use kubectl_dra::explain::{self, Allocatable, Scope, Subject};
use kubectl_dra::online;
use kubectl_dra::world::World;
use serde_json::json;

use super::agreement;
use super::allocate::stays_pending;
use super::kit;
use super::shadow;
use crate::testbed::{DriverKind, Testbed};

const EFA: &str = "efa.networking.k8s.aws";
const NEURON: &str = "neuron.aws.com";
const GPU: &str = "gpu.nvidia.com";

/// The selectors of the differential test, one per line (see the file's
/// header): kept as data so that adding a case is adding a line.
const SELECTORS: &str = include_str!("../../data/cel-selectors.txt");

/// At least this many selectors, so that every function of every library
/// of the DRA environment is covered.
const MIN_SELECTORS: usize = 200;

/// (DeviceClass, expression) of each line of [`SELECTORS`].
fn expressions() -> Result<Vec<(&'static str, String)>> {
    let mut out = Vec::new();
    for (n, line) in SELECTORS.lines().enumerate() {
        let line = line.trim_end();
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((class, expr)) = line.split_once(char::is_whitespace) else {
            bail!(
                "cel-selectors.txt line {}: no expression after the class",
                n + 1
            );
        };
        let class = match class {
            "efa" => EFA,
            "neuron" => NEURON,
            "gpu" => GPU,
            other => bail!(
                "cel-selectors.txt line {}: class {other:?} is not efa, neuron or gpu",
                n + 1
            ),
        };
        out.push((class, expand(expr.trim_start())));
    }
    Ok(out)
}

fn expand(expr: &str) -> String {
    expr.replace(r#"["E"]"#, r#"["efa.networking.k8s.aws"]"#)
        .replace(r#"["N"]"#, r#"["neuron.aws.com"]"#)
        .replace(r#"["K"]"#, r#"["resource.kubernetes.io"]"#)
        .replace(r#"["A"]"#, r#"["resource.aws.com"]"#)
}

const SETTLE: Duration = Duration::from_secs(300);

/// What the scheduler did with a pod's claims: allocated (node, devices), or not.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    Allocated(String, BTreeSet<String>),
    Pending(String),
}

async fn scheduler_result(tb: &impl Testbed, ns: &str, pod: &str) -> Result<Option<Placed>> {
    let Some(p) = kit::get_pod(tb, ns, pod).await? else {
        return Ok(None);
    };
    if let Some((reason, message)) = kit::unschedulable(&p) {
        return Ok(Some(Placed::Pending(format!("{reason}: {message}"))));
    }
    let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(None);
    };
    let Ok(claims) = kit::pod_claims(tb, ns, pod).await else {
        return Ok(None);
    };
    let mut devices = BTreeSet::new();
    for c in &claims {
        let allocated = kit::allocation(c);
        if allocated.is_empty() {
            return Ok(None);
        }
        devices.extend(
            allocated
                .into_iter()
                .map(|a| format!("{}/{}/{}", a.driver, a.pool, a.device)),
        );
    }
    Ok(Some(Placed::Allocated(node, devices)))
}

/// Our selection, per node, of `class` + `expression`; `Err` on a runtime
/// error anywhere (which stops the scheduler) or an expression we cannot do.
fn our_selection(
    world: &World,
    class: &str,
    expression: &str,
) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let class_selectors: Vec<Selector> = world
        .inventory
        .class(class)
        .ok_or_else(|| format!("no DeviceClass {class}"))?
        .spec
        .selectors
        .iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref())
        .map(|c| Selector::compile(&c.expression))
        .collect();
    let selector = Selector::compile(expression);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    'devices: for d in &world.devices {
        for s in class_selectors.iter().chain(std::iter::once(&selector)) {
            match d.evaluate(&world.env, s) {
                Outcome::Match => {}
                Outcome::NoMatch => continue 'devices,
                Outcome::RuntimeError(e) => return Err(format!("runtime error on {}: {e}", d.id)),
                Outcome::Invalid(e) => return Err(format!("INVALID: {e}")),
                Outcome::Unsupported(e) => return Err(format!("UNSUPPORTED on {}: {e}", d.id)),
            }
        }
        out.entry(d.node.unwrap_or("").to_string())
            .or_default()
            .insert(d.id.to_string());
    }
    Ok(out)
}

/// Creates every claim and pod of the batch; returns the expressions the
/// API server refused, by index.
async fn create_batch(
    tb: &impl Testbed,
    ns: &str,
    expressions: &[(&str, String)],
) -> Result<BTreeMap<usize, String>> {
    // Admin access needs the namespace label.
    let namespaces: Api<Namespace> = Api::all(tb.client());
    namespaces
        .patch(
            ns,
            &PatchParams::apply("e2e-cel-agreement"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})),
        )
        .await
        .context("labelling the namespace for admin access")?;
    let mut refused = BTreeMap::new();
    for (i, (class, expr)) in expressions.iter().enumerate() {
        let name = format!("cel-{i:03}");
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": class, "allocationMode": "All", "adminAccess": true,
                "selectors": [{"cel": {"expression": expr}}],
            }}]}},
        });
        if let Err(e) = kit::apply_all(tb, ns, &[claim]).await {
            refused.insert(i, format!("{e:#}"));
            continue;
        }
        let mut pod = kit::pod_with_claim(tb, &name, None, Some(&name), None);
        shadow::pin_to_shadows(&mut pod);
        kit::apply_all(tb, ns, &[pod]).await?;
    }
    Ok(refused)
}

async fn cel_differential(tb: &impl Testbed, ns: &str) -> Result<()> {
    let started = Instant::now();
    let expressions = expressions()?;
    if expressions.len() < MIN_SELECTORS {
        bail!(
            "cel-selectors.txt has {} selectors, fewer than {MIN_SELECTORS}",
            expressions.len()
        );
    }
    let version = tb
        .client()
        .apiserver_version()
        .await
        .context("asking the API server its version")?;
    let release: Release = version
        .git_version
        .parse()
        .with_context(|| format!("the API server is {}", version.git_version))?;
    let refused = create_batch(tb, ns, &expressions).await?;
    let compared = expressions.len() - refused.len();
    let mut placed: BTreeMap<usize, Placed> = BTreeMap::new();
    while placed.len() < compared {
        for i in 0..expressions.len() {
            if !placed.contains_key(&i)
                && !refused.contains_key(&i)
                && let Some(p) = scheduler_result(tb, ns, &format!("cel-{i:03}")).await?
            {
                placed.insert(i, p);
            }
        }
        if started.elapsed() > SETTLE {
            // What the undecided pods looked like, for the log reader.
            let mut undecided = Vec::new();
            for i in (0..expressions.len())
                .filter(|i| !placed.contains_key(i) && !refused.contains_key(i))
            {
                let name = format!("cel-{i:03}");
                let pod = kit::get_pod(tb, ns, &name).await.ok().flatten();
                let node = pod
                    .as_ref()
                    .and_then(|p| p.spec.as_ref()?.node_name.clone());
                let conditions = pod
                    .as_ref()
                    .and_then(|p| p.status.as_ref()?.conditions.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| format!("{}={} {}", c.type_, c.status, c.reason.unwrap_or_default()))
                    .collect::<Vec<_>>();
                let claims = kit::pod_claims(tb, ns, &name).await.map(|cs| {
                    cs.iter()
                        .map(|c| kit::allocation(c).len())
                        .collect::<Vec<_>>()
                });
                undecided.push(format!(
                    "{name}: node {node:?}, conditions {conditions:?}, allocated devices per claim {claims:?}"
                ));
            }
            bail!(
                "after {SETTLE:?} the scheduler had decided {} of {} CEL pods; undecided: {undecided:?}; {}",
                placed.len(),
                compared,
                tb.logs_hint()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let inv = online::fetch(&tb.client(), ns, None)
        .await
        .context("kubectl-dra reading the cluster")?;
    let mut world = World::new(&inv);
    world.env = Environment::for_release(release);
    let mut failures = Vec::new();
    let mut undecided = 0;
    for (i, (class, expr)) in expressions.iter().enumerate() {
        // Refused by the API server: ours must call it invalid for this
        // release, and accepted ones must not be.
        let invalid = Selector::compile(expr).invalid(release);
        match (refused.get(&i), &invalid) {
            (Some(_), Some(_)) => continue,
            (Some(theirs), None) => {
                failures.push(format!(
                    "#{i} [{class}] {expr}\n    API server of {release}: refused: {theirs}\n    ours: valid"
                ));
                continue;
            }
            (None, Some(ours)) => {
                failures.push(format!(
                    "#{i} [{class}] {expr}\n    API server of {release}: accepted\n    ours: invalid: {ours}"
                ));
                continue;
            }
            (None, None) => {}
        }
        let Some(theirs) = placed.get(&i) else {
            continue;
        };
        let ours = our_selection(&world, class, expr);
        if ours.as_ref().is_err_and(|e| e.starts_with("UNSUPPORTED")) {
            undecided += 1;
        }
        let ok = match (&ours, theirs) {
            (Ok(sel), Placed::Allocated(node, devices)) => sel.get(node) == Some(devices),
            (Ok(sel), Placed::Pending(_)) => sel.values().all(BTreeSet::is_empty),
            (Err(e), Placed::Pending(_)) => !e.starts_with("UNSUPPORTED"),
            (Err(_), Placed::Allocated(..)) => false,
        };
        // The verdict of explain, taking the claim as not allocated yet.
        let verdict = inv.claim(ns, &format!("cel-{i:03}")).map(|c| {
            let subject = Subject {
                label: String::new(),
                key: Some(format!("{ns}/cel-{i:03}")),
                spec: c.spec.clone(),
                allocation: None,
                reserved_for: vec![],
            };
            explain::explain(&world, &subject, &Scope::default()).allocatable
        });
        let verdict_ok = match theirs {
            Placed::Allocated(..) => verdict == Some(Allocatable::Yes),
            Placed::Pending(_) => verdict == Some(Allocatable::No),
        };
        if !(ok && verdict_ok) {
            failures.push(format!("#{i} [{class}] {expr}\n    scheduler: {theirs:?}\n    ours: {ours:?}\n    explain: {verdict:?}"));
        }
    }
    let allocated = placed
        .values()
        .filter(|p| matches!(p, Placed::Allocated(..)))
        .count();
    println!(
        "    CEL differential on Kubernetes {release}: {} selectors, {} disagreements, {undecided} undecided; {} refused by the API server (and by us), {allocated} allocated, {} Pending; {} ms",
        expressions.len(),
        failures.len(),
        refused.len(),
        compared - allocated,
        started.elapsed().as_millis()
    );
    if !failures.is_empty() {
        bail!(
            "{} CEL expression(s) where kubectl-dra and kube-scheduler disagree:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// Every trn2 EFA held by one claim; a second claim that wants one of them
/// stays Pending, and explain names the holder.
async fn held_by_another_claim(tb: &impl Testbed, ns: &str) -> Result<()> {
    let efa = DriverKind::Efa.driver_name();
    let trn2_efa = json!([{"cel": {"expression": format!("device.attributes[\"{efa}\"].instanceType == \"trn2.48xlarge\"")}}]);
    let claim = |name: &str, request: serde_json::Value| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}},
        })
    };
    kit::apply_all(
        tb,
        ns,
        &[
            claim("holder", json!({"name": "efas", "exactly": {"deviceClassName": efa, "allocationMode": "All", "selectors": trn2_efa}})),
            kit::pod_with_claim(tb, "holder", None, Some("holder"), Some("trn2")),
        ],
    )
    .await?;
    kit::running(tb, ns, "holder", super::allocate::RUNNING).await?;
    kit::apply_all(
        tb,
        ns,
        &[
            claim(
                "wants-one",
                json!({"name": "efa", "exactly": {"deviceClassName": efa, "selectors": trn2_efa}}),
            ),
            kit::pod_with_claim(tb, "wants-one", None, Some("wants-one"), Some("trn2")),
        ],
    )
    .await?;
    let (_, _, explained) = stays_pending(tb, ns, "wants-one").await?;
    agreement::names_the_reason(
        "wants-one",
        &explained,
        &[
            &format!("already allocated to claim {ns}/holder"),
            "trn2.48xlarge",
        ],
    )
}

pub async fn explain_agreement(tb: &impl Testbed, ns: &str) -> Result<()> {
    tb.ensure_node(
        "trn1",
        "trn1.32xlarge",
        &[DriverKind::Efa, DriverKind::Neuron],
    )
    .await
    .context("adding node trn1")?;
    let shadows = shadow::create(tb).await;
    let compared = match &shadows {
        Ok(s) => {
            println!(
                "    shadow nodes {:?} with {} copied ResourceSlices",
                s.nodes.values().collect::<Vec<_>>(),
                s.slices
            );
            cel_differential(tb, ns).await
        }
        Err(_) => Ok(()),
    };
    // Compared claim by claim; the batch's pods need not go through the
    // generic check of [`super::agreement`] a second time. Removed whatever
    // happened, so that the next scenarios see no shadow devices.
    let removed = shadow::remove(tb, ns, SETTLE).await;
    shadows?;
    compared?;
    removed?;
    held_by_another_claim(tb, ns).await
}
