//! `cargo xtask lws`: AWS's way of running a Trn2 UltraServer job,
//! unchanged: a LeaderWorkerSet with the `exclusive-topology` annotation on
//! the UltraServer label, each pod with a whole-node `neuron_node` claim in
//! `UltraServerConfig{ultraserverMode: 4}`, on the four real trn2u kubelets
//! of one UltraServer (`us-0`…`us-3`, as scenario 27).
//!
//! The run, in order:
//! 1. the host-process testbed with those four nodes only, each with our
//!    Neuron driver; the UltraServer labels and whole-node devices checked
//!    as scenario 27 checks them;
//! 2. LWS's CRD (from the module), the controller as a host process serving
//!    its webhooks on 127.0.0.1, and LWS's webhook configurations pointed
//!    there ([`controller`]);
//! 3. the example ([`EXAMPLE`]), its pod templates adapted to the testbed
//!    (the probe image, host network) and nothing else; every step timed
//!    from the LeaderWorkerSet's creation, polling every 200 ms;
//! 4. the checks: 4 pods, all Running, one per node of one UltraServer,
//!    each claim the node's `neuronnode`, every container with every chip
//!    and the runtime's UltraServer variables (scenario 27's checks,
//!    `e2e::scenarios::aws_claims`), and LWS's `LWS_LEADER_ADDRESS` naming
//!    the leader; then the LeaderWorkerSet deleted and its pods gone.

pub mod controller;
pub mod report;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use e2e::local::LocalTestbed;
use e2e::scenarios::aws_claims::{self, ULTRASERVER};
use e2e::scenarios::kit;
use e2e::testbed::{DriverKind, LocalOptions, ManagedTestbed, Testbed};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use local_cluster::process::ManagedProcess;
use local_cluster::versions::KubernetesVersion;
use serde_json::{Value, json};

use controller::LwsTool;
use report::{GroupPod, LwsReport};

/// The job, as AWS documents it for 4-node UltraServer work.
pub const EXAMPLE: &str = "examples/multi-node/lws-ultraserver.yaml";
/// The namespace of the run's objects.
pub const NAMESPACE: &str = "lws-ultraserver";
const POLL: Duration = Duration::from_millis(200);
const GROUP_SIZE: usize = 4;
const EXCLUSIVE_TOPOLOGY: &str = "leaderworkerset.sigs.k8s.io/exclusive-topology";
const SET_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";
const SERVER_ID_4: &str = "neuron.amazonaws.com/ultraserver-server-id-4";

/// What to run.
#[derive(Debug, Clone)]
pub struct LwsOptions {
    pub kubernetes_version: KubernetesVersion,
    pub tool: LwsTool,
    /// The example file, repository-relative.
    pub example: String,
    /// How long the group may take to run.
    pub timeout: Duration,
}

/// Brings the testbed up, runs the job and shuts everything down.
pub async fn run(options: &LwsOptions) -> Result<LwsReport> {
    let started = Instant::now();
    let testbed = LocalTestbed::start(LocalOptions {
        kubernetes_version: options.kubernetes_version.clone(),
        nodes: ULTRASERVER
            .iter()
            .map(|(n, f)| (n.to_string(), f.to_string(), vec![DriverKind::Neuron]))
            .collect(),
        ..LocalOptions::default()
    })
    .await?;
    let mut report = LwsReport {
        kubernetes: options.kubernetes_version.to_string(),
        lws_version: options.tool.version.clone(),
        example: options.example.clone(),
        testbed_up_s: started.elapsed().as_secs_f64(),
        ..LwsReport::default()
    };
    let dir = testbed.run_dir().join("lws");
    eprintln!(
        "==> lws: testbed up in {:.0}s; the controller's log in {}",
        report.testbed_up_s,
        dir.display()
    );
    let mut process = None;
    let result = run_on(&testbed, options, &dir, &mut process, &mut report).await;
    if let Some(mut p) = process {
        p.terminate(Duration::from_secs(5));
    }
    let teardown = testbed.shutdown();
    if !teardown.is_clean() {
        eprintln!("==> lws: teardown left {teardown:?}");
    }
    report.seconds = started.elapsed().as_secs_f64();
    if let Err(e) = result {
        report.failures.push(format!("{e:#}"));
    }
    Ok(report)
}

