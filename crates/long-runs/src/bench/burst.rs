//! Bursts: N pods, each with its own one-device claim, created at once on
//! one node, as a training job lands them. What a user feels is
//! how long the last pod waits, so a burst is timed three ways:
//!
//! - every NodePrepareResources / NodeUnprepareResources call as kubelet
//!   itself timed it: its DRA plugin client logs the start and the end of
//!   each call at verbosity 4 (`dra_plugin.go`, which the local testbed's
//!   kubelets run at `--vmodule=dra_plugin=4`), with microsecond time
//!   stamps and the claim UIDs of the request and of the response, so each
//!   call's latency and the span from the first call to the last answer
//!   come from kubelet's clock, whatever the driver says of itself;
//! - kubelet's `dra_grpc_operations_duration_seconds` histogram (calls and
//!   summed seconds), which must agree with the log's calls;
//! - the pods as the API shows them: all created at once → the last one
//!   Running, and deletion → the last one gone.
//!
//! And what the node's CPUs did meanwhile: from all pods created to the last
//! one Running, the CPU time the whole machine spent busy (`/proc/stat`:
//! every state but idle and iowait), against what its CPUs could give in
//! that time, and the driver's own CPU time (`/proc/<pid>/stat`). A burst
//! whose machine was busy all along is bound by the work of starting the
//! pods (kubelet, containerd, runc, the control plane), which both drivers'
//! pods need alike; the driver's share says what the driver adds to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::json;

use super::measure::Stats;
use super::process_cpu::Snapshot;
use super::rounds::{self, NAMESPACE, grpc_totals, kube_err, kubelet_metrics};
use local_cluster::error::{Error, Result};

const BURST_TIMEOUT: Duration = Duration::from_secs(300);

/// One kubelet → driver call, from kubelet's log.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Seconds since midnight (kubelet's clock) of the call and its answer.
    pub start: f64,
    pub end: f64,
    pub claims: BTreeSet<String>,
}

/// Kubelet's calls of `method` (`NodePrepareResources` or
/// `NodeUnprepareResources`) to `driver` in `log`, each start paired with
/// the answer that names the same claims (calls overlap in a burst).
pub fn kubelet_calls(log: &str, driver: &str, method: &str) -> Vec<Call> {
    // Kubelet spells the unprepare start without the plural.
    let calling = if method == "NodeUnprepareResources" {
        "\"Calling NodeUnprepareResource rpc\"".to_string()
    } else {
        format!("\"Calling {method} rpc\"")
    };
    let done = format!("\"Done calling {method} rpc\"");
    let driver_field = format!("driverName=\"{driver}\"");
    let mut open: Vec<(f64, BTreeSet<String>)> = Vec::new();
    let mut calls = Vec::new();
    for line in log.lines().filter(|l| l.contains(&driver_field)) {
        let Some(at) = klog_time(line) else { continue };
        if line.contains(&calling) {
            open.push((at, uuids(line)));
        } else if line.contains(&done) {
            let answered = uuids(line);
            // The earliest open call whose claims the answer names (an
            // answer of an error names none: then the earliest open call).
            let pick = open
                .iter()
                .position(|(_, c)| !answered.is_empty() && *c == answered)
                .or_else(|| (answered.is_empty() && !open.is_empty()).then_some(0));
            if let Some(i) = pick {
                let (start, claims) = open.remove(i);
                calls.push(Call {
                    start,
                    end: at,
                    claims,
                });
            }
        }
    }
    calls
}

