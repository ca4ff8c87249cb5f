//! Part (a) of `cargo xtask chaos`: cycles of creating and deleting pods
//! with claims while the drivers are SIGKILLed at random moments.
//!
//! One cycle, in namespace [`NAMESPACE`]:
//! - on `p5`: a pod with a one-EFA claim (template), two pods sharing one
//!   ResourceClaim of one EFA, and a pod whose claim asks for a GPU and an
//!   EFA on the same PCIe root (the test GPU driver and the EFA driver);
//! - on `trn2`: a pod with a one-Neuron-device claim (template);
//! - wait until every pod runs (or [`ChaosOptions::pod_timeout`] passes),
//!   check that no device is allocated to two claims and that no device is
//!   in two claims of a driver's checkpoint;
//! - delete everything, wait until the pods are gone (else: stuck) and
//!   until no checkpoint entry and no CDI spec is left for the cycle's
//!   claims.
//!
//! Kills run alongside the cycle body: in each cycle a driver is killed
//! with probability (kills left) / (cycles left), after a random delay, so
//! kills land while pods are being prepared, are running, or are being
//! unprepared; the driver is started again at once (the start waits for
//! its pool to be complete in the API).
//!
//! [`ChaosOptions::lanes`] cycles run at a time, each lane taking the next
//! cycle number when its cycle ends: a cycle whose pod waits for the
//! kubelet's retry after a kill does not hold up the others, and a kill
//! lands among several cycles' prepares and unprepares at once. The device
//! checks see every lane's claims.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};

use super::{ChaosOptions, Rng};
use e2e::scenarios::kit;
use e2e::testbed::{DriverKind, Testbed};

/// The namespace of the cycles.
pub const NAMESPACE: &str = "chaos";

/// The drivers that are killed: `(node, driver)`.
pub const TARGETS: [(&str, DriverKind); 2] =
    [("p5", DriverKind::Efa), ("trn2", DriverKind::Neuron)];

/// Nodes and drivers whose checkpoints and CDI specs are checked.
const CHECKED: [(&str, DriverKind); 4] = [
    ("p5", DriverKind::Efa),
    ("p5", DriverKind::GpuTest),
    ("trn2", DriverKind::Efa),
    ("trn2", DriverKind::Neuron),
];

/// How long deleted pods may take to go away before they count as stuck.
const GONE: Duration = Duration::from_secs(120);
/// How long the drivers may take to unprepare deleted claims.
const UNPREPARED: Duration = Duration::from_secs(90);

/// What the cycles saw.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct CycleFigures {
    pub cycles: u64,
    pub pods_created: u64,
    pub pods_ran: u64,
    /// `(node, driver) → kills`.
    pub kills: BTreeMap<String, u64>,
    /// Driver restarts after a kill: start → complete pool, ms.
    pub restart_ms: Vec<u64>,
    /// Pod created → all pods of the cycle Running, ms (cycles where all ran).
    pub all_running_ms: Vec<u64>,
    /// Pods that did not run within the timeout (`cycle/pod: why`).
    pub not_run: Vec<String>,
    /// Pods not gone within 120 s of their deletion.
    pub stuck: Vec<String>,
    /// Devices held by two claims (allocation or checkpoint).
    pub double_held: Vec<String>,
    /// Checkpoint entries or CDI specs left for deleted claims.
    pub leftovers: Vec<String>,
    /// Claims (distinct uids) seen.
    pub claims: u64,
    pub seconds: f64,
}

/// The claim templates and the shared-claim shape of the cycles.
fn templates() -> Vec<Value> {
    let request = |name: &str, class: &str| json!({"name": name, "exactly": {"deviceClassName": class, "count": 1}});
    let template = |name: &str, spec: Value| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": spec},
        })
    };
    vec![
        template(
            "chaos-efa",
            json!({"devices": {"requests": [request("efa", "efa.networking.k8s.aws")]}}),
        ),
        template(
            "chaos-neuron",
            json!({"devices": {"requests": [request("neuron", "neuron.aws.com")]}}),
        ),
        template(
            "chaos-aligned",
            json!({"devices": {
                "requests": [request("gpu", "gpu.nvidia.com"), request("efa", "efa.networking.k8s.aws")],
                "constraints": [{"requests": ["gpu", "efa"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
            }}),
        ),
    ]
}

fn shared_claim(name: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "efa", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 1}},
        ]}},
    })
}

