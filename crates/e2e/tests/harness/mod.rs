//! The scenario harness shared by `tests/scenarios.rs` (drivers as host
//! processes) and `tests/scenarios_chart.rs` (drivers from the Helm charts).
//!
//! `AWS_DRA_E2E_NODES=kind` (`e2e::kind_host::NodeList`) starts every node
//! of kind's node list at bring-up, so that the scenarios see the node set
//! they see on kind; unset, the testbed starts its own nodes and scenarios
//! add the rest when they first need them.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::kind_host::{NODES_ENV, NodeList};
use e2e::scenarios::{self, SCENARIOS};
use e2e::{Figures, ManagedTestbed};
use libtest_mimic::{Arguments, Failed, Trial};
use local_cluster::cluster::selected_kubernetes_version;
use local_cluster::versions::opt_in::Enablement;

/// Brings the testbed up with what the scenarios to run need turned on
/// beyond the release's defaults (empty unless a scenario names `gates`;
/// only a testbed offering `TestbedOp::EnableFeatureGates` runs those).
type Start<B> = Box<
    dyn Fn(Enablement) -> std::pin::Pin<Box<dyn std::future::Future<Output = e2e::Result<B>>>>
        + Send
        + Sync,
>;

/// How long, after bring-up, the kubelets have to register every driver.
const REGISTERED_AT_START: Duration = Duration::from_secs(60);

struct Shared<B: ManagedTestbed + 'static> {
    runtime: tokio::runtime::Runtime,
    /// `None` until the first scenario starts it; `Err` when bring-up failed.
    testbed: Mutex<Option<Result<Arc<B>, String>>>,
    /// Set when the testbed came up but a node of the node list did not
    /// start or a kubelet did not register one of its drivers: every
    /// scenario fails with it, and the testbed is still torn down at the end.
    incomplete: Mutex<Option<String>>,
    bring_up_ms: Mutex<u64>,
    start: Start<B>,
    /// The nodes the testbed starts with (`AWS_DRA_E2E_NODES`).
    node_list: NodeList,
    /// What bring-up turns on for the scenarios that run.
    enable: Enablement,
}

impl<B: ManagedTestbed + 'static> Shared<B> {
    fn testbed(&self) -> Result<Arc<B>, Failed> {
        let mut guard = self
            .testbed
            .lock()
            .map_err(|_| Failed::from("state poisoned"))?;
        if guard.is_none() {
            let started = Instant::now();
            let extra = self.node_list.bring_up_nodes();
            eprintln!(
                "aws-dra-e2e: {}",
                describe_node_list(self.node_list, &extra)
            );
            let result = self
                .runtime
                .block_on((self.start)(self.enable.clone()))
                .map(Arc::new)
                .map_err(|e| format!("testbed bring-up failed: {e}"));
            if let Ok(tb) = &result {
                // Every node of the list, as a scenario would add it; a node
                // the testbed started already is left as it is.
                let added = self.runtime.block_on(async {
                    for (name, fixture, drivers) in &extra {
                        tb.ensure_node(name, fixture, drivers)
                            .await
                            .map_err(|e| format!("starting node {name} ({fixture}): {e}"))?;
                    }
                    Ok::<(), String>(())
                });
                // A complete pool comes before the kubelet knows the driver;
                // a pod in between fails its prepare and waits a minute for
                // the kubelet's next sync of it. Part of bring-up, so every
                // scenario starts from registered drivers.
                let complete = added.and_then(|()| {
                    self.runtime
                        .block_on(scenarios::registration::all_registered(
                            tb.as_ref(),
                            REGISTERED_AT_START,
                        ))
                        .map(|_| ())
                        .map_err(|e| format!("{e:#}"))
                });
                if let Err(e) = complete {
                    let why = format!("testbed bring-up failed: {e}");
                    eprintln!("aws-dra-e2e: {why}");
                    if let Ok(mut u) = self.incomplete.lock() {
                        *u = Some(why);
                    }
                }
            }
            if let Ok(mut ms) = self.bring_up_ms.lock() {
                *ms = started.elapsed().as_millis() as u64;
            }
            if let Ok(tb) = &result {
                let nodes: Vec<String> = tb.nodes().into_iter().map(|n| n.name).collect();
                eprintln!(
                    "aws-dra-e2e: testbed up in {:.1}s with nodes {}; KUBECONFIG={}",
                    started.elapsed().as_secs_f64(),
                    nodes.join(", "),
                    tb.admin_kubeconfig().display()
                );
            }
            *guard = Some(result);
        }
        if let Some(why) = self.incomplete.lock().ok().and_then(|u| u.clone()) {
            return Err(why.into());
        }
        match guard.as_ref() {
            Some(Ok(tb)) => Ok(tb.clone()),
            Some(Err(e)) => Err(e.as_str().into()),
            None => Err("testbed missing".into()),
        }
    }
}

/// The bring-up log line that says which node list is in use.
fn describe_node_list(list: NodeList, extra: &[(String, String, Vec<e2e::DriverKind>)]) -> String {
    if extra.is_empty() {
        return format!(
            "node list `{}`: the nodes the testbed starts itself (p5 and trn2 on the local \
             testbeds, scenarios adding theirs when they first need them; {NODES_ENV}=kind \
             starts kind's node list at bring-up)",
            list.name()
        );
    }
    let nodes: Vec<String> = extra.iter().map(|(n, f, _)| format!("{n} ({f})")).collect();
    format!(
        "node list `{}` ({NODES_ENV}): {} nodes started at bring-up, as on kind: {}",
        list.name(),
        extra.len(),
        nodes.join(", ")
    )
}

