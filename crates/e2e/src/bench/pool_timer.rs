//! Timing pools into the API with a watch (not a poll): the time of the
//! event that completed the last pool, to the millisecond.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use crate::error::{Error, Result};
use crate::pools::pool_complete;

/// A watch on the slices of `driver`, started before whatever publishes them.
pub struct PoolTimer {
    events: std::pin::Pin<
        Box<
            dyn futures::Stream<Item = std::result::Result<Event<ResourceSlice>, watcher::Error>>
                + Send,
        >,
    >,
    /// pool name → slice name → slice.
    pools: BTreeMap<String, BTreeMap<String, ResourceSlice>>,
    /// pool name → its devices when complete; kept per event, so a fleet
    /// of hundreds of pools is not re-examined on every event.
    complete: BTreeMap<String, usize>,
    driver: String,
}

impl PoolTimer {
    /// Starts watching and returns once the initial list is in.
    pub async fn start(client: &kube::Client, driver: &str) -> Result<PoolTimer> {
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.driver={driver}"));
        let mut timer = PoolTimer {
            events: Box::pin(watcher::watcher(api, config)),
            pools: BTreeMap::new(),
            complete: BTreeMap::new(),
            driver: driver.to_string(),
        };
        loop {
            if timer.next_event(Duration::from_secs(30)).await? == Some(true) {
                return Ok(timer);
            }
        }
    }

    /// `Some(true)` on the end of an initial list, `Some(false)` on any
    /// other event, `None` on a (retried) watch error.
    async fn next_event(&mut self, timeout: Duration) -> Result<Option<bool>> {
        let event = tokio::time::timeout(timeout, self.events.next())
            .await
            .map_err(|_| {
                Error::Testbed(format!(
                    "no slice event of {} within {timeout:?}",
                    self.driver
                ))
            })?
            .ok_or_else(|| Error::Testbed("slice watch ended".into()))?;
        Ok(match event {
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
        })
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
    /// returns how long after `since` the completing event arrived.
    pub async fn wait(
        &mut self,
        pools: usize,
        devices: usize,
        since: Instant,
        timeout: Duration,
    ) -> Result<Duration> {
        let deadline = since + timeout;
        while self.complete_pools(devices) < pools {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Testbed(format!(
                    "{} of {pools} pools of {} complete after {timeout:?}",
                    self.complete_pools(devices),
                    self.driver
                )));
            }
            self.next_event(left).await?;
        }
        Ok(since.elapsed())
    }
}