async fn run_on(
    tb: &LocalTestbed,
    options: &LwsOptions,
    dir: &Path,
    process: &mut Option<ManagedProcess>,
    report: &mut LwsReport,
) -> Result<()> {
    let client = tb.client();
    let ids = aws_claims::ultraserver_ids(tb).await?;
    // Step 2: CRD, controller, webhooks.
    let started = Instant::now();
    for crd in controller::crds(&options.tool)? {
        e2e::manifests::apply(&client, &crd, None).await?;
    }
    // The controller starts once the CRD is served, as where it is
    // installed first: started before, its LeaderWorkerSet watch retries
    // only every 10 s (controller-runtime's wait for a CRD's kind), which
    // would be counted below as the controller's time.
    let sets = lws_api(&client, None);
    kit::wait_for(
        tb,
        "LeaderWorkerSets served",
        Duration::from_secs(60),
        || async { Ok(sets.list(&ListParams::default()).await.ok().map(|_| ())) },
    )
    .await?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let setup = controller::serving_setup(dir)?;
    *process = Some(controller::start(
        &options.tool,
        &setup,
        tb.admin_kubeconfig(),
        &dir.join("lws.log"),
        Duration::from_secs(60),
    )?);
    for config in controller::webhook_configurations(&options.tool, setup.addr, &setup.ca_pem)? {
        e2e::manifests::apply(&client, &config, None).await?;
    }
    report.controller_up_s = started.elapsed().as_secs_f64();
    namespace(tb).await?;

    // Step 3: the example, its pod templates adapted to the testbed.
    let (lws, others) = example(
        tb,
        &local_cluster::paths::repo_root().join(&options.example),
    )?;
    for obj in &others {
        e2e::manifests::apply(&client, obj, Some(NAMESPACE)).await?;
    }
    let name = lws["metadata"]["name"]
        .as_str()
        .context("LeaderWorkerSet without a name")?
        .to_owned();
    controller::apply_when_served(&client, &lws, Some(NAMESPACE)).await?;
    let created = Instant::now();
    let running = watch_group(tb, &name, created, options.timeout, report).await;

    // Step 4: the checks, on whatever ran.
    if let Err(e) = running {
        report.failures.push(format!("{e:#}"));
    } else {
        check_group(tb, &name, &ids, report).await?;
    }
    let deleted = Instant::now();
    lws_api(&client, Some(NAMESPACE))
        .delete(&name, &DeleteParams::foreground())
        .await?;
    // The deletion reaches the pods through the garbage collector, which
    // learns of a new kind (the CRD above) only at its next discovery
    // resync (every 30 s in kube-controller-manager): both times are kept.
    loop {
        let pods = group_pods(tb, &name).await?;
        if report.deletion_started_s.is_none()
            && pods.iter().any(|p| p.metadata.deletion_timestamp.is_some())
        {
            report.deletion_started_s = Some(deleted.elapsed().as_secs_f64());
        }
        if pods.is_empty() {
            report.gone_s = Some(deleted.elapsed().as_secs_f64());
            break;
        }
        if deleted.elapsed() > Duration::from_secs(120) {
            report.failures.push(format!(
                "{} pod(s) left 120 s after the deletion",
                pods.len()
            ));
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// LeaderWorkerSets of `ns` (of every namespace without one).
fn lws_api(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
    ));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// The run's namespace, once its `default` ServiceAccount exists (pods
/// are refused before).
async fn namespace(tb: &LocalTestbed) -> Result<()> {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    e2e::manifests::apply(&tb.client(), &ns, None).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(tb.client(), NAMESPACE);
    kit::wait_for(
        tb,
        "the default ServiceAccount",
        Duration::from_secs(60),
        || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
    )
    .await
}

/// The example's LeaderWorkerSet, each pod template adapted to the testbed
/// as the suite adapts a pod, and its other objects as written.
fn example(tb: &LocalTestbed, path: &Path) -> Result<(Value, Vec<Value>)> {
    let objs = e2e::manifests::read(path)?;
    let (mut sets, others): (Vec<Value>, Vec<Value>) = objs
        .into_iter()
        .partition(|o| o["kind"] == "LeaderWorkerSet");
    let mut lws = sets
        .pop()
        .filter(|_| sets.is_empty())
        .ok_or_else(|| anyhow!("{} needs exactly one LeaderWorkerSet", path.display()))?;
    for template in ["leaderTemplate", "workerTemplate"] {
        let t = &mut lws["spec"]["leaderWorkerTemplate"][template];
        if !t.is_null() {
            tb.adapt_pod(t);
        }
    }
    Ok((lws, others))
}

/// The group's pods, by name.
async fn group_pods(tb: &LocalTestbed, name: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), NAMESPACE);
    let lp = ListParams::default().labels(&format!("{SET_NAME_LABEL}={name}"));
    let mut list = pods.list(&lp).await?.items;
    list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(list)
}