/// The time of a klog text header (`I1203 18:42:09.123456   1234 file.go:97] ...`),
/// seconds since midnight.
fn klog_time(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Every UUID (8-4-4-4-12 lower-case hex) in `text`.
fn uuids(text: &str) -> BTreeSet<String> {
    const SHAPE: [usize; 5] = [8, 4, 4, 4, 12];
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    let mut i = 0;
    while i + 36 <= bytes.len() {
        let mut j = i;
        let mut ok = i == 0 || !hex(bytes[i - 1]);
        for (k, len) in SHAPE.iter().enumerate() {
            ok = ok && bytes[j..j + len].iter().all(|&b| hex(b));
            j += len;
            if k < 4 {
                ok = ok && bytes.get(j) == Some(&b'-');
                j += 1;
            }
        }
        ok = ok && bytes.get(j).is_none_or(|&b| !hex(b));
        if ok {
            found.insert(text[i..i + 36].to_string());
            i += 36;
        } else {
            i += 1;
        }
    }
    found
}

/// What one burst measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Burst {
    pub driver: String,
    pub pods: usize,
    pub index: usize,
    /// Kubelet's prepare calls: each call's latency, ms (kubelet's log).
    pub prepare_call_ms: Vec<f64>,
    /// First prepare call → last prepare answer, ms (kubelet's log).
    pub prepare_span_ms: f64,
    /// Kubelet's histogram over the burst: calls and summed seconds.
    pub prepare_hist_calls: u64,
    pub prepare_hist_s: f64,
    pub unprepare_call_ms: Vec<f64>,
    pub unprepare_span_ms: f64,
    pub unprepare_hist_calls: u64,
    pub unprepare_hist_s: f64,
    /// All pods created (at once) → the last one observed Running, ms.
    pub created_to_last_running_ms: f64,
    /// All pods deleted (at once) → the last one observed gone, ms.
    pub deleted_to_last_gone_ms: f64,
    /// CPU time the machine spent busy from all pods created to the last
    /// one Running, all CPUs together, ms (`None` in reports from before).
    #[serde(default)]
    pub node_busy_ms: Option<f64>,
    /// The machine's CPUs (what `node_busy_ms` is measured against).
    #[serde(default)]
    pub node_cpus: usize,
    /// The driver's own CPU time in the same window, ms.
    #[serde(default)]
    pub driver_cpu_ms: Option<f64>,
    /// When all pods were created, unix seconds: with
    /// `created_to_last_running_ms`, the window in which the driver's claim
    /// GETs are looked up in the audit log.
    #[serde(default)]
    pub created_unix: Option<f64>,
    /// The API server's time for each claim GET of the driver in that
    /// window, ms (audit log; filled in once every burst has run): the part
    /// of a prepare call that the server, not the driver, spends.
    #[serde(default)]
    pub claim_get_server_ms: Vec<f64>,
    /// CPU time per process name in the same window as `node_busy_ms`, ms
    /// ([`super::process_cpu`]): which of kubelet, containerd, the shims,
    /// the control plane or the driver the burst kept busy.
    #[serde(default)]
    pub cpu_by_process_ms: BTreeMap<String, f64>,
}

impl Burst {
    pub fn prepare_stats(&self) -> Stats {
        Stats::of(&self.prepare_call_ms)
    }
    pub fn unprepare_stats(&self) -> Stats {
        Stats::of(&self.unprepare_call_ms)
    }
}

fn span_ms(calls: &[Call]) -> f64 {
    let first = calls.iter().map(|c| c.start).fold(f64::INFINITY, f64::min);
    let last = calls
        .iter()
        .map(|c| c.end)
        .fold(f64::NEG_INFINITY, f64::max);
    if calls.is_empty() {
        0.0
    } else {
        (last - first) * 1e3
    }
}

/// Where a burst runs and of which driver.
pub struct Target<'a> {
    pub node: &'a str,
    /// The node's kubelet log.
    pub kubelet_log: &'a Path,
    pub driver: &'a str,
    /// The device class of its claims.
    pub class: &'a str,
    /// A short name for the objects' names.
    pub short: &'a str,
    /// A CEL selector of the claims' request, if any.
    pub selector: Option<&'a str>,
    /// The driver's process, for its CPU time in the burst.
    pub pid: Option<i32>,
}