fn figures<B: ManagedTestbed + 'static>(shared: &Shared<B>, tb: &B) -> Figures {
    let mut f = Figures {
        bring_up_ms: shared.bring_up_ms.lock().map(|m| *m).unwrap_or(0),
        node_list: shared.node_list.name().to_string(),
        enabled: if shared.enable.is_empty() {
            String::new()
        } else {
            shared.enable.describe()
        },
        nodes: tb.nodes().into_iter().map(|n| n.name).collect(),
        ..Default::default()
    };
    for (node, kind, d) in tb.start_times() {
        f.start_to_slices_ms
            .push((node, kind.binary().to_string(), d.as_millis() as u64));
    }
    for node in tb.nodes() {
        for kind in &node.drivers {
            if let Ok(text) = shared
                .runtime
                .block_on(tb.driver_metrics(&node.name, *kind))
                && let Some((n, ms)) = scenarios::prepare_latency(&text)
            {
                f.prepare_latency
                    .push((node.name.clone(), kind.binary().to_string(), n, ms));
            }
            if let Some(kib) = tb.driver_rss_kib(&node.name, *kind) {
                f.rss_kib
                    .push((node.name.clone(), kind.binary().to_string(), kib));
            }
        }
    }
    f
}

fn print_figures(f: &Figures) {
    eprintln!("==> figures (measured, not asserted)");
    for line in f.lines() {
        eprintln!("{line}");
    }
}

/// Whether libtest's name filters select `name` (substring, or `--exact`).
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    };
    args.filter.as_deref().is_none_or(matches) && !args.skip.iter().any(|s| matches(s))
}

/// Runs the scenarios as libtest trials on the testbed `start` brings up;
/// figures go to the file named by the environment variable `figures_env`.
pub fn main<B: ManagedTestbed + 'static>(start: Start<B>, figures_env: &str) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("e2e=info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let node_list = match NodeList::from_env() {
        Ok(list) => list,
        Err(e) => {
            eprintln!("aws-dra-e2e: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut args = Arguments::from_args();
    // One cluster, scenarios in order.
    args.test_threads = Some(1);
    // Scenarios the release or the testbed cannot run are reported as
    // ignored, with the reason here and in the figures, never left out
    // silently.
    let version = selected_kubernetes_version();
    let release = match version.release() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("aws-dra-e2e: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut skips = Vec::new();
    let mut gated: Vec<&str> = Vec::new();
    let mut gates = Vec::new();
    for scenario in SCENARIOS {
        let name = scenario.name;
        let skip = match scenario.skip_reason(release) {
            Some(why) => Some((format!("on Kubernetes {version}"), why)),
            None => scenario
                .testbed_skip_reason(B::offers())
                .map(|why| ("on this testbed".to_string(), why)),
        };
        if selected(&args, name) {
            match &skip {
                Some((on, why)) => {
                    eprintln!("aws-dra-e2e: skipping {name} {on}: {why}");
                    skipped.push((name.to_string(), why.clone()));
                }
                None if !scenario.gates.is_empty() => {
                    gated.push(name);
                    gates.extend_from_slice(scenario.gates);
                }
                None => {}
            }
        }
        skips.push(skip.is_some());
    }
    // Features no release has on by default, for the scenarios that name
    // them: turned on for the whole cluster at bring-up (every scenario of
    // this run shares it), and said so.
    let enable = release.enablement(&gates);
    if !enable.is_empty() {
        eprintln!(
            "aws-dra-e2e: turning on at bring-up, for {}: {} ({})",
            gated.join(", "),
            enable.describe(),
            enable.reasons.join("; ")
        );
    }
    let shared = Arc::new(Shared {
        runtime: match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("tokio runtime: {e}");
                return ExitCode::FAILURE;
            }
        },
        testbed: Mutex::new(None),
        incomplete: Mutex::new(None),
        bring_up_ms: Mutex::new(0),
        start,
        node_list,
        enable,
    });
    let trials: Vec<Trial> = SCENARIOS
        .iter()
        .zip(skips)
        .map(|(scenario, skip)| {
            let shared = shared.clone();
            let name = scenario.name;
            Trial::test(name, move || {
                let tb = shared.testbed()?;
                let started = Instant::now();
                let result = shared.runtime.block_on(scenarios::run(tb.as_ref(), name));
                eprintln!(
                    "aws-dra-e2e: {name} took {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                result.map_err(|e| Failed::from(format!("{e:#}")))
            })
            .with_ignored_flag(skip)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);

    let taken = shared.testbed.lock().ok().and_then(|mut g| g.take());
    if let Some(Ok(tb)) = taken {
        let mut f = figures(&shared, &tb);
        f.kubernetes_version = version.to_string();
        f.passed = conclusion.num_passed;
        f.failed = conclusion.num_failed;
        f.skipped = skipped;
        print_figures(&f);
        if let Some(path) = std::env::var_os(figures_env)
            && let Ok(json) = serde_json::to_string_pretty(&f)
            && let Err(e) = std::fs::write(&path, json)
        {
            eprintln!("writing figures to {}: {e}", path.to_string_lossy());
        }
        if std::env::var_os("AWS_DRA_E2E_KEEP").is_some() {
            eprintln!(
                "==> AWS_DRA_E2E_KEEP: cluster left running; KUBECONFIG={}; Ctrl-C tears it down",
                tb.admin_kubeconfig().display()
            );
            shared.runtime.block_on(std::future::pending::<()>());
        }
        match Arc::try_unwrap(tb) {
            Ok(tb) => {
                let report = tb.shutdown();
                if !report.is_clean() {
                    eprintln!("teardown left {report:?}");
                    return ExitCode::FAILURE;
                }
            }
            Err(_) => eprintln!("testbed still referenced; dropped at exit"),
        }
    }
    conclusion.exit_code()
}