/// The pods of cycle `i`: `(name, object)`.
fn cycle_pods(tb: &impl Testbed, i: u64) -> (Vec<Value>, Vec<String>) {
    let shared = format!("c{i}-shared");
    let pods = vec![
        kit::pod_with_claim(
            tb,
            &format!("c{i}-single"),
            Some("chaos-efa"),
            None,
            Some("p5"),
        ),
        kit::pod_with_claim(
            tb,
            &format!("c{i}-shared-a"),
            None,
            Some(&shared),
            Some("p5"),
        ),
        kit::pod_with_claim(
            tb,
            &format!("c{i}-shared-b"),
            None,
            Some(&shared),
            Some("p5"),
        ),
        kit::pod_with_claim(
            tb,
            &format!("c{i}-aligned"),
            Some("chaos-aligned"),
            None,
            Some("p5"),
        ),
        kit::pod_with_claim(
            tb,
            &format!("c{i}-neuron"),
            Some("chaos-neuron"),
            None,
            Some("trn2"),
        ),
    ];
    let names = pods
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let mut objs = vec![shared_claim(&shared)];
    objs.extend(pods);
    (objs, names)
}

/// Kills the driver and starts it again; returns the restart time.
async fn kill_and_restart(tb: &impl Testbed, node: &str, kind: DriverKind) -> Result<Duration> {
    tb.kill_driver(node, kind)?;
    kit::wait_for(
        tb,
        &format!("{} on {node} dead", kind.binary()),
        Duration::from_secs(10),
        || async { Ok((!tb.driver_running(node, kind)).then_some(())) },
    )
    .await?;
    tb.start_driver(node, kind).await.map_err(Into::into)
}

/// What the lanes share: the next cycle, the kill plan, the figures.
struct Shared<'r> {
    started: Instant,
    next: Cell<u64>,
    stop: Cell<bool>,
    rng: RefCell<&'r mut Rng>,
    kills_left: RefCell<BTreeMap<usize, u64>>,
    /// One per target: a driver is killed by one lane at a time (a kill
    /// waits for the previous one's restart).
    killing: Vec<tokio::sync::Mutex<()>>,
    figures: RefCell<CycleFigures>,
    seen_uids: RefCell<BTreeSet<String>>,
}

/// Runs the cycles, [`ChaosOptions::lanes`] at a time; stops starting
/// cycles at `options.max_duration`.
pub async fn run(tb: &impl Testbed, options: &ChaosOptions, rng: &mut Rng) -> Result<CycleFigures> {
    let started = Instant::now();
    kit::namespace(tb, NAMESPACE).await?;
    kit::apply_all(tb, NAMESPACE, &templates()).await?;
    let shared = Shared {
        started,
        next: Cell::new(0),
        stop: Cell::new(false),
        rng: RefCell::new(rng),
        kills_left: RefCell::new((0..TARGETS.len()).map(|t| (t, options.kills)).collect()),
        killing: TARGETS
            .iter()
            .map(|_| tokio::sync::Mutex::new(()))
            .collect(),
        figures: RefCell::new(CycleFigures::default()),
        seen_uids: RefCell::new(BTreeSet::new()),
    };
    let lanes = (0..options.lanes.max(1)).map(|_| async {
        let result = lane(tb, options, &shared).await;
        if result.is_err() {
            // The other lanes finish the cycle they are in, then stop.
            shared.stop.set(true);
        }
        result
    });
    let results = futures::future::join_all(lanes).await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let seen_uids = shared.seen_uids.into_inner();
    let mut figures = shared.figures.into_inner();
    figures.claims = seen_uids.len() as u64;
    // The end check over the whole run: nothing of any claim ever seen.
    leftovers(tb, &seen_uids, &mut figures.leftovers, UNPREPARED).await?;
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(figures)
}