/// Runs burst `index` of `pods` pods on `target`.
pub async fn run_burst(
    client: &kube::Client,
    target: &Target<'_>,
    pods: usize,
    index: usize,
) -> Result<Burst> {
    let Target {
        node,
        kubelet_log,
        driver,
        class,
        short,
        selector,
        pid,
    } = *target;
    let label = format!("{short}-{pods}-{index}");
    let names: Vec<String> = (0..pods).map(|i| format!("burst-{label}-{i:02}")).collect();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for name in &names {
        claims
            .create(
                &PostParams::default(),
                &rounds::claim(name, class, selector)?,
            )
            .await
            .map_err(kube_err(format!("creating claim {name}")))?;
    }
    let log_from = std::fs::metadata(kubelet_log).map(|m| m.len()).unwrap_or(0);
    let before = kubelet_metrics(client, node).await?;
    let selector = format!("burst={label}");
    let events = watcher(
        pod_api.clone(),
        watcher::Config::default().labels(&selector),
    );
    let mut events = std::pin::pin!(events);
    let mut running: BTreeSet<String> = BTreeSet::new();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    let deadline = Instant::now() + BURST_TIMEOUT;
    // The watch's initial (empty) list first, so no transition is missed.
    while let Ok(Some(Ok(event))) = tokio::time::timeout_at(deadline.into(), events.next()).await {
        if matches!(event, watcher::Event::InitDone) {
            break;
        }
    }
    // Before the clock starts: the walk of /proc is not the pods' wait.
    let processes_before = Snapshot::now();
    let created_at = Instant::now();
    let created_unix = super::measure::unix_now();
    let cpu_before = (
        node_busy_seconds(),
        pid.and_then(super::idle::proc_cpu_seconds),
    );
    let pods_to_create = names
        .iter()
        .map(|name| rounds::pod(name, node, json!({"burst": label})))
        .collect::<Result<Vec<Pod>>>()?;
    let creates = names.iter().zip(&pods_to_create).map(|(name, pod)| {
        let api = pod_api.clone();
        async move {
            api.create(&PostParams::default(), pod)
                .await
                .map_err(kube_err(format!("creating pod {name}")))
        }
    });
    for created in join_all(creates).await {
        created?;
    }
    let mut last_running = created_at;
    while running.len() < pods {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        let Ok(Some(event)) = next else {
            return Err(Error::Testbed(format!(
                "burst {label}: {} of {pods} pods Running within {BURST_TIMEOUT:?}",
                running.len()
            )));
        };
        let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event else {
            continue;
        };
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && running.insert(p.metadata.name.clone().unwrap_or_default())
        {
            last_running = Instant::now();
        }
    }
    let created_to_last_running_ms = last_running.duration_since(created_at).as_secs_f64() * 1e3;
    // Read once all are Running (a watch event later than the last one's
    // transition by at most its delivery).
    let cpu_after = (
        node_busy_seconds(),
        pid.and_then(super::idle::proc_cpu_seconds),
    );
    let cpu_by_process_ms =
        processes_before.growth_ms(&Snapshot::now(), super::idle::clock_ticks());
    let busy = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (b - a) * 1e3);
    let prepared = kubelet_metrics(client, node).await?;

    let deleted_at = Instant::now();
    pod_api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
        .map_err(kube_err(format!("deleting the pods of burst {label}")))?;
    let mut last_gone = deleted_at;
    while gone.len() < pods {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        let Ok(Some(event)) = next else {
            return Err(Error::Testbed(format!(
                "burst {label}: {} of {pods} pods gone within {BURST_TIMEOUT:?}",
                gone.len()
            )));
        };
        if let Ok(watcher::Event::Delete(p)) = event
            && gone.insert(p.metadata.name.clone().unwrap_or_default())
        {
            last_gone = Instant::now();
        }
    }
    let deleted_to_last_gone_ms = last_gone.duration_since(deleted_at).as_secs_f64() * 1e3;
    // Kubelet unprepares once a pod's containers are gone; wait for every call.
    let (_, un0) = grpc_totals(&before, driver, "NodeUnprepareResources");
    let mut after = kubelet_metrics(client, node).await?;
    while grpc_totals(&after, driver, "NodeUnprepareResources").1 < un0 + pods as u64 {
        if Instant::now() > deadline {
            return Err(Error::Testbed(format!(
                "burst {label}: kubelet did not unprepare every claim"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = kubelet_metrics(client, node).await?;
    }
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .map_err(kube_err(format!("deleting the claims of burst {label}")))?;

    let log = read_from(kubelet_log, log_from)?;
    let prepares = kubelet_calls(&log, driver, "NodePrepareResources");
    let unprepares = kubelet_calls(&log, driver, "NodeUnprepareResources");
    let delta = |a: &str, b: &str, method: &str| {
        let (s0, n0) = grpc_totals(a, driver, method);
        let (s1, n1) = grpc_totals(b, driver, method);
        (n1 - n0, s1 - s0)
    };
    let (prepare_hist_calls, prepare_hist_s) = delta(&before, &prepared, "NodePrepareResources");
    let (unprepare_hist_calls, unprepare_hist_s) = delta(&before, &after, "NodeUnprepareResources");
    if prepares.len() as u64 != prepare_hist_calls
        || unprepares.len() as u64 != unprepare_hist_calls
    {
        return Err(Error::Testbed(format!(
            "burst {label}: kubelet's log has {} prepare and {} unprepare calls of {driver}, its histogram {prepare_hist_calls} and {unprepare_hist_calls} (is kubelet running with --vmodule=dra_plugin=4?)",
            prepares.len(),
            unprepares.len()
        )));
    }
    let ms = |calls: &[Call]| calls.iter().map(|c| (c.end - c.start) * 1e3).collect();
    Ok(Burst {
        driver: driver.to_string(),
        pods,
        index,
        prepare_call_ms: ms(&prepares),
        prepare_span_ms: span_ms(&prepares),
        prepare_hist_calls,
        prepare_hist_s,
        unprepare_call_ms: ms(&unprepares),
        unprepare_span_ms: span_ms(&unprepares),
        unprepare_hist_calls,
        unprepare_hist_s,
        created_to_last_running_ms,
        deleted_to_last_gone_ms,
        node_busy_ms: busy(cpu_before.0, cpu_after.0),
        node_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        driver_cpu_ms: busy(cpu_before.1, cpu_after.1),
        created_unix: Some(created_unix),
        claim_get_server_ms: Vec::new(),
        cpu_by_process_ms,
    })
}

/// CPU time the machine has spent busy since boot, all CPUs together,
/// seconds: the first line of `/proc/stat` less its idle and iowait.
fn node_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_from_stat(&stat).map(|ticks| ticks as f64 / super::idle::clock_ticks())
}

fn busy_from_stat(stat: &str) -> Option<u64> {
    let line = stat.lines().next()?;
    let ticks: Vec<u64> = line
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks[..] else {
        return None;
    };
    Some(user + nice + system + irq + softirq + steal)
}

fn read_from(path: &Path, offset: u64) -> Result<String> {
    let bytes = std::fs::read(path).map_err(local_cluster::error::io("reading", path))?;
    let from = usize::try_from(offset).unwrap_or(0).min(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[from..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0b1c2d3e-0000-4000-8000-00000000000a";
    const B: &str = "0b1c2d3e-0000-4000-8000-00000000000b";

    fn line(time: &str, what: &str, driver: &str, uid: &str) -> String {
        format!(
            "I1203 {time}    4242 dra_plugin.go:97] \"{what}\" logger=\"dra-plugin\" driverName=\"{driver}\" endpoint=\"/x\" request=\"&Req{{Claims:[]*Claim{{&Claim{{Namespace:bench,UID:{uid},Name:n,}},}},}}\""
        )
    }

    #[test]
    fn overlapping_calls_pair_by_their_claims() {
        let log = [
            line(
                "10:00:00.100000",
                "Calling NodePrepareResources rpc",
                "d",
                A,
            ),
            line(
                "10:00:00.150000",
                "Calling NodePrepareResources rpc",
                "d",
                B,
            ),
            line(
                "10:00:00.160000",
                "Calling NodePrepareResources rpc",
                "other",
                A,
            ),
            line(
                "10:00:00.300000",
                "Done calling NodePrepareResources rpc",
                "d",
                B,
            ),
            line(
                "10:00:00.400000",
                "Done calling NodePrepareResources rpc",
                "d",
                A,
            ),
            line(
                "10:00:01.000000",
                "Calling NodeUnprepareResource rpc",
                "d",
                A,
            ),
            line(
                "10:00:01.010000",
                "Done calling NodeUnprepareResources rpc",
                "d",
                A,
            ),
        ]
        .join("\n");
        let calls = kubelet_calls(&log, "d", "NodePrepareResources");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].claims, BTreeSet::from([B.to_string()]));
        assert!((calls[0].end - calls[0].start - 0.15).abs() < 1e-9);
        assert!((calls[1].end - calls[1].start - 0.3).abs() < 1e-9);
        assert!((span_ms(&calls) - 300.0).abs() < 1e-6);
        let un = kubelet_calls(&log, "d", "NodeUnprepareResources");
        assert_eq!(un.len(), 1);
        assert!((un[0].end - un[0].start - 0.01).abs() < 1e-9);
    }

    #[test]
    fn busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 50 9000 40 3 2 1 0 0\ncpu0 50 2 25 4500 20 1 1 0 0 0\n";
        assert_eq!(busy_from_stat(stat), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(
            busy_from_stat("cpu0 1 2 3 4 5 6 7 8\n"),
            None,
            "not the total"
        );
        assert_eq!(busy_from_stat("cpu  1 2 3\n"), None, "too few fields");
    }

    #[test]
    fn uuids_are_found_whole_only() {
        let text = format!("x{A}y map[{A}:&R] 0{B}");
        assert_eq!(uuids(&text), BTreeSet::from([A.to_string()]));
        assert!(uuids("0b1c2d3e-0000-4000-8000-00000000000").is_empty());
    }
}
