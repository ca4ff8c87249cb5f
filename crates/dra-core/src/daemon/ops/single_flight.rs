//! One run of an async computation shared by every request that wants it:
//! the requests that arrive while it runs wait for that run (single
//! flight), and its result answers every request for a while after it
//! finished. The health probe ([`super::HealthProbe`]) and the `/metrics`
//! rendering ([`super::MetricsCache`]) are both one of these, so neither a
//! storm of probes nor a storm of scrapes costs more than one run per
//! reuse period, and a storm of scrapes holds one rendered body, not one
//! per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::Shared;
use tokio::time::Instant;

/// The future a run returns.
pub(crate) type RunFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// An async computation, run at most once at a time and at most about
/// once per reuse period (see the module doc).
pub(crate) struct SingleFlight<T: Clone> {
    run: Arc<dyn Fn() -> RunFuture<T> + Send + Sync>,
    last: Arc<std::sync::Mutex<Last<T>>>,
    reuse: Duration,
}

impl<T: Clone> Clone for SingleFlight<T> {
    fn clone(&self) -> Self {
        Self {
            run: self.run.clone(),
            last: self.last.clone(),
            reuse: self.reuse,
        }
    }
}

/// The latest run: in flight, or finished (when, and its result).
enum Last<T: Clone> {
    Never,
    Running { id: u64, run: Shared<RunFuture<T>> },
    Done { at: Instant, result: T },
}

/// Numbers runs, so that only the run in flight is recorded as done.
static RUNS: AtomicU64 = AtomicU64::new(0);

impl<T: Clone + Send + Sync + 'static> SingleFlight<T> {
    /// `run` makes one run; a finished run's result is reused for `reuse`.
    pub(crate) fn new(
        reuse: Duration,
        run: impl Fn() -> RunFuture<T> + Send + Sync + 'static,
    ) -> Self {
        Self {
            run: Arc::new(run),
            last: Arc::new(std::sync::Mutex::new(Last::Never)),
            reuse,
        }
    }

    /// How long a finished result is reused.
    #[cfg(test)]
    pub(crate) fn reuse_for(mut self, reuse: Duration) -> Self {
        self.reuse = reuse;
        self
    }

    /// A recent result, the run in flight's, or a new run's.
    pub(crate) async fn get(&self) -> T {
        let (id, run) = {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            match &*last {
                Last::Done { at, result } if at.elapsed() < self.reuse => {
                    return result.clone();
                }
                Last::Running { id, run } => (*id, run.clone()),
                Last::Never | Last::Done { .. } => {
                    let id = RUNS.fetch_add(1, Ordering::Relaxed);
                    let run = (self.run)().shared();
                    *last = Last::Running {
                        id,
                        run: run.clone(),
                    };
                    (id, run)
                }
            }
        };
        let result = run.await;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(&*last, Last::Running { id: running, .. } if *running == id) {
            *last = Last::Done {
                at: Instant::now(),
                result: result.clone(),
            };
        }
        result
    }
}
