//! `cargo xtask demo [--once]`: the drivers on a local cluster, with the
//! examples applied and their allocations shown side by side.
//!
//! Builds what is missing (as `cargo xtask e2e --cluster local` does),
//! starts the local testbed (`p5`: efa-driver + the test GPU driver; `trn2`:
//! efa-driver + neuron-driver; charts' RBAC and admission policy), applies a
//! set of `examples/` that fit together on those two nodes into namespace
//! `demo`, waits for the pods, and prints one row per allocated device:
//! claim → node → device → pcieRoot and the claim's `matchAttribute` value,
//! so the alignment is visible. Then it leaves everything running with the
//! kubeconfig printed until Ctrl-C; `--once` tears down after printing.
//! `--charts` installs the drivers as a platform team would, with `helm
//! upgrade --install` of the charts (DaemonSet pods; the end-to-end suite's
//! chart testbed) instead of running them as host processes.
//!
//! It runs the main Kubernetes release (`crates/local-cluster/src/versions.rs`;
//! `--kubernetes 1.34` for the oldest) and builds `kubectl` of the same
//! release, so that a newcomer without one can paste the commands it prints.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::scenarios::kit;
use e2e::scenarios::registration::all_registered;
use e2e::{ChartTestbed, LocalOptions, LocalTestbed, ManagedTestbed, Testbed};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::Value;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Tear the cluster down after printing the table.
    #[arg(long)]
    once: bool,
    /// Install the drivers from the Helm charts (DaemonSet pods).
    #[arg(long)]
    charts: bool,
    /// Kubernetes release: a minor (`1.37`, `1.34`) or an exact version.
    #[arg(long, alias = "k8s-version", default_value_t = format!("1.{}", local_cluster::versions::MAIN_MINOR))]
    kubernetes: String,
}

const NAMESPACE: &str = "demo";

/// How long the nodes have to report Ready once the cluster is up (each
/// node's containerd loads its CNI config at start; kubelet reports the
/// network ready at its next status update, every 10 s).
const NODES_READY_WAIT: Duration = Duration::from_secs(60);

/// How long the drivers have, after that, to be registered with their
/// kubelets (seconds after their pools are published, as a rule).
const REGISTERED_WAIT: Duration = Duration::from_secs(60);

/// Example files applied, in order (pods in files without one are created
/// for the named template). Chosen to fit together: 16 chips and 16 EFAs on
/// trn2, 8 GPUs and 32 EFAs on p5.
const EXAMPLES: &[(&str, Option<&str>)] = &[
    // First: it names root pci0000:44, whose GPU another claim could take.
    (
        "gpu-efa/gpu-all-efas-on-root.yaml",
        Some("gpu-all-efas-on-root"),
    ),
    ("gpu-efa/gpu-efa-same-pcie-root.yaml", None),
    (
        "gpu-efa/gpu-efas-on-root-count.yaml",
        Some("gpu-4-efas-same-root"),
    ),
    ("neuron/neuron-8-chips-with-efas.yaml", None),
    ("neuron/neuron-4-chips-with-efas.yaml", None),
    ("neuron/neuron-lnc-per-claim.yaml", None),
    ("efa/single-efa.yaml", None),
    ("efa/shared-efa-claim.yaml", None),
];

pub fn run(args: DemoArgs) -> Result<()> {
    let root = crate::paths::repo_root();
    let version = e2e::KubernetesVersion::resolve(&args.kubernetes)?;
    let bin_dir = crate::e2e::build_prerequisites(&root, false, &version, true)?;
    let kubectl = e2e::Binaries::locate(&version)?.kubectl;
    let options = LocalOptions {
        bin_dir: Some(bin_dir),
        kubernetes_version: version.clone(),
        // The drivers' defaults (the testbeds opt in to NeuronCores): what
        // a cluster that installs them as they are gets.
        driver_env: Vec::new(),
        ..LocalOptions::default()
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let started = Instant::now();
        if args.charts {
            eprintln!(
                "==> demo: Kubernetes {version}: starting the local cluster, installing the charts"
            );
            let tb = ChartTestbed::start_local(&options).await?;
            present(tb, started, args.once, &kubectl).await
        } else {
            eprintln!("==> demo: Kubernetes {version}: starting the local cluster and the drivers");
            let tb = LocalTestbed::start(options).await?;
            present(tb, started, args.once, &kubectl).await
        }
    })
}

