//! Two publishers of one pool on the in-memory API server ([`FakeApi`]), as
//! during a surge upgrade that changes the pool's layout: the old instance
//! publishes 16 chips (one slice), the new one 16 chips and 128 cores (two
//! slices). Both see every change, as their watches would; what the
//! scheduler would see is replayed from the same events ([`PoolView`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::runtime::watcher::Event;
use prometheus::Registry;
use tokio::sync::{oneshot, watch};

use super::config::{PublishMetrics, PublisherConfig};
use super::fake_api::{FakeApi, WatchEvents, start_publisher};
use super::handover::{Instance, Liveness, RECHECK};
use crate::publish::desired::PoolContent;

const DRIVER: &str = "neuron.aws.com";
const NODE: &str = "n";

/// One publisher instance and the handles that drive it.
struct Running {
    watch: WatchEvents,
    _devices: watch::Sender<PoolContent>,
    stop: Option<oneshot::Sender<()>>,
}

fn chips_and_cores(cores: bool) -> PoolContent {
    let chips = (0..16).map(|i| format!("neurondevice{i}"));
    let per_core = (0..128).map(|i| format!("neuroncore{i}"));
    let names: Vec<String> = if cores {
        chips.chain(per_core).collect()
    } else {
        chips.collect()
    };
    PoolContent::devices(
        names
            .into_iter()
            .map(|name| Device {
                name,
                ..Default::default()
            })
            .collect(),
    )
}

/// Starts a publisher named `instance` with `content` on `api`, its watch
/// listing what `api` holds now.
async fn start(
    api: &FakeApi,
    instance: Instance,
    alive: Liveness,
    content: PoolContent,
) -> Running {
    let metrics = PublishMetrics::register(&Registry::new()).expect("register");
    let config = PublisherConfig::new(DRIVER, NODE, None, metrics)
        .expect("valid")
        .with_instance(instance, alive);
    let started = start_publisher(api, config, content, api.objects().into_values());
    Running {
        watch: started.watch,
        _devices: started.devices,
        stop: Some(started.stop),
    }
}

/// The pool as the scheduler sees it, from every change in order: the
/// slices of the highest generation, complete when all
/// `resourceSliceCount` of them are there.
#[derive(Default)]
struct PoolView {
    slices: BTreeMap<String, ResourceSlice>,
    /// The highest generation after each change.
    generations: Vec<i64>,
    /// Changes after which the pool was incomplete although it had been
    /// complete at that generation before.
    incomplete_after_complete: usize,
    complete_at: Option<i64>,
}

impl PoolView {
    fn apply(&mut self, event: &Event<ResourceSlice>) {
        match event {
            Event::Apply(s) => {
                let name = s.metadata.name.clone().unwrap_or_default();
                self.slices.insert(name, s.clone());
            }
            Event::Delete(s) => {
                self.slices.remove(s.metadata.name.as_deref().unwrap_or(""));
            }
            _ => return,
        }
        let top = self.slices.values().map(|s| s.spec.pool.generation).max();
        let Some(top) = top else { return };
        let at_top: Vec<_> = self
            .slices
            .values()
            .filter(|s| s.spec.pool.generation == top)
            .collect();
        let complete = at_top
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == at_top.len() as i64);
        if complete {
            self.complete_at = Some(top);
        } else if self.complete_at == Some(top) {
            self.incomplete_after_complete += 1;
        }
        if self.generations.last() != Some(&top) {
            self.generations.push(top);
        }
    }
}

