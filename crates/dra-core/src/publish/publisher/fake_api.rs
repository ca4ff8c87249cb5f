//! An in-memory API server for the publisher loop's tests: slices with
//! UIDs and `resourceVersion`s, the answers the real server gives
//! (409 AlreadyExists, 409 Conflict, 404), a count of every request, and
//! the watch events of every change kept back until the test delivers them,
//! so that a test decides how far the publisher's watch lags.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::Status;
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::PoolApi;
use super::config::PublisherConfig;
use super::drive;
use crate::publish::desired::PoolContent;

/// What feeds a publisher's watch in a test.
pub(super) type WatchEvents = mpsc::UnboundedSender<Result<Event<ResourceSlice>, watcher::Error>>;

/// The handles of a publisher a test started ([`start_publisher`]).
pub(super) struct Started {
    pub(super) watch: WatchEvents,
    pub(super) devices: watch::Sender<PoolContent>,
    pub(super) stop: oneshot::Sender<()>,
}

/// Spawns the publisher loop on `api` with `config` and `content`; its
/// watch has listed `listed` (Init, each slice, InitDone already sent).
pub(super) fn start_publisher(
    api: &FakeApi,
    config: PublisherConfig,
    content: PoolContent,
    listed: impl IntoIterator<Item = ResourceSlice>,
) -> Started {
    let (watch_tx, watch_rx) = mpsc::unbounded_channel();
    let (store, writer) = reflector::store();
    let events = reflector::reflector(writer, UnboundedReceiverStream::new(watch_rx));
    let (devices_tx, devices_rx) = watch::channel(content);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(drive(
        api.clone(),
        store,
        events,
        config,
        devices_rx,
        async move {
            let _ = stop_rx.await;
        },
    ));
    watch_tx.send(Ok(Event::Init)).expect("running");
    for s in listed {
        watch_tx.send(Ok(Event::InitApply(s))).expect("running");
    }
    watch_tx.send(Ok(Event::InitDone)).expect("running");
    Started {
        watch: watch_tx,
        devices: devices_tx,
        stop: stop_tx,
    }
}

/// Requests the publisher made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub creates: usize,
    pub replaces: usize,
    pub deletes: usize,
    pub gets: usize,
    /// Writes refused with 409.
    pub refused: usize,
    pub events: usize,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, ResourceSlice>,
    revision: u64,
    uids: u64,
    counts: Counts,
    /// Changes the watch has not delivered yet.
    undelivered: Vec<Event<ResourceSlice>>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct FakeApi {
    state: Arc<Mutex<State>>,
}

fn error(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(Status::failure(reason, reason).with_code(code).boxed())
}

impl State {
    fn stamp(&mut self, slice: &mut ResourceSlice, uid: Option<String>) {
        self.revision += 1;
        slice.metadata.resource_version = Some(self.revision.to_string());
        slice.metadata.uid = uid.or_else(|| {
            self.uids += 1;
            Some(format!("uid-{}", self.uids))
        });
    }

    fn store(&mut self, slice: ResourceSlice) -> ResourceSlice {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.objects.insert(name, slice.clone());
        self.undelivered.push(Event::Apply(slice.clone()));
        slice
    }

    fn remove(&mut self, name: &str) -> Option<ResourceSlice> {
        let mut gone = self.objects.remove(name)?;
        self.revision += 1;
        gone.metadata.resource_version = Some(self.revision.to_string());
        self.undelivered.push(Event::Delete(gone.clone()));
        Some(gone)
    }
}

impl FakeApi {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// The watch events of the oldest `limit` changes not handed over yet.
    pub(super) fn take_events(&self, limit: usize) -> Vec<Event<ResourceSlice>> {
        let mut state = self.lock();
        let n = limit.min(state.undelivered.len());
        state.undelivered.drain(..n).collect()
    }

    /// Someone else writes `slice` (no request of the publisher).
    pub(super) fn put(&self, mut slice: ResourceSlice) -> ResourceSlice {
        let mut state = self.lock();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let uid = state
            .objects
            .get(&name)
            .and_then(|o| o.metadata.uid.clone());
        state.stamp(&mut slice, uid);
        state.store(slice)
    }

    /// Someone else deletes `name`.
    pub(super) fn remove(&self, name: &str) -> Option<ResourceSlice> {
        self.lock().remove(name)
    }

    /// The stored slices, by name.
    pub(super) fn objects(&self) -> BTreeMap<String, ResourceSlice> {
        self.lock().objects.clone()
    }
}

impl PoolApi for FakeApi {
    async fn create(&self, slice: &ResourceSlice) -> kube::Result<ResourceSlice> {
        let mut state = self.lock();
        state.counts.creates += 1;
        let name = slice.metadata.name.clone().unwrap_or_default();
        if state.objects.contains_key(&name) {
            state.counts.refused += 1;
            return Err(error(409, "AlreadyExists"));
        }
        let mut slice = slice.clone();
        state.stamp(&mut slice, None);
        Ok(state.store(slice))
    }

    async fn replace(&self, slice: &ResourceSlice) -> kube::Result<ResourceSlice> {
        let mut state = self.lock();
        state.counts.replaces += 1;
        let name = slice.metadata.name.clone().unwrap_or_default();
        let Some(current) = state.objects.get(&name) else {
            return Err(error(404, "NotFound"));
        };
        if current.metadata.resource_version != slice.metadata.resource_version {
            state.counts.refused += 1;
            return Err(error(409, "Conflict"));
        }
        let uid = current.metadata.uid.clone();
        let mut slice = slice.clone();
        state.stamp(&mut slice, uid);
        Ok(state.store(slice))
    }

    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()> {
        let mut state = self.lock();
        state.counts.deletes += 1;
        match state.objects.get(name) {
            None => Ok(()),
            Some(o) if uid.is_some() && o.metadata.uid != uid => {
                state.counts.refused += 1;
                Err(error(409, "Conflict"))
            }
            Some(_) => {
                state.remove(name);
                Ok(())
            }
        }
    }

    async fn get(&self, name: &str) -> kube::Result<Option<ResourceSlice>> {
        let mut state = self.lock();
        state.counts.gets += 1;
        Ok(state.objects.get(name).cloned())
    }

    async fn post_event(&self, _event: &CoreEvent) -> kube::Result<()> {
        self.lock().counts.events += 1;
        Ok(())
    }
}
