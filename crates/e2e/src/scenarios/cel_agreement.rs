//! Scenario 17: kubectl-dra's CEL against the real kube-scheduler, in one
//! batch, and the reason it gives for a device another claim holds.
//!
//! 1. CEL differential: every selector expression below goes, in one batch,
//!    into its own claim (`allocationMode: All`, `adminAccess: true`, so
//!    that the claims do not compete for devices) with its own pod. Where
//!    the scheduler allocates, our evaluation must select exactly the
//!    devices it allocated on that node; where it does not, ours must find
//!    no device on any node, or a runtime error; and `explain`'s verdict must
//!    be allocatable / not allocatable accordingly. An expression the API
//!    server refuses never reaches the scheduler and is left out (at least
//!    50 must be compared).
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
use kubectl_dra::cel::{Outcome, Selector};
use kubectl_dra::explain::{self, Allocatable, Scope, Subject};
use kubectl_dra::online;
use kubectl_dra::world::World;
use serde_json::json;

use super::agreement;
use super::allocate::stays_pending;
use super::kit;
use crate::testbed::{DriverKind, Testbed};

const EFA: &str = "efa.networking.k8s.aws";
const NEURON: &str = "neuron.aws.com";
const GPU: &str = "gpu.nvidia.com";

/// (DeviceClass, selector). `E`, `N`, `K`, `A` stand for the EFA and
/// Neuron driver domains, `resource.kubernetes.io` and `resource.aws.com`.
const EXPRESSIONS: &[(&str, &str)] = &[
    // strings
    (EFA, r#"device.driver == "efa.networking.k8s.aws""#),
    (
        EFA,
        r#"device.attributes["E"].instanceType == "trn2.48xlarge""#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType.startsWith("p5")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType.endsWith(".48xlarge")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType.contains("trn")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType.matches("^p[0-9]+\\.")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType in ["trn2.48xlarge", "trn1.32xlarge"]"#,
    ),
    (EFA, r#"device.attributes["K"].pcieRoot == "pci0000:44""#),
    (
        EFA,
        r#"device.attributes["K"].pcieRoot in ["pci0000:44", "pci0000:55"]"#,
    ),
    (
        EFA,
        r#"device.attributes["K"].pcieRoot.endsWith("44") || device.attributes["K"].pcieRoot.endsWith("55")"#,
    ),
    (EFA, r#"device.attributes["E"].rdmaDevice.size() == 9"#),
    (EFA, r#"device.attributes["E"].rdmaDevice.matches("s0$")"#),
    (
        EFA,
        r#"!(device.attributes["E"].instanceType == "p5.48xlarge")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].pciDeviceId.lowerAscii() == "0xefa1""#,
    ),
    (
        EFA,
        r#"device.attributes["E"].pciDeviceId.upperAscii() == "0XEFA1""#,
    ),
    (
        EFA,
        r#"device.attributes["E"].pciDeviceId.replace("0x", "") == "efa1""#,
    ),
    (
        EFA,
        r#"device.attributes["E"].pciDeviceId.indexOf("efa") == 2"#,
    ),
    (
        EFA,
        r#"device.attributes["K"].pcieRoot.substring(0, 7) == "pci0000""#,
    ),
    (
        EFA,
        r#"device.attributes["K"].pciBusID.split(":")[1] == "4f""#,
    ),
    (
        NEURON,
        r#"device.attributes["N"].neuronDriverVersion.startsWith("2.")"#,
    ),
    (
        NEURON,
        r#"device.attributes["A"].devicegroup1_id.contains(":")"#,
    ),
    // ints
    (EFA, r#"device.attributes["K"].numaNode == 1"#),
    (
        EFA,
        r#"device.attributes["K"].numaNode >= 1 && device.attributes["E"].instanceType == "p5.48xlarge""#,
    ),
    (EFA, r#"device.attributes["E"].efaGeneration == 2"#),
    (EFA, r#"device.attributes["E"].efaGeneration > 2"#),
    (EFA, r#"device.attributes["E"].efaGeneration == "2""#),
    (NEURON, r#"device.attributes["N"].deviceId < 4"#),
    (NEURON, r#"device.attributes["N"].deviceId % 2 == 0"#),
    (NEURON, r#"device.attributes["N"].topology_x == 1"#),
    (NEURON, r#"device.attributes["N"].coreCount * 2 == 16"#),
    (
        NEURON,
        r#"device.attributes["N"].deviceId in [0, 5, 10, 15]"#,
    ),
    (GPU, r#"device.attributes["gpu.nvidia.com"].index >= 4"#),
    // bools (no driver publishes a bool attribute; these are bool-typed expressions)
    (EFA, r#"device.allowMultipleAllocations == false"#),
    (
        EFA,
        r#"(device.attributes["E"].efaGeneration == 2) == true"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].instanceType == "p5.48xlarge" ? device.attributes["K"].numaNode == 1 : false"#,
    ),
    // versions and semver
    (
        EFA,
        r#"device.attributes["E"].draDriverVersion.compareTo(semver("0.1.0")) == 0"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].draDriverVersion.isGreaterThan(semver("0.0.9"))"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].draDriverVersion.isLessThan(semver("0.1.0-rc.1"))"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].draDriverVersion == semver("0.1.0")"#,
    ),
    (
        EFA,
        r#"device.attributes["E"].draDriverVersion.major() == 0 && device.attributes["E"].draDriverVersion.minor() == 1"#,
    ),
    (EFA, r#"isSemver(device.attributes["E"].efaDriverVersion)"#),
    (
        EFA,
        r#"semver(device.attributes["E"].firmwareVersion).patch() == 0"#,
    ),
    (
        NEURON,
        r#"device.attributes["N"].draDriverVersion.compareTo(semver("v0.1", true)) == 0"#,
    ),
    // optional fields and has()
    (EFA, r#"device.attributes["K"].?numaNode.orValue(-1) == 0"#),
    (EFA, r#"has(device.attributes["A"].devicegroup4_id)"#),
    (
        EFA,
        r#"device.attributes["A"].?devicegroup4_id.orValue("none") == "none""#,
    ),
    (EFA, r#"device.attributes["E"].?noSuchAttribute.hasValue()"#),
    (NEURON, r#"device.capacity["N"].?nothing.hasValue()"#),
    // quantities and capacity
    (
        NEURON,
        r#"device.capacity["N"].memory.compareTo(quantity("64Gi")) > 0"#,
    ),
    (
        NEURON,
        r#"device.capacity["N"].memory.isLessThan(quantity("40Gi"))"#,
    ),
    (NEURON, r#"device.capacity["N"].cores.asInteger() == 8"#),
    (
        NEURON,
        r#"device.capacity["N"].memory.add(quantity("4Gi")) == quantity("100Gi")"#,
    ),
    (
        NEURON,
        r#"device.capacity["N"].cores.sign() == 1 && device.capacity["N"].cores.isInteger()"#,
    ),
    (
        GPU,
        r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) == 0"#,
    ),
    (EFA, r#"quantity("1Gi").isGreaterThan(quantity("1G"))"#),
    (EFA, r#"quantity("1.5").isInteger()"#),
    // lists and macros
    (
        EFA,
        r#"["p5.48xlarge"].exists(t, t == device.attributes["E"].instanceType)"#,
    ),
    (EFA, r#"size(device.attributes["E"]) > 5"#),
    // failures at run time
    (EFA, r#"device.attributes["E"].noSuch == 1"#),
    (EFA, r#"device.attributes["E"].instanceType > 5"#),
    (
        EFA,
        r#"device.attributes["K"].numaNode == 0 && device.attributes["A"].devicegroup1_id != """#,
    ),
    (
        NEURON,
        r#"semver(device.attributes["N"].neuronDriverVersion).major() == 2"#,
    ),
];

fn expand(expr: &str) -> String {
    expr.replace(r#"["E"]"#, r#"["efa.networking.k8s.aws"]"#)
        .replace(r#"["N"]"#, r#"["neuron.aws.com"]"#)
        .replace(r#"["K"]"#, r#"["resource.kubernetes.io"]"#)
        .replace(r#"["A"]"#, r#"["resource.aws.com"]"#)
}

const SETTLE: Duration = Duration::from_secs(180);

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
            match s.evaluate(&world.env, &d.value) {
                Outcome::Match => {}
                Outcome::NoMatch => continue 'devices,
                Outcome::RuntimeError(e) => return Err(format!("runtime error on {}: {e}", d.id)),
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
async fn create_batch(tb: &impl Testbed, ns: &str) -> Result<BTreeMap<usize, String>> {
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
    for (i, (class, expr)) in EXPRESSIONS.iter().enumerate() {
        let name = format!("cel-{i:02}");
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": class, "allocationMode": "All", "adminAccess": true,
                "selectors": [{"cel": {"expression": expand(expr)}}],
            }}]}},
        });
        if let Err(e) = kit::apply_all(tb, ns, &[claim]).await {
            refused.insert(i, format!("{e:#}"));
            continue;
        }
        kit::apply_all(
            tb,
            ns,
            &[kit::pod_with_claim(tb, &name, None, Some(&name), None)],
        )
        .await?;
    }
    Ok(refused)
}

async fn cel_differential(tb: &impl Testbed, ns: &str) -> Result<()> {
    let started = Instant::now();
    let refused = create_batch(tb, ns).await?;
    let compared = EXPRESSIONS.len() - refused.len();
    if compared < 50 {
        bail!(
            "the API server refused {} expressions, fewer than 50 left: {refused:?}",
            refused.len()
        );
    }
    let mut placed: BTreeMap<usize, Placed> = BTreeMap::new();
    while placed.len() < compared {
        for i in 0..EXPRESSIONS.len() {
            if !placed.contains_key(&i)
                && !refused.contains_key(&i)
                && let Some(p) = scheduler_result(tb, ns, &format!("cel-{i:02}")).await?
            {
                placed.insert(i, p);
            }
        }
        if started.elapsed() > SETTLE {
            // What the undecided pods looked like, for the log reader.
            let mut undecided = Vec::new();
            for i in (0..EXPRESSIONS.len())
                .filter(|i| !placed.contains_key(i) && !refused.contains_key(i))
            {
                let name = format!("cel-{i:02}");
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
    let world = World::new(&inv);
    let mut failures = Vec::new();
    for (i, (class, expr)) in EXPRESSIONS.iter().enumerate() {
        let expr = expand(expr);
        let Some(theirs) = placed.get(&i) else {
            continue;
        };
        let ours = our_selection(&world, class, &expr);
        let ok = match (&ours, theirs) {
            (Ok(sel), Placed::Allocated(node, devices)) => sel.get(node) == Some(devices),
            (Ok(sel), Placed::Pending(_)) => sel.values().all(BTreeSet::is_empty),
            (Err(e), Placed::Pending(_)) => !e.starts_with("UNSUPPORTED"),
            (Err(_), Placed::Allocated(..)) => false,
        };
        // The verdict of explain, taking the claim as not allocated yet.
        let verdict = inv.claim(ns, &format!("cel-{i:02}")).map(|c| {
            let subject = Subject {
                label: String::new(),
                key: Some(format!("{ns}/cel-{i:02}")),
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
        "    CEL differential: {} of {compared} expressions agree with kube-scheduler ({allocated} allocated, {} Pending; {} refused by the API server), {} ms",
        compared - failures.len(),
        compared - allocated,
        refused.len(),
        started.elapsed().as_millis()
    );
    if !failures.is_empty() {
        bail!(
            "{} CEL expression(s) where kubectl-dra and kube-scheduler disagree:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    // Compared above, claim by claim; the batch's pods need not go through
    // the generic check of [`super::agreement`] a second time.
    kit::delete_all_pods(tb, ns, SETTLE).await
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
            kit::pod_with_claim(tb, "wants-one", None, Some("wants-one"), None),
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
    cel_differential(tb, ns).await?;
    held_by_another_claim(tb, ns).await
}