/// One lane: takes the next cycle number until none is left, runs the
/// cycle with the kills planned for it alongside, adds its figures.
async fn lane(tb: &impl Testbed, options: &ChaosOptions, shared: &Shared<'_>) -> Result<()> {
    loop {
        let i = shared.next.get();
        if shared.stop.get() || i >= options.cycles {
            return Ok(());
        }
        if options
            .max_duration
            .is_some_and(|d| shared.started.elapsed() > d)
        {
            eprintln!("==> chaos: time budget spent after {i} cycles started");
            shared.stop.set(true);
            return Ok(());
        }
        shared.next.set(i + 1);
        // Which drivers die this cycle, and when.
        let plan = {
            let cycles_left = options.cycles - i;
            let mut rng = shared.rng.borrow_mut();
            let mut plan = Vec::new();
            for (t, left) in shared.kills_left.borrow_mut().iter_mut() {
                if *left > 0 && rng.below(cycles_left) < *left {
                    *left -= 1;
                    plan.push((*t, Duration::from_millis(rng.below(8000))));
                }
            }
            plan
        };
        let kills = async {
            let mut out = Vec::new();
            for (t, delay) in &plan {
                let (node, kind) = TARGETS[*t];
                tokio::time::sleep(*delay).await;
                let _one_at_a_time = shared.killing[*t].lock().await;
                out.push((*t, kill_and_restart(tb, node, kind).await));
            }
            out
        };
        let mut cycle = CycleFigures::default();
        let mut cycle_uids = BTreeSet::new();
        let (body, kill_results) = tokio::join!(
            one_cycle(tb, options, i, &mut cycle, &mut cycle_uids),
            kills
        );
        for (t, r) in kill_results {
            let (node, kind) = TARGETS[t];
            let restart =
                r.map_err(|e| anyhow!("restarting {} on {node}: {e:#}", kind.binary()))?;
            *cycle
                .kills
                .entry(format!("{node}/{}", kind.binary()))
                .or_default() += 1;
            cycle.restart_ms.push(restart.as_millis() as u64);
        }
        body?;
        cycle.cycles = 1;
        shared.seen_uids.borrow_mut().extend(cycle_uids);
        let mut figures = shared.figures.borrow_mut();
        figures.absorb(cycle);
        if figures.cycles.is_multiple_of(10) {
            eprintln!(
                "==> chaos: {} cycles, {} pods ran of {}, kills {:?}, {:.0}s",
                figures.cycles,
                figures.pods_ran,
                figures.pods_created,
                figures.kills,
                shared.started.elapsed().as_secs_f64()
            );
        }
        if !figures.stuck.is_empty() {
            eprintln!("==> chaos: stopping, pods stuck: {:?}", figures.stuck);
            shared.stop.set(true);
        }
    }
}

impl CycleFigures {
    /// Adds one cycle's figures to the run's.
    fn absorb(&mut self, cycle: CycleFigures) {
        self.cycles += cycle.cycles;
        self.pods_created += cycle.pods_created;
        self.pods_ran += cycle.pods_ran;
        for (target, n) in cycle.kills {
            *self.kills.entry(target).or_default() += n;
        }
        self.restart_ms.extend(cycle.restart_ms);
        self.all_running_ms.extend(cycle.all_running_ms);
        self.not_run.extend(cycle.not_run);
        self.stuck.extend(cycle.stuck);
        self.double_held.extend(cycle.double_held);
        self.leftovers.extend(cycle.leftovers);
    }
}