fn is_leader(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(WORKER_INDEX_LABEL))
        .is_some_and(|i| i == "0")
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Polls the group until its pods all run, noting when each step was first
/// seen.
async fn watch_group(
    tb: &LocalTestbed,
    name: &str,
    created: Instant,
    timeout: Duration,
    report: &mut LwsReport,
) -> Result<()> {
    let at = || Some(created.elapsed().as_secs_f64());
    loop {
        let pods = group_pods(tb, name).await?;
        let bound = |p: &Pod| p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if let Some(leader) = pods.iter().find(|p| is_leader(p)) {
            report.leader_created_s = report.leader_created_s.or_else(at);
            if bound(leader) {
                report.leader_bound_s = report.leader_bound_s.or_else(at);
            }
        }
        if pods.len() >= GROUP_SIZE {
            report.all_created_s = report.all_created_s.or_else(at);
            if pods.iter().all(bound) {
                report.all_bound_s = report.all_bound_s.or_else(at);
            }
            if pods.iter().all(is_running) {
                report.all_running_s = at();
                return Ok(());
            }
        }
        if created.elapsed() > timeout {
            let states: Vec<String> = pods
                .iter()
                .map(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    format!("{:?} {phase:?} on {node:?}", p.metadata.name)
                })
                .collect();
            anyhow::bail!(
                "after {}s the group has {} pod(s), want {GROUP_SIZE} Running: {states:?}",
                timeout.as_secs(),
                pods.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Scenario 27's checks on the group, and LWS's own: the exclusive
/// affinity in the leader, the workers pinned to its UltraServer, and
/// `LWS_LEADER_ADDRESS` naming the leader in every container.
async fn check_group(
    tb: &LocalTestbed,
    name: &str,
    ids: &BTreeMap<String, (String, String)>,
    report: &mut LwsReport,
) -> Result<()> {
    let pods = group_pods(tb, name).await?;
    let nodes: Api<Node> = Api::all(tb.client());
    let mut members = Vec::new();
    for pod in &pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let (node, neuron_env) = match aws_claims::whole_node_member(tb, NAMESPACE, &pod_name).await
        {
            Ok(m) => m,
            Err(e) => {
                report.failures.push(format!("{pod_name}: {e:#}"));
                continue;
            }
        };
        let probe = kit::probe(tb, NAMESPACE, &pod_name).await?;
        let mut env: BTreeMap<String, String> = probe
            .env
            .into_iter()
            .filter(|(k, _)| k.starts_with("LWS_") || k.starts_with("NEURON_RT_ULTRASERVER"))
            .collect();
        env.extend(
            neuron_env
                .clone()
                .into_iter()
                .filter(|(k, _)| k.starts_with("NEURON_RT_ULTRASERVER")),
        );
        let labels = nodes.get(&node).await?.metadata.labels.unwrap_or_default();
        report.pods.push(GroupPod {
            name: pod_name,
            role: if is_leader(pod) { "leader" } else { "worker" }.into(),
            ultraserver_id: labels.get(SERVER_ID_4).cloned().unwrap_or_default(),
            node: node.clone(),
            env,
        });
        members.push((node, neuron_env));
    }
    if let Err(e) = aws_claims::check_group_of_4(&members, ids) {
        report.failures.push(format!("{e:#}"));
    }
    // LWS_LEADER_ADDRESS is <name>-<group>.<subdomain>.<namespace>; the
    // subdomain is the LeaderWorkerSet's headless Service, named after it.
    let want = format!("{name}-0.{name}.{NAMESPACE}");
    for p in &report.pods {
        let got = p.env.get("LWS_LEADER_ADDRESS");
        if got != Some(&want) {
            report.failures.push(format!(
                "{}: LWS_LEADER_ADDRESS={got:?}, want {want:?}",
                p.name
            ));
        }
    }
    let lws_key = lws_annotation(&pods);
    if let Some(leader) = pods.iter().find(|p| is_leader(p)) {
        report.leader_affinity_keys = leader
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|terms| terms.iter().map(|t| t.topology_key.clone()).collect())
            .unwrap_or_default();
    }
    if let Some(worker) = pods.iter().find(|p| !is_leader(p)) {
        report.worker_node_selector = worker
            .spec
            .as_ref()
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
    }
    if lws_key.as_deref() != Some(SERVER_ID_4)
        || !report.leader_affinity_keys.iter().any(|k| k == SERVER_ID_4)
        || !report.worker_node_selector.contains_key(SERVER_ID_4)
    {
        report.failures.push(format!(
            "exclusive placement not applied: pods' {EXCLUSIVE_TOPOLOGY} {lws_key:?}, leader affinity {:?}, workers' node selector {:?}",
            report.leader_affinity_keys, report.worker_node_selector
        ));
    }
    if pods.len() != GROUP_SIZE {
        report
            .failures
            .push(format!("{} pods, want {GROUP_SIZE}", pods.len()));
    }
    Ok(())
}

/// The `exclusive-topology` annotation LWS copies onto its pods.
fn lws_annotation(pods: &[Pod]) -> Option<String> {
    pods.iter().find_map(|p| {
        p.metadata
            .annotations
            .as_ref()?
            .get(EXCLUSIVE_TOPOLOGY)
            .cloned()
    })
}