/// Ready-to-paste commands for the running demo, with the kubectl built for
/// its release and its kubeconfig.
fn commands(
    kubectl: &std::path::Path,
    kubeconfig: &std::path::Path,
    pod: Option<&str>,
) -> Vec<String> {
    let k = format!(
        "{} --kubeconfig {}",
        kubectl.display(),
        kubeconfig.display()
    );
    let mut out = vec![
        format!("{k} get resourceslices -o wide"),
        format!("{k} get resourceclaims -n {NAMESPACE}"),
        format!("{k} get pods -n {NAMESPACE} -o wide"),
    ];
    if let Some(pod) = pod {
        out.push(format!("{k} describe pod -n {NAMESPACE} {pod}"));
    }
    out
}

/// Applies the examples and prints the table, then (unless `once`) waits for
/// Ctrl-C, and tears the testbed down.
async fn present(
    tb: impl ManagedTestbed,
    started: Instant,
    once: bool,
    kubectl: &std::path::Path,
) -> Result<()> {
    eprintln!("==> demo: up in {:.1}s", started.elapsed().as_secs_f64());
    let result = async {
        eprintln!("==> demo: {}", nodes_ready(&tb).await?);
        eprintln!("==> demo: {}", drivers_registered(&tb).await?);
        apply_and_print(&tb).await
    }
    .await;
    if let Err(e) = &result {
        eprintln!("demo: {e:#}");
    }
    eprintln!("\nexport KUBECONFIG={}", tb.admin_kubeconfig().display());
    eprintln!("logs: {}", tb.run_dir().display());
    eprintln!("\nTry (kubectl of the same release, built here):");
    let first_pod = EXAMPLES
        .iter()
        .find_map(|(_, template)| template.map(|t| format!("{t}-pod")));
    for command in commands(kubectl, tb.admin_kubeconfig(), first_pod.as_deref()) {
        println!("  {command}");
    }
    if !once {
        eprintln!("==> running; Ctrl-C tears it down.");
        // The cluster's SIGINT handler tears down and exits.
        std::future::pending::<()>().await;
    }
    let report = tb.shutdown();
    anyhow::ensure!(report.is_clean(), "teardown left {report:?}");
    eprintln!("==> torn down cleanly");
    result
}

/// Waits for every Node to report Ready: a line naming them, or an error
/// with each node's Ready condition as it last was.
async fn nodes_ready(tb: &impl Testbed) -> Result<String> {
    let nodes: Api<Node> = Api::all(tb.client());
    let deadline = Instant::now() + NODES_READY_WAIT;
    loop {
        let listed = nodes.list(&Default::default()).await?.items;
        let states: Vec<(String, Option<String>)> = listed
            .iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), not_ready(n)))
            .collect();
        if !states.is_empty() && states.iter().all(|(_, why)| why.is_none()) {
            let names: Vec<&str> = states.iter().map(|(n, _)| n.as_str()).collect();
            return Ok(format!("nodes Ready: {}", names.join(", ")));
        }
        if Instant::now() >= deadline {
            let waiting: Vec<String> = states
                .into_iter()
                .filter_map(|(n, why)| Some(format!("{n}: {}", why?)))
                .collect();
            anyhow::bail!(
                "nodes not Ready after {NODES_READY_WAIT:?}: {}",
                waiting.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits until the kubelet of every node has registered each of its
/// drivers (`aws_dra_plugin_registered 1` on the driver's `/metrics`). A
/// published pool is not enough: the scheduler allocates from it at once,
/// and a pod whose driver the kubelet has not registered yet fails its
/// prepare and is retried only at the kubelet's next sync of the pod, a
/// minute later (kubernetes#139836; the first example pod waited 63.6 s so).
async fn drivers_registered(tb: &impl Testbed) -> Result<String> {
    let count = all_registered(tb, REGISTERED_WAIT).await?;
    Ok(format!("{count} drivers registered with their kubelets"))
}

/// Why `node` is not Ready (its Ready condition's reason and message), or
/// `None` when it is.
fn not_ready(node: &Node) -> Option<String> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[]);
    match conditions.iter().find(|c| c.type_ == "Ready") {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "{} {}",
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        )),
        None => Some("no Ready condition yet".into()),
    }
}

