//! kubectl-dra against the real kube-scheduler, on the local cluster of real
//! components (`e2e::LocalTestbed`: p5 and trn2 by default, trn1 added).
//!
//! 1. CEL differential: every selector expression below goes, in one batch,
//!    into its own claim (`allocationMode: All`, `adminAccess: true`, so
//!    that the claims do not compete for devices) with its own pod. Where
//!    the scheduler allocates, our evaluation must select exactly the
//!    devices it allocated on that node; where it does not, ours must find
//!    no device on any node, or a runtime error.
//! 2. Verdicts: the e2e scenarios' claims (one EFA; 4 chips + 4 EFAs on
//!    trn1; All EFAs across roots; a device held by another claim). Scheduled
//!    pods must be explained as allocated and, taken as pending, as
//!    allocatable; Pending pods as not allocatable, with the key words of
//!    the reason (the constraint, the holding claim).
//!
//! Needs root, `cargo xtask k8s build`, helm, and the driver binaries
//! (`cargo build -p efa-driver -p neuron-driver -p e2e --bins`, then
//! `AWS_DRA_BIN_DIR=<target>/debug`). Not part of plain `cargo test`
//! (`test = false`); run it under the machine-wide lock:
//! `flock /tmp/aws-dra-e2e.lock cargo test -p kubectl-dra --test scheduler_agreement`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use e2e::scenarios::kit;
use e2e::{DriverKind, LocalOptions, LocalTestbed, ManagedTestbed, Testbed};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kubectl_dra::cel::{Outcome, Selector};
use kubectl_dra::explain::{self, Allocatable, Scope, Subject};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::online;
use kubectl_dra::world::World;
use serde_json::{Value, json};

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

