//! Scenario 32: one publisher per pool during a surge upgrade that changes
//! the pool's layout.
//!
//! The charts roll the driver's DaemonSet with `maxSurge`: for a few
//! seconds the old and the new pod run side by side on a node, and both
//! publish its pool. When the new values change the layout (here the
//! Neuron chart's `partitions`: `auto` publishes 16 chips and 128 cores in
//! several slices, `chips` the 16 chips in one) each would reconcile toward
//! its own layout, and the pool's generation would bounce until the old pod
//! exits. The publishers hand over instead (`dra-core`'s
//! `publish::publisher::handover`): the newest instance publishes and the
//! older one stops writing once it sees the newer one's stamp on the pool.
//!
//! A watch records every change of trn2's Neuron slices while the release
//! is upgraded to `partitions=chips` and back to `auto`, and replays them
//! as the scheduler reads a pool (the slices of the newest generation, all
//! `resourceSliceCount` of them): per upgrade the generation moves at most
//! [`MAX_GENERATION_MOVES`] times, the pool is never incomplete at a
//! generation it was complete at, it holds the old layout or the new one
//! whenever complete and changes layout once, and no write of a superseded
//! instance follows the new one's first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use super::kit;
use crate::pools::pool_complete;
use crate::testbed::{DriverKind, Testbed};

const NODE: &str = "trn2";

/// Generation moves allowed per upgrade: one for the new layout, one more
/// for a write of the old instance already on its way when the new one's
/// first write arrived.
const MAX_GENERATION_MOVES: usize = 2;

/// How long the pool is watched after the rollout has finished.
const SETTLE: Duration = Duration::from_secs(10);

/// The next item of a stream (the crate has no `futures` dependency: the
/// `Stream` trait is reached as `WatchStreamExt`'s supertrait).
fn next<S: WatchStreamExt + Unpin>(s: &mut S) -> impl Future<Output = Option<S::Item>> + '_ {
    std::future::poll_fn(move |cx| std::pin::Pin::new(&mut *s).poll_next(cx))
}

/// One change of the pool as the watch delivered it.
#[derive(Debug, Clone)]
struct Seen {
    at: Duration,
    /// The newest generation after the change.
    generation: i64,
    /// Devices when the pool is complete at that generation.
    complete: Option<usize>,
    /// The stamp of the instance that wrote the slice (writes only).
    writer: Option<String>,
}

/// Watches the node's Neuron slices until dropped; the changes pile up in
/// `seen`.
struct PoolWatch {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PoolWatch {
    async fn start(tb: &impl Testbed, node_name: &str) -> Result<Self> {
        let driver = DriverKind::Neuron.driver_name();
        let api: Api<ResourceSlice> = Api::all(tb.client());
        let config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node_name},spec.driver={driver}"));
        let key = format!("{driver}/publisher");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = seen.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut slices: BTreeMap<String, ResourceSlice> = BTreeMap::new();
            let mut ready = Some(ready_tx);
            let mut events = Box::pin(watcher::watcher(api, config));
            while let Some(event) = next(&mut events).await {
                let Ok(event) = event else { continue };
                let name = |s: &ResourceSlice| s.metadata.name.clone().unwrap_or_default();
                let writer = match &event {
                    Event::Apply(s) => {
                        slices.insert(name(s), s.clone());
                        s.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(&key))
                            .cloned()
                    }
                    Event::Delete(s) => {
                        slices.remove(&name(s));
                        None
                    }
                    Event::InitApply(s) => {
                        slices.insert(name(s), s.clone());
                        continue;
                    }
                    Event::Init => {
                        slices.clear();
                        continue;
                    }
                    Event::InitDone => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        None
                    }
                };
                let all: Vec<ResourceSlice> = slices.values().cloned().collect();
                let generation = all.iter().map(|s| s.spec.pool.generation).max();
                let entry = Seen {
                    at: started.elapsed(),
                    generation: generation.unwrap_or(0),
                    complete: pool_complete(&all),
                    writer,
                };
                out.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .map_err(|_| {
                anyhow!("the watch of {node_name}'s Neuron slices did not list them in 30 s")
            })?
            .map_err(|_| anyhow!("the watch of {node_name}'s Neuron slices ended"))?;
        Ok(Self { seen, task })
    }

    /// Everything seen since the last call.
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for PoolWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one upgrade did to the pool, from the watch's changes.
#[derive(Debug, Default, PartialEq)]
struct Verdict {
    generation_moves: usize,
    /// Changes that left the pool incomplete at a generation it had been
    /// complete at.
    incomplete_after_complete: usize,
    /// Device counts of the complete pool, each time it changed.
    layouts: Vec<usize>,
    /// Writes stamped by an instance older than one that had written before.
    superseded_writes: usize,
    /// The writers' stamps, in the order they first wrote.
    writers: Vec<String>,
}

