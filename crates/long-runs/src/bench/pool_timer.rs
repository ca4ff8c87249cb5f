//! Timing pools into the API with a watch (not a poll): the time of the
//! event that completed the last pool, to the millisecond.
//!
//! A task of its own drives the watch and stamps each event as it arrives.
//! Driven only by the caller, the watch request itself went out when the
//! caller first waited, after it had spawned the driver, and the figure
//! was when that late request was answered: 58 ms in a run whose audit
//! log had the driver's slice created 24 ms after the timer's list.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use e2e::pools::pool_complete;
use local_cluster::error::{Error, Result};

/// One watch event and when the watch task received it.
type Stamped = (
    Instant,
    std::result::Result<Event<ResourceSlice>, watcher::Error>,
);

/// A watch on the slices of `driver`, started before whatever publishes them.
pub struct PoolTimer {
    events: mpsc::UnboundedReceiver<Stamped>,
    /// Drives the watch; aborted when the timer is dropped.
    watch: JoinHandle<()>,
    /// pool name → slice name → slice.
    pools: BTreeMap<String, BTreeMap<String, ResourceSlice>>,
    /// pool name → its devices when complete; kept per event, so a fleet
    /// of hundreds of pools is not re-examined on every event.
    complete: BTreeMap<String, usize>,
    driver: String,
}

impl Drop for PoolTimer {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl PoolTimer {
    /// Starts watching and returns once the initial list is in. The watch
    /// task goes on at once to open the watch itself.
    pub async fn start(client: &kube::Client, driver: &str) -> Result<PoolTimer> {
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.driver={driver}"));
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher::watcher(api, config));
            while let Some(event) = stream.next().await {
                if tx.send((Instant::now(), event)).is_err() {
                    return;
                }
            }
        });
        let mut timer = PoolTimer {
            events: rx,
            watch,
            pools: BTreeMap::new(),
            complete: BTreeMap::new(),
            driver: driver.to_string(),
        };
        loop {
            if let (_, Some(true)) = timer.next_event(Duration::from_secs(30)).await? {
                return Ok(timer);
            }
        }
    }

    /// When the event arrived, and `Some(true)` on the end of an initial
    /// list, `Some(false)` on any other event, `None` on a (retried) watch
    /// error.
    async fn next_event(&mut self, timeout: Duration) -> Result<(Instant, Option<bool>)> {
        let (arrived, event) = tokio::time::timeout(timeout, self.events.recv())
            .await
            .map_err(|_| {
                Error::Testbed(format!(
                    "no slice event of {} within {timeout:?}",
                    self.driver
                ))
            })?
            .ok_or_else(|| Error::Testbed("slice watch ended".into()))?;
        let kind = match event {
            Ok(Event::Init) => {
                self.pools.clear();
                self.complete.clear();
                Some(false)
            }
            Ok(Event::InitApply(s) | Event::Apply(s)) => {
                self.update(s, false);
                Some(false)
            }
            Ok(Event::Delete(s)) => {
                self.update(s, true);
                Some(false)
            }
            Ok(Event::InitDone) => Some(true),
            Err(_) => None,
        };
        Ok((arrived, kind))
    }

    fn update(&mut self, slice: ResourceSlice, deleted: bool) {
        let pool = slice.spec.pool.name.clone();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let slices = self.pools.entry(pool.clone()).or_default();
        if deleted {
            slices.remove(&name);
        } else {
            slices.insert(name, slice);
        }
        let current: Vec<ResourceSlice> = slices.values().cloned().collect();
        match pool_complete(&current) {
            Some(devices) => self.complete.insert(pool, devices),
            None => self.complete.remove(&pool),
        };
    }

    /// Pools (by pool name) that are complete with `devices` devices now.
    pub fn complete_pools(&self, devices: usize) -> usize {
        self.complete.values().filter(|d| **d == devices).count()
    }

    /// Waits until `pools` pools are complete with `devices` devices each;
    /// returns how long after `since` the completing event arrived at the
    /// watch task.
    pub async fn wait(
        &mut self,
        pools: usize,
        devices: usize,
        since: Instant,
        timeout: Duration,
    ) -> Result<Duration> {
        let deadline = since + timeout;
        // Complete already: no event to time, the wait ends now.
        let mut arrived = Instant::now();
        while self.complete_pools(devices) < pools {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Testbed(format!(
                    "{} of {pools} pools of {} complete after {timeout:?}",
                    self.complete_pools(devices),
                    self.driver
                )));
            }
            arrived = self.next_event(left).await?.0;
        }
        Ok(arrived.saturating_duration_since(since))
    }
}
