//! One phase: `pods` pods of one claim kind created at once against the
//! shadow fleet, timed from the first create to the last bind (a pod watch
//! stamps each bind as it arrives), with the scheduler's histograms and the
//! control plane's CPU differenced over the phase; then every pod and
//! claim removed, and the claims' deallocation waited for, so that the
//! next phase finds the fleet empty.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, oneshot};

use super::claims::{ClaimKind, pod};
use super::metrics::{Histogram, SchedulerPort, total};
use super::report::{Latency, Phase};
use crate::bench::idle::proc_cpu_seconds;
use crate::bench::measure::{label, proc_memory_kib};
use crate::bench::rounds::kube_err;
use local_cluster::error::{Error, Result};

/// Requests in flight while creating or deleting many objects.
pub const CONCURRENCY: usize = 16;

/// The processes a phase measures.
pub struct Subjects<'a> {
    pub client: &'a kube::Client,
    pub namespace: &'a str,
    /// The node label the pods select.
    pub selector: (&'a str, &'a str),
    pub scheduler: &'a SchedulerPort,
    pub scheduler_pid: i32,
    pub apiserver_pid: i32,
    /// How long the pods may take to bind, and the claims to go.
    pub timeout: Duration,
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

/// The scheduler's figures of one scrape.
struct Scrape {
    sli: Histogram,
    attempt: Histogram,
    filter: Histogram,
    dra_filter: Histogram,
    results: [f64; 3],
}

const RESULTS: [&str; 3] = ["scheduled", "unschedulable", "error"];

impl Scrape {
    fn parse(text: &str) -> Scrape {
        Scrape {
            sli: Histogram::parse(
                text,
                "scheduler_pod_scheduling_sli_duration_seconds",
                |_| true,
            ),
            attempt: Histogram::parse(text, "scheduler_scheduling_attempt_duration_seconds", |l| {
                label(l, "result") == Some("scheduled")
            }),
            filter: Histogram::parse(
                text,
                "scheduler_framework_extension_point_duration_seconds",
                |l| label(l, "extension_point") == Some("Filter"),
            ),
            dra_filter: Histogram::parse(
                text,
                "scheduler_plugin_execution_duration_seconds",
                |l| {
                    label(l, "plugin") == Some("DynamicResources")
                        && label(l, "extension_point") == Some("Filter")
                },
            ),
            results: RESULTS.map(|r| {
                total(text, "scheduler_schedule_attempts_total", |l| {
                    label(l, "result") == Some(r)
                })
            }),
        }
    }
}