fn verdict(start_generation: i64, start_devices: usize, seen: &[Seen]) -> Verdict {
    let mut v = Verdict {
        layouts: vec![start_devices],
        ..Verdict::default()
    };
    let mut generation = start_generation;
    let mut complete_at = Some(start_generation);
    let mut newest: Option<(u64, String)> = None;
    for s in seen {
        if s.generation > generation {
            v.generation_moves += 1;
            generation = s.generation;
        }
        match s.complete {
            Some(devices) => {
                complete_at = Some(s.generation);
                if v.layouts.last() != Some(&devices) {
                    v.layouts.push(devices);
                }
            }
            None if complete_at == Some(s.generation) => v.incomplete_after_complete += 1,
            None => {}
        }
        let Some(stamp) = &s.writer else { continue };
        if !v.writers.contains(stamp) {
            v.writers.push(stamp.clone());
        }
        let parsed = stamp
            .split_once('/')
            .and_then(|(e, id)| Some((e.parse::<u64>().ok()?, id.to_owned())));
        let Some(p) = parsed else { continue };
        match &newest {
            Some(n) if p.1 != n.1 && p < *n => v.superseded_writes += 1,
            Some(n) if p <= *n => {}
            _ => newest = Some(p),
        }
    }
    v
}

/// The newest generation and device count of the node's complete pool.
async fn pool_now(tb: &impl Testbed, node_name: &str) -> Result<(i64, Option<usize>)> {
    let api: Api<ResourceSlice> = Api::all(tb.client());
    let lp = kube::api::ListParams::default().fields(&format!(
        "spec.nodeName={node_name},spec.driver={}",
        DriverKind::Neuron.driver_name()
    ));
    let items = api.list(&lp).await?.items;
    let generation = items
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    Ok((generation, pool_complete(&items)))
}

