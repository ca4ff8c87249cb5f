//! The publisher loop against the in-memory API server ([`FakeApi`]), on
//! paused time: how many requests it makes when its watch lags behind its
//! own writes, and that it still repairs drift.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use prometheus::Registry;
use tokio::sync::{oneshot, watch};

use super::config::{PublishMetrics, PublisherConfig};
use super::fake_api::{Counts, FakeApi, WatchEvents, start_publisher};
use super::settle::WRITE_SETTLE_TIMEOUT;
use crate::publish::desired::PoolContent;

const DRIVER: &str = "neuron.aws.com";
const NODE: &str = "n";

/// A running publisher and the handles a test drives it by.
struct Running {
    api: FakeApi,
    watch: WatchEvents,
    published: watch::Receiver<bool>,
    _devices: watch::Sender<PoolContent>,
    _stop: oneshot::Sender<()>,
}

impl Running {
    /// Delivers the oldest changes the watch has not shown yet: all, or
    /// the first `n`.
    fn deliver(&self, n: Option<usize>) {
        for e in self.api.take_events(n.unwrap_or(usize::MAX)) {
            self.watch.send(Ok(e)).expect("publisher running");
        }
    }

    fn counts(&self) -> Counts {
        self.api.counts()
    }
}

fn devices(n: usize) -> PoolContent {
    PoolContent::devices(
        (0..n)
            .map(|i| Device {
                name: format!("neurondevice{i}"),
                ..Default::default()
            })
            .collect(),
    )
}

/// Starts the publisher on `api` with `content`; its watch lists `listed`.
async fn start(api: FakeApi, content: PoolContent, listed: Vec<ResourceSlice>) -> Running {
    let metrics = PublishMetrics::register(&Registry::new()).expect("register");
    let config = PublisherConfig::new(DRIVER, NODE, None, metrics).expect("valid");
    let published = config.published();
    let started = start_publisher(&api, config, content, listed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    Running {
        api,
        watch: started.watch,
        published,
        _devices: started.devices,
        _stop: started.stop,
    }
}

/// A watch that shows one of the pool's three creates at once and the rest
/// only long after the settle timeout (an API server far behind): every
/// slice is created once, nothing is written again, and what the publisher
/// does meanwhile is read.
#[tokio::test(start_paused = true)]
async fn a_lagging_watch_causes_no_second_write() {
    let run = start(FakeApi::default(), devices(300), Vec::new()).await;
    let first = run.counts();
    assert_eq!((first.creates, first.replaces), (3, 0), "{first:?}");
    assert!(*run.published.borrow());
    // One of the three events arrives, which makes the publisher look again.
    run.deliver(Some(1));
    tokio::time::sleep(WRITE_SETTLE_TIMEOUT * 12).await;
    let lagging = run.counts();
    assert_eq!(
        (
            lagging.creates,
            lagging.replaces,
            lagging.deletes,
            lagging.refused
        ),
        (3, 0, 0, 0),
        "{lagging:?}"
    );
    // The two unseen writes were read back, less and less often (at 10,
    // 30, 70 s: three reads each in two minutes).
    assert_eq!(lagging.gets, 6, "{lagging:?}");
    // The watch catches up: nothing to do, and nothing more to check.
    run.deliver(None);
    tokio::time::sleep(WRITE_SETTLE_TIMEOUT * 30).await;
    assert_eq!(run.counts(), lagging);
    let generations: Vec<i64> = run
        .api
        .objects()
        .values()
        .map(|s| s.spec.pool.generation)
        .collect();
    assert_eq!(generations, [1, 1, 1]);
}

/// The slice is already there (an earlier create whose answer was lost),
/// and the watch's list, served from a cache, does not show it: the refused
/// create is resolved by one read, not by creating again after each backoff.
#[tokio::test(start_paused = true)]
async fn a_create_refused_as_existing_is_read_not_repeated() {
    let api = FakeApi::default();
    let earlier = start(api.clone(), devices(4), Vec::new()).await;
    assert_eq!(earlier.counts().creates, 1);
    drop(earlier);
    let before = api.counts();
    let run = start(api.clone(), devices(4), Vec::new()).await;
    tokio::time::sleep(WRITE_SETTLE_TIMEOUT * 6).await;
    let after = run.counts();
    assert_eq!(after.creates - before.creates, 1, "{after:?}");
    assert_eq!(after.refused - before.refused, 1, "{after:?}");
    assert_eq!(after.replaces, 0, "{after:?}");
    assert!(*run.published.borrow());
}

/// Trusting its own writes does not blind the publisher: a slice someone
/// else deletes is created again, whether the watch shows the delete or
/// not (then the read-back finds it gone).
#[tokio::test(start_paused = true)]
async fn deleted_slices_are_repaired_with_or_without_the_watch() {
    let run = start(FakeApi::default(), devices(4), Vec::new()).await;
    run.deliver(None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let name = run.api.objects().into_keys().next().expect("one slice");
    // Seen by the watch.
    run.api.remove(&name);
    run.deliver(None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(run.counts().creates, 2);
    assert!(run.api.objects().contains_key(&name));
    // Deleted before the watch showed our create, and never shown.
    run.api.remove(&name);
    let _ = run.api.take_events(usize::MAX);
    tokio::time::sleep(WRITE_SETTLE_TIMEOUT + Duration::from_secs(1)).await;
    assert_eq!(run.counts().creates, 3);
    assert!(run.api.objects().contains_key(&name));
}

/// Someone else's edit of our slice after our write, shown by the watch,
/// is repaired with one update on the version the watch showed.
#[tokio::test(start_paused = true)]
async fn a_foreign_edit_is_repaired_once() {
    let run = start(FakeApi::default(), devices(4), Vec::new()).await;
    run.deliver(None);
    let (name, mut edited) = run.api.objects().into_iter().next().expect("one slice");
    edited.spec.devices = Some(Vec::new());
    run.api.put(edited);
    run.deliver(None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = run.counts();
    assert_eq!((counts.creates, counts.replaces, counts.refused), (1, 1, 0));
    let devices = run.api.objects()[&name].spec.devices.clone();
    assert_eq!(devices.map_or(0, |d| d.len()), 4);
}