async fn scheduler_result(tb: &LocalTestbed, ns: &str, pod: &str) -> Result<Option<Placed>> {
    let Some(p) = kit::get_pod(tb, ns, pod).await? else {
        return Ok(None);
    };
    if let Some((reason, message)) = kit::unschedulable(&p) {
        return Ok(Some(Placed::Pending(format!("{reason}: {message}"))));
    }
    let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(None);
    };
    let claims = match kit::pod_claims(tb, ns, pod).await {
        Ok(c) => c,
        Err(_) => return Ok(None),
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

async fn inventory(tb: &LocalTestbed, ns: &str, pod: Option<&str>) -> Result<Inventory> {
    online::fetch(&tb.client(), ns, pod)
        .await
        .context("reading the cluster")
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

async fn cel_differential(tb: &LocalTestbed) -> Result<Vec<String>> {
    let ns = "kdra-cel";
    kit::namespace(tb, ns).await?;
    // Admin access needs the namespace label.
    let namespaces: Api<Namespace> = Api::all(tb.client());
    namespaces
        .patch(
            ns,
            &PatchParams::apply("kubectl-dra-test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})),
        )
        .await
        .context("labelling the namespace for admin access")?;
    // One claim and one pod per expression. The API server compiles each
    // selector when the claim is created; one it refuses never reaches the
    // scheduler, so it is left out of the comparison (and counted).
    let mut refused: BTreeMap<usize, String> = BTreeMap::new();
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
    let compared = EXPRESSIONS.len() - refused.len();
    if compared < 50 {
        bail!(
            "the API server refused {} expressions, fewer than 50 left: {refused:?}",
            refused.len()
        );
    }
    let mut placed: BTreeMap<usize, Placed> = BTreeMap::new();
    let started = std::time::Instant::now();
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
            bail!(
                "after {SETTLE:?} the scheduler had decided {} of {} CEL pods; {}",
                placed.len(),
                compared,
                tb.logs_hint()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let inv = inventory(tb, ns, None).await?;
    let world = World::new(&inv);
    let mut failures = Vec::new();
    let mut agreed = 0;
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
        // The verdict of explain must agree too.
        let claim: Option<&ResourceClaim> = inv.claim(ns, &format!("cel-{i:02}"));
        let verdict = claim.map(|c| {
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
        if ok && verdict_ok {
            agreed += 1;
        } else {
            failures.push(format!("#{i} [{class}] {expr}\n    scheduler: {theirs:?}\n    ours: {ours:?}\n    explain: {verdict:?}"));
        }
    }
    println!(
        "CEL differential: {agreed} of {} expressions agree with kube-scheduler",
        EXPRESSIONS.len()
    );
    kit::delete_all_pods(tb, ns, SETTLE).await?;
    Ok(failures)
}

/// A pod's explanation, from the live cluster through the online path.
async fn explain_pod(tb: &LocalTestbed, ns: &str, pod: &str) -> Result<Vec<explain::Explanation>> {
    let inv = inventory(tb, ns, Some(pod)).await?;
    let world = World::new(&inv);
    let (subjects, scope) = explain::subjects_for_pod(&inv, ns, pod)?;
    Ok(subjects
        .iter()
        .map(|s| explain::explain(&world, s, &scope))
        .collect())
}

async fn settle(tb: &LocalTestbed, ns: &str, pod: &str) -> Result<Placed> {
    kit::wait_for(
        tb,
        &format!("{ns}/{pod} scheduled or unschedulable"),
        SETTLE,
        || scheduler_result(tb, ns, pod),
    )
    .await
}

fn claim(name: &str, requests: Value, constraints: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
    })
}

async fn verdicts(tb: &LocalTestbed) -> Result<Vec<String>> {
    let ns = "kdra-verdicts";
    kit::namespace(tb, ns).await?;
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut failures = Vec::new();
    // (pod, expected to be scheduled, key words of the reason when not)
    let mut cases: Vec<(String, bool, Vec<String>)> = Vec::new();

    let single = kit::example(tb, &examples.join("efa/single-efa.yaml"), None)?;
    kit::apply_all(tb, ns, &single).await?;
    for o in single.iter().filter(|o| o["kind"] == "Pod") {
        cases.push((
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            true,
            vec![],
        ));
    }
    let trn1 = kit::example(
        tb,
        &examples.join("neuron/neuron-4-chips-with-efas.yaml"),
        Some("trn1"),
    )?;
    kit::apply_all(tb, ns, &trn1).await?;
    cases.push((
        "neuron-4-chips-with-efas".into(),
        false,
        vec![
            "matchAttribute".into(),
            "resource.aws.com/devicegroup4_id".into(),
            "\"efas\" has 2 of 4".into(),
        ],
    ));
    // All EFAs of p5 across its eight roots, paired with a GPU on one root.
    kit::apply_all(
        tb,
        ns,
        &[
            claim(
                "all-across-roots",
                json!([
                    {"name": "gpu", "exactly": {"deviceClassName": GPU}},
                    {"name": "efas", "exactly": {"deviceClassName": EFA, "allocationMode": "All"}},
                ]),
                json!([{"requests": ["gpu", "efas"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
            ),
            kit::pod_with_claim(tb, "all-across-roots", None, Some("all-across-roots"), Some("p5")),
        ],
    )
    .await?;
    cases.push((
        "all-across-roots".into(),
        false,
        vec![
            "resource.kubernetes.io/pcieRoot".into(),
            "(all matching devices)".into(),
        ],
    ));
    // Every trn2 EFA held by one claim; a second claim wants one of them.
    let trn2_efa = json!([{"cel": {"expression": "device.attributes[\"efa.networking.k8s.aws\"].instanceType == \"trn2.48xlarge\""}}]);
    kit::apply_all(
        tb,
        ns,
        &[
            claim("holder", json!([{"name": "efas", "exactly": {"deviceClassName": EFA, "allocationMode": "All", "selectors": trn2_efa}}]), json!([])),
            kit::pod_with_claim(tb, "holder", None, Some("holder"), Some("trn2")),
        ],
    )
    .await?;
    cases.push(("holder".into(), true, vec![]));
    settle(tb, ns, "holder").await?;
    kit::apply_all(
        tb,
        ns,
        &[
            claim("wants-one", json!([{"name": "efa", "exactly": {"deviceClassName": EFA, "selectors": trn2_efa}}]), json!([])),
            kit::pod_with_claim(tb, "wants-one", None, Some("wants-one"), None),
        ],
    )
    .await?;
    cases.push((
        "wants-one".into(),
        false,
        vec![format!("already allocated to claim {ns}/holder")],
    ));

    for (pod, scheduled, words) in &cases {
        let placed = settle(tb, ns, pod).await?;
        let reports = explain_pod(tb, ns, pod).await?;
        let text: String = reports
            .iter()
            .map(kubectl_dra::render::explanation)
            .collect();
        println!("--- {pod}: scheduler {placed:?}\n{text}");
        match (&placed, scheduled) {
            (Placed::Allocated(..), true) => {
                if !reports
                    .iter()
                    .all(|r| r.allocatable == Allocatable::Allocated)
                {
                    failures.push(format!("{pod}: scheduled, but explain says\n{text}"));
                }
            }
            (Placed::Pending(_), false) => {
                if !reports.iter().any(|r| r.allocatable == Allocatable::No) {
                    failures.push(format!("{pod}: Pending, but explain says\n{text}"));
                }
                for w in words {
                    if !text.contains(w.as_str()) {
                        failures.push(format!("{pod}: the reason lacks {w:?}:\n{text}"));
                    }
                }
            }
            (other, _) => failures.push(format!(
                "{pod}: the scheduler did {other:?}, the scenario expects scheduled={scheduled}"
            )),
        }
    }
    kit::delete_all_pods(tb, ns, SETTLE).await?;
    Ok(failures)
}

async fn run(tb: &LocalTestbed) -> Result<Vec<String>> {
    tb.ensure_node(
        "trn1",
        "trn1.32xlarge",
        &[DriverKind::Efa, DriverKind::Neuron],
    )
    .await
    .context("adding node trn1")?;
    let mut failures = cel_differential(tb).await?;
    failures.extend(verdicts(tb).await?);
    Ok(failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_agrees_with_kube_scheduler() {
    let tb = match LocalTestbed::start(LocalOptions::default()).await {
        Ok(tb) => tb,
        Err(e) => panic!("bringing up the local cluster: {e}"),
    };
    let result = run(&tb).await;
    let report = tb.shutdown();
    let failures = match result {
        Ok(f) => f,
        Err(e) => vec![format!("{e:#}")],
    };
    assert!(report.is_clean(), "teardown left {report:?}");
    assert!(
        failures.is_empty(),
        "{} disagreement(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