/// Watches the namespace's pods and stamps each pod's first bind.
pub(super) struct BindWatch {
    binds: mpsc::UnboundedReceiver<(String, Instant)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BindWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BindWatch {
    /// Returns once the watch's initial list is in.
    pub(super) async fn start(client: &kube::Client, namespace: &str) -> Result<BindWatch> {
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let (tx, binds) = mpsc::unbounded_channel();
        let (ready_tx, ready) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let pod = match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
                    Ok(Event::InitDone) => {
                        if let Some(r) = ready_tx.take() {
                            let _ = r.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let bound = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some();
                if let (true, Some(name)) = (bound, pod.metadata.name)
                    && tx.send((name, now)).is_err()
                {
                    return;
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready)
            .await
            .map_err(|_| Error::Testbed("the pod watch did not start in 30 s".into()))?
            .map_err(|_| Error::Testbed("the pod watch ended at its start".into()))?;
        Ok(BindWatch { binds, task })
    }

    /// The first bind of each of `names`, until all are bound or `deadline`.
    pub(super) async fn wait(
        &mut self,
        names: &[String],
        deadline: Instant,
    ) -> BTreeMap<String, Instant> {
        let mut bound = BTreeMap::new();
        while bound.len() < names.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.binds.recv()).await {
                Ok(Some((name, at))) => {
                    bound.entry(name).or_insert(at);
                }
                Ok(None) | Err(_) => break,
            }
        }
        bound
    }
}

/// Runs one phase of `pods` pods of claim kind `kind`.
pub async fn run(s: &Subjects<'_>, kind: ClaimKind, pods: usize) -> Result<Phase> {
    let claims: Api<ResourceClaim> = Api::namespaced(s.client.clone(), s.namespace);
    let pods_api: Api<Pod> = Api::namespaced(s.client.clone(), s.namespace);
    let names: Vec<String> = (0..pods)
        .map(|i| format!("{}-{i:05}", kind.name()))
        .collect();
    stream::iter(names.iter().map(|name| {
        let claims = claims.clone();
        async move {
            let claim: ResourceClaim = from_json("claim", kind.claim(name))?;
            claims
                .create(&PostParams::default(), &claim)
                .await
                .map_err(kube_err(format!("creating claim {name}")))
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;

    let mut watch = BindWatch::start(s.client, s.namespace).await?;
    let before = Scrape::parse(&s.scheduler.metrics().await?);
    let cpu = |pid| proc_cpu_seconds(pid).unwrap_or(0.0);
    let (api0, sched0) = (cpu(s.apiserver_pid), cpu(s.scheduler_pid));
    let t0 = Instant::now();
    stream::iter(names.iter().map(|name| {
        let pods_api = pods_api.clone();
        async move {
            let p: Pod = from_json("pod", pod(name, name, s.selector))?;
            pods_api
                .create(&PostParams::default(), &p)
                .await
                .map_err(kube_err(format!("creating pod {name}")))
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>()
    .await?;
    let created = t0.elapsed();
    let bound = watch.wait(&names, t0 + s.timeout).await;
    drop(watch);
    let last = bound.values().max().map_or(t0, |t| *t);
    let bind_s = last.duration_since(t0).as_secs_f64();
    let (api1, sched1) = (cpu(s.apiserver_pid), cpu(s.scheduler_pid));
    let after = Scrape::parse(&s.scheduler.metrics().await?);
    let rss = |pid| proc_memory_kib(pid).map_or(0, |(rss, _)| rss);
    let delta = |i: usize| (after.results[i] - before.results[i]).max(0.0) as u64;
    let phase = Phase {
        claim: kind.name(),
        pods,
        bound: bound.len(),
        create_s: created.as_secs_f64(),
        bind_s,
        pods_per_s: if bind_s > 0.0 {
            bound.len() as f64 / bind_s
        } else {
            0.0
        },
        sli: Latency::of(&after.sli.since(&before.sli)),
        attempt: Latency::of(&after.attempt.since(&before.attempt)),
        filter: Latency::of(&after.filter.since(&before.filter)),
        dra_filter: Latency::of(&after.dra_filter.since(&before.dra_filter)),
        attempts_scheduled: delta(0),
        attempts_unschedulable: delta(1),
        attempts_error: delta(2),
        apiserver_cpu_s: api1 - api0,
        scheduler_cpu_s: sched1 - sched0,
        apiserver_rss_kib: rss(s.apiserver_pid),
        scheduler_rss_kib: rss(s.scheduler_pid),
    };
    clean_up(s, None).await?;
    Ok(phase)
}

/// Removes every pod (no grace: no kubelet would confirm) and claim of the
/// namespace, and every object of `also` (the gang phase's PodGroups), and
/// waits until all are gone: the claim controller deallocates a claim
/// before its finalizer goes, so that is when the scheduler sees the
/// devices free again (and a PodGroup goes once its protection finalizer
/// is removed).
pub(super) async fn clean_up(s: &Subjects<'_>, also: Option<&Api<DynamicObject>>) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), s.namespace);
    let claims: Api<ResourceClaim> = Api::namespaced(s.client.clone(), s.namespace);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let all = ListParams::default();
    pods.delete_collection(&now, &all)
        .await
        .map_err(kube_err("deleting the phase's pods".into()))?;
    claims
        .delete_collection(&DeleteParams::default(), &all)
        .await
        .map_err(kube_err("deleting the phase's claims".into()))?;
    if let Some(also) = also {
        also.delete_collection(&DeleteParams::default(), &all)
            .await
            .map_err(kube_err("deleting the phase's PodGroups".into()))?;
    }
    let deadline = Instant::now() + s.timeout;
    loop {
        let listing = |what: &'static str| kube_err(format!("listing the phase's {what}"));
        let mut left = claims
            .list_metadata(&all)
            .await
            .map_err(listing("claims"))?
            .items
            .len()
            + pods
                .list_metadata(&all)
                .await
                .map_err(listing("pods"))?
                .items
                .len();
        if let Some(also) = also {
            left += also
                .list_metadata(&all)
                .await
                .map_err(listing("PodGroups"))?
                .items
                .len();
        }
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Testbed(format!(
                "{left} pods, claims and PodGroups of {} still there after {} s",
                s.namespace,
                s.timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