async fn one_cycle(
    tb: &impl Testbed,
    options: &ChaosOptions,
    i: u64,
    figures: &mut CycleFigures,
    seen_uids: &mut BTreeSet<String>,
) -> Result<()> {
    let (objs, names) = cycle_pods(tb, i);
    let created = Instant::now();
    kit::apply_all(tb, NAMESPACE, &objs).await?;
    figures.pods_created += names.len() as u64;
    let pods: Api<Pod> = Api::namespaced(tb.client(), NAMESPACE);
    let mut ran = BTreeSet::new();
    let mut ended = BTreeMap::new();
    while ran.len() + ended.len() < names.len() && created.elapsed() < options.pod_timeout {
        for p in pods.list(&ListParams::default()).await?.items {
            let name = p.metadata.name.clone().unwrap_or_default();
            if !names.contains(&name) {
                continue;
            }
            match p.status.and_then(|s| s.phase).as_deref() {
                Some("Running") => {
                    ran.insert(name);
                }
                Some(phase @ ("Failed" | "Succeeded")) => {
                    ended.insert(name, phase.to_string());
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    figures.pods_ran += ran.len() as u64;
    if ran.len() == names.len() {
        figures
            .all_running_ms
            .push(created.elapsed().as_millis() as u64);
    }
    for n in names.iter().filter(|n| !ran.contains(*n)) {
        let why = match ended.get(n) {
            Some(phase) => phase.clone(),
            None => format!(
                "not Running after {:?}; events {:?}",
                options.pod_timeout,
                kit::events(tb, NAMESPACE, n).await.unwrap_or_default()
            ),
        };
        eprintln!("==> chaos: cycle {i}: pod {n} did not run: {why}");
        figures.not_run.push(format!("{n}: {why}"));
    }
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), NAMESPACE);
    let live = claims.list(&ListParams::default()).await?.items;
    let mut cycle_uids = BTreeSet::new();
    let mut holder: BTreeMap<(String, String, String), String> = BTreeMap::new();
    for c in &live {
        let uid = c.metadata.uid.clone().unwrap_or_default();
        cycle_uids.insert(uid.clone());
        for a in kit::allocation(c) {
            let key = (a.driver.clone(), a.pool.clone(), a.device.clone());
            if let Some(other) = holder.insert(key, uid.clone())
                && other != uid
            {
                figures.double_held.push(format!(
                    "cycle {i}: {} {} {} allocated to claims {other} and {uid}",
                    a.driver, a.pool, a.device
                ));
            }
        }
    }
    for (node, kind) in CHECKED {
        if let Some(cp) = tb.checkpoint(node, kind)? {
            let mut owner: BTreeMap<String, String> = BTreeMap::new();
            for (uid, c) in &cp.claims {
                for d in &c.devices {
                    if let Some(other) = owner.insert(d.device.clone(), uid.clone()) {
                        figures.double_held.push(format!(
                            "cycle {i}: {node} {} checkpoint: {} in claims {other} and {uid}",
                            kind.binary(),
                            d.device
                        ));
                    }
                }
            }
        }
    }
    seen_uids.extend(cycle_uids.iter().cloned());

    // Delete: the pods, then the shared claim (the templates' claims go
    // with their pods).
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for n in &refs {
        let _ = pods.delete(n, &DeleteParams::default()).await;
    }
    let gone_from = Instant::now();
    for n in &refs {
        let gone = kit::wait_for(tb, &format!("pod {n} gone"), GONE, || async {
            Ok(kit::get_pod(tb, NAMESPACE, n)
                .await?
                .is_none()
                .then_some(()))
        })
        .await;
        if gone.is_err() {
            figures.stuck.push(format!(
                "cycle {i}: {n} not gone {:?} after deletion",
                gone_from.elapsed()
            ));
        }
    }
    let _ = claims
        .delete(&format!("c{i}-shared"), &DeleteParams::default())
        .await;
    leftovers(tb, &cycle_uids, &mut figures.leftovers, UNPREPARED).await
}

/// Waits up to `timeout` until no checkpoint entry and no CDI spec of the
/// claims `uids` is left on any node; records what is still there then.
async fn leftovers(
    tb: &impl Testbed,
    uids: &BTreeSet<String>,
    out: &mut Vec<String>,
    timeout: Duration,
) -> Result<()> {
    let started = Instant::now();
    loop {
        let mut left = Vec::new();
        for (node, kind) in CHECKED {
            if let Some(cp) = tb.checkpoint(node, kind)? {
                for uid in cp.claims.keys().filter(|u| uids.contains(*u)) {
                    left.push(format!("{node} {} checkpoint entry {uid}", kind.binary()));
                }
            }
        }
        for node in ["p5", "trn2"] {
            for f in tb.cdi_spec_files(node)? {
                if uids.iter().any(|u| f.contains(u.as_str())) {
                    left.push(format!("{node} CDI spec {f}"));
                }
            }
        }
        left.sort();
        left.dedup();
        if left.is_empty() {
            return Ok(());
        }
        if started.elapsed() > timeout {
            eprintln!("==> chaos: left behind after {timeout:?}: {left:?}");
            out.extend(left);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