/// Hands every change so far to each running instance's watch and to the
/// scheduler's view, then lets them work; `rounds` times.
async fn deliver(api: &FakeApi, instances: &[&Running], view: &mut PoolView, rounds: usize) {
    for _ in 0..rounds {
        for event in api.take_events(usize::MAX) {
            view.apply(&event);
            for i in instances.iter().filter(|i| i.stop.is_some()) {
                let _ = i.watch.send(Ok(event.clone()));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn device_count(api: &FakeApi) -> usize {
    api.objects()
        .values()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum()
}

fn at(epoch: u64, id: &str) -> Instance {
    Instance {
        epoch,
        id: id.into(),
    }
}

/// The old instance yields to the new one's stamps: the new layout lands
/// with one generation move, the old instance writes nothing after it, and
/// the scheduler never sees the new pool incomplete once it was complete.
#[tokio::test(start_paused = true)]
async fn the_older_instance_yields_and_the_generation_moves_once() {
    let api = FakeApi::default();
    let mut view = PoolView::default();
    let old = start(
        &api,
        at(100, "old"),
        Liveness::assume_alive(),
        chips_and_cores(false),
    )
    .await;
    deliver(&api, &[&old], &mut view, 2).await;
    assert_eq!(device_count(&api), 16);
    let before = api.counts();

    let new = start(
        &api,
        at(200, "new"),
        Liveness::assume_alive(),
        chips_and_cores(true),
    )
    .await;
    deliver(&api, &[&old, &new], &mut view, 40).await;
    let after = api.counts();
    // The new layout: two slices, 144 devices, one generation up.
    assert_eq!(device_count(&api), 144);
    assert_eq!(view.generations, [1, 2], "generation moves");
    assert_eq!(view.incomplete_after_complete, 0);
    // The new instance wrote the two slices once; nothing else was written.
    assert_eq!(
        (
            after.creates - before.creates,
            after.replaces - before.replaces,
            after.deletes
        ),
        (1, 1, 0),
        "{after:?}"
    );
    for s in api.objects().values() {
        let stamp = &s.metadata.annotations.as_ref().expect("stamped")["neuron.aws.com/publisher"];
        assert_eq!(stamp, "200/new");
    }
    drop(new);
}

/// What happened before the handover: two instances that both take the
/// pool for theirs (here: the same instance id, so neither yields) rewrite
/// it at every change the other makes.
#[tokio::test(start_paused = true)]
async fn without_the_handover_the_generation_bounces() {
    let api = FakeApi::default();
    let mut view = PoolView::default();
    let old = start(
        &api,
        at(100, "same"),
        Liveness::assume_alive(),
        chips_and_cores(false),
    )
    .await;
    deliver(&api, &[&old], &mut view, 2).await;
    let new = start(
        &api,
        at(200, "same"),
        Liveness::assume_alive(),
        chips_and_cores(true),
    )
    .await;
    deliver(&api, &[&old, &new], &mut view, 40).await;
    assert!(view.generations.len() > 10, "{:?}", view.generations);
    drop((old, new));
}

/// The newer instance goes while the older one still runs (a surge undone:
/// the new pod deleted, the old one kept): the older one publishes its
/// layout again within a recheck, one generation up; an instance started
/// later with the same layout writes nothing at all.
#[tokio::test(start_paused = true)]
async fn the_older_instance_resumes_when_the_newer_one_is_gone() {
    let api = FakeApi::default();
    let mut view = PoolView::default();
    let new_running = Arc::new(AtomicBool::new(true));
    let running = new_running.clone();
    let alive = Liveness::new(move |id| id != "new" || running.load(Ordering::SeqCst));
    let old = start(&api, at(100, "old"), alive, chips_and_cores(false)).await;
    deliver(&api, &[&old], &mut view, 2).await;
    let mut new = start(
        &api,
        at(200, "new"),
        Liveness::assume_alive(),
        chips_and_cores(true),
    )
    .await;
    deliver(&api, &[&old, &new], &mut view, 10).await;
    assert_eq!(device_count(&api), 144);
    assert_eq!(view.generations, [1, 2]);

    if let Some(stop) = new.stop.take() {
        let _ = stop.send(());
    }
    new_running.store(false, Ordering::SeqCst);
    tokio::time::sleep(RECHECK).await;
    deliver(&api, &[&old, &new], &mut view, 10).await;
    assert_eq!(device_count(&api), 16);
    assert_eq!(view.generations, [1, 2, 3]);
    assert_eq!(view.incomplete_after_complete, 0);

    // A third instance with the old's layout: the slices hold what it
    // would write, so it writes nothing (it does not restamp).
    let before = api.counts();
    let third = start(
        &api,
        at(300, "third"),
        Liveness::assume_alive(),
        chips_and_cores(false),
    )
    .await;
    deliver(&api, &[&old, &third], &mut view, 10).await;
    let after = api.counts();
    assert_eq!(
        (after.creates, after.replaces, after.deletes),
        (before.creates, before.replaces, before.deletes)
    );
    assert_eq!(view.generations, [1, 2, 3]);
}