async fn apply_and_print(tb: &impl Testbed) -> Result<()> {
    kit::namespace(tb, NAMESPACE).await?;
    let dir = e2e::host_env::examples_dir();
    let mut pods = Vec::new();
    for (file, template) in EXAMPLES {
        let objs = kit::example(tb, &dir.join(file), None)?;
        let mut objs: Vec<Value> = objs;
        if let Some(t) = template {
            objs.push(kit::pod_with_claim(
                tb,
                &format!("{t}-pod"),
                Some(t),
                None,
                None,
            ));
        }
        pods.extend(
            objs.iter()
                .filter(|o| o["kind"] == "Pod")
                .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned)),
        );
        kit::apply_all(tb, NAMESPACE, &objs)
            .await
            .with_context(|| format!("applying {file}"))?;
        eprintln!("    applied examples/{file}");
        // In order: a later claim must not take what an earlier one needs.
        for p in objs.iter().filter(|o| o["kind"] == "Pod") {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            if let Err(e) = kit::running(tb, NAMESPACE, name, Duration::from_secs(120)).await {
                eprintln!("    {name} is not running: {e:#}");
            }
        }
    }
    print_table(tb).await
}

async fn print_table(tb: &impl Testbed) -> Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), NAMESPACE);
    let mut rows: Vec<[String; 6]> = Vec::new();
    for claim in claims.list(&Default::default()).await?.items {
        let name = claim.metadata.name.clone().unwrap_or_default();
        let users: Vec<String> = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.name)
            .collect();
        // The claim's matchAttribute (the alignment it asked for), if any.
        let aligned_on = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.constraints.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.match_attribute.clone());
        let allocated = kit::allocation(&claim);
        if allocated.is_empty() {
            rows.push([
                name,
                users.join(","),
                "-".into(),
                "(not allocated)".into(),
                String::new(),
                String::new(),
            ]);
            continue;
        }
        for (i, a) in allocated.iter().enumerate() {
            let device = kit::published(tb, a).await.ok();
            let root = device
                .as_ref()
                .and_then(|d| kit::attr_str(d, "resource.kubernetes.io/pcieRoot"))
                .unwrap_or_else(|| "-".into());
            let align = match (&aligned_on, &device) {
                (Some(attr), Some(d)) => format!(
                    "{}={}",
                    attr.rsplit('/').next().unwrap_or(attr),
                    kit::attr_str(d, attr).unwrap_or_else(|| "-".into())
                ),
                _ => String::new(),
            };
            let first = i == 0;
            rows.push([
                if first { name.clone() } else { String::new() },
                if first {
                    users.join(",")
                } else {
                    String::new()
                },
                a.pool.clone(),
                format!("{} {}", short_driver(&a.driver), a.device),
                root,
                align,
            ]);
        }
    }
    let header = ["CLAIM", "PODS", "NODE", "DEVICE", "PCIE ROOT", "ALIGNED ON"];
    let mut widths: BTreeMap<usize, usize> = BTreeMap::new();
    for row in rows
        .iter()
        .map(|r| r.each_ref().map(|c| c.len()))
        .chain([header.map(str::len)])
    {
        for (i, w) in row.iter().enumerate() {
            let e = widths.entry(i).or_default();
            *e = (*e).max(*w);
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[&i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!();
    println!("{}", line(&header.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
    Ok(())
}

fn short_driver(driver: &str) -> &str {
    match driver {
        "efa.networking.k8s.aws" => "efa",
        "neuron.aws.com" => "neuron",
        "gpu.nvidia.com" => "gpu",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: Option<(&str, &str)>) -> Node {
        Node {
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: ready.map(|(status, message)| {
                    vec![k8s_openapi::api::core::v1::NodeCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        reason: Some("KubeletNotReady".into()),
                        message: Some(message.into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_ready_only_on_its_ready_condition() {
        assert_eq!(not_ready(&node(Some(("True", "")))), None);
        let why = not_ready(&node(Some((
            "False",
            "container runtime network not ready: cni plugin not initialized",
        ))))
        .unwrap();
        assert!(why.contains("cni plugin not initialized"), "{why}");
        assert_eq!(
            not_ready(&node(None)).as_deref(),
            Some("no Ready condition yet")
        );
        assert!(not_ready(&Node::default()).is_some());
    }

    #[test]
    fn printed_commands_name_the_kubectl_and_kubeconfig() {
        let cmds = commands(
            std::path::Path::new("/c/kubectl"),
            std::path::Path::new("/r/admin.kubeconfig"),
            Some("p"),
        );
        assert_eq!(cmds.len(), 4);
        for c in &cmds {
            assert!(
                c.starts_with("/c/kubectl --kubeconfig /r/admin.kubeconfig "),
                "{c}"
            );
        }
        assert!(cmds[0].ends_with("get resourceslices -o wide"));
        assert!(cmds[1].ends_with("get resourceclaims -n demo"));
        assert!(cmds[3].ends_with("describe pod -n demo p"));
    }
}