/// Upgrades the Neuron release to `partitions`, watching the pool; checks
/// the verdict.
async fn upgrade_to(
    tb: &impl Testbed,
    watch: &PoolWatch,
    node_name: &str,
    partitions: &str,
    (from, to): (usize, usize),
) -> Result<Verdict> {
    let (start_generation, start) = pool_now(tb, node_name).await?;
    ensure!(
        start == Some(from),
        "before the upgrade to partitions={partitions}: {node_name}'s Neuron pool holds {start:?} \
         devices (complete), want {from}"
    );
    watch.take();
    let upgrade = tb
        .upgrade_driver_with(DriverKind::Neuron, &[("partitions", partitions)])
        .await?;
    kit::wait_for(
        tb,
        &format!("{to} devices in {node_name}'s Neuron pool"),
        SETTLE * 3,
        || async { Ok((pool_now(tb, node_name).await?.1 == Some(to)).then_some(())) },
    )
    .await?;
    tokio::time::sleep(SETTLE).await;
    let seen = watch.take();
    let v = verdict(start_generation, from, &seen);
    let timeline: Vec<String> = seen
        .iter()
        .map(|s| {
            format!(
                "{:.2}s gen {} {}",
                s.at.as_secs_f64(),
                s.generation,
                s.complete
                    .map_or("incomplete".into(), |d| format!("complete {d}"))
            )
        })
        .collect();
    println!(
        "    partitions={partitions}: rollout {:.1} s; {} changes seen; generation {start_generation} \
         moved {} time(s); pool incomplete after complete {} time(s); layouts {:?}; writers {}; \
         superseded writes {}",
        upgrade.rollout.as_secs_f64(),
        seen.len(),
        v.generation_moves,
        v.incomplete_after_complete,
        v.layouts,
        v.writers.len(),
        v.superseded_writes,
    );
    let what = format!(
        "upgrade to partitions={partitions} on {node_name} (changes: {}; {})",
        timeline.join(", "),
        tb.logs_hint()
    );
    ensure!(
        v.generation_moves >= 1 && v.generation_moves <= MAX_GENERATION_MOVES,
        "{what}: the pool's generation moved {} times, want 1 to {MAX_GENERATION_MOVES}",
        v.generation_moves
    );
    ensure!(
        v.incomplete_after_complete == 0,
        "{what}: the pool was incomplete {} time(s) at a generation it had been complete at",
        v.incomplete_after_complete
    );
    ensure!(
        v.layouts == [from, to],
        "{what}: the complete pool held {:?} devices in turn, want {from} then {to} only",
        v.layouts
    );
    ensure!(
        v.superseded_writes == 0,
        "{what}: {} write(s) of an older instance after a newer one had written (writers in order: {:?})",
        v.superseded_writes,
        v.writers
    );
    Ok(v)
}

pub async fn surge_one_publisher(tb: &impl Testbed, _ns: &str) -> Result<()> {
    let info = tb
        .nodes()
        .into_iter()
        .find(|n| n.name == NODE)
        .ok_or_else(|| anyhow!("no node {NODE} on this testbed"))?;
    let env = |p: &str| [("NEURON_PARTITIONS".to_string(), p.to_string())];
    let chips = DriverKind::Neuron.expected_devices_in(&info.fixture, &env("chips"));
    let auto = DriverKind::Neuron.expected_devices_in(&info.fixture, &env("auto"));
    ensure!(
        auto > chips,
        "partitions=auto publishes {auto} devices on {NODE} and chips {chips}: no layout change to test"
    );
    let node_name = kit::node_name(tb, NODE);
    let watch = PoolWatch::start(tb, &node_name).await?;
    // Fewer slices, then more, and the release as it was.
    upgrade_to(tb, &watch, &node_name, "chips", (auto, chips)).await?;
    upgrade_to(tb, &watch, &node_name, "auto", (chips, auto)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(generation: i64, complete: Option<usize>, writer: Option<&str>) -> Seen {
        Seen {
            at: Duration::ZERO,
            generation,
            complete,
            writer: writer.map(str::to_owned),
        }
    }

    #[test]
    fn a_clean_handover_and_a_bounce_are_told_apart() {
        // Growth by one generation: the new slice 0 first, then the rest.
        let clean = [
            seen(5, None, Some("200/new")),
            seen(5, None, Some("200/new")),
            seen(5, Some(144), Some("200/new")),
            seen(5, Some(144), None),
        ];
        let v = verdict(4, 16, &clean);
        assert_eq!(
            v,
            Verdict {
                generation_moves: 1,
                incomplete_after_complete: 0,
                layouts: vec![16, 144],
                superseded_writes: 0,
                writers: vec!["200/new".into()],
            }
        );
        // Both instances rewriting the pool toward their layouts.
        let bounce = [
            seen(5, Some(16), Some("200/new")),
            seen(6, Some(144), Some("100/old")),
            seen(7, Some(16), Some("200/new")),
            seen(7, None, Some("100/old")),
        ];
        let v = verdict(4, 144, &bounce);
        assert_eq!(v.generation_moves, 3);
        assert_eq!(v.incomplete_after_complete, 1);
        assert_eq!(v.layouts, [144, 16, 144, 16]);
        assert_eq!(v.superseded_writes, 2);
    }
}
