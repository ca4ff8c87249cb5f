//! The rescan loop on a thread of its own.
//!
//! At rest the loop only waits: ten seconds, a scan, ten seconds. On the
//! async runtime that wait cost more than the scan's own thread switch: a
//! 10 s timer sits in a coarse level of the runtime's timer wheel and woke a
//! worker three times on its way down the levels, and each scan then went
//! to a blocking thread and back, waking the other worker on the way
//! (measured with `strace -f` on a driver at rest: six worker wake-ups a
//! scan). The loop now sleeps on its own thread in one timed wait on the
//! trigger channel, scans there, and touches the runtime only when a feed
//! changed (a send on a watch channel wakes its reader) or the health
//! report is due.
//!
//! Triggers still come from async code (the uevent task): a task that
//! waits on that channel and on the device feed's receivers forwards each
//! trigger to the thread, and tells it to stop once nobody reads the
//! devices. It waits without a timer, so it costs nothing at rest.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc::{self as std_mpsc, RecvTimeoutError};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::{RescanConfig, Rescanner, Trigger};
use crate::scan::inventory::DeviceInventory;

/// What wakes the rescan thread.
enum Wake {
    Trigger(Trigger),
    /// Nobody reads the devices any more (or the runtime is going away).
    Stop,
}

impl<I: DeviceInventory> Rescanner<I> {
    /// Rescans on every trigger and every `config.interval` until every
    /// receiver of the device feed is gone. The caller has already scanned
    /// once ([`Trigger::Start`]). For tests: the daemon serves a shared
    /// rescanner (`serve_triggers`).
    #[cfg(any(test, feature = "testing"))]
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub async fn run(self, triggers: mpsc::Receiver<Trigger>, config: RescanConfig) {
        Arc::new(self).serve_triggers(triggers, config).await
    }

    /// Rescans on every trigger and every `config.interval`, on a thread of
    /// its own ([module docs](self)), on a shared rescanner: the daemon
    /// rescans once more itself when the API server has answered. Returns
    /// when the loop stops: every receiver of the device feed is gone.
    pub(crate) async fn serve_triggers(
        self: Arc<Self>,
        mut triggers: mpsc::Receiver<Trigger>,
        config: RescanConfig,
    ) {
        let (wake, wakes) = std_mpsc::channel();
        let (done_tx, mut done) = oneshot::channel::<()>();
        let looping = Arc::clone(&self);
        let spawned = std::thread::Builder::new()
            .name("rescan".into())
            .spawn(move || {
                looping.serve_wakes(&wakes, config);
                drop(done_tx);
            });
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the rescan thread; devices are scanned at start only");
            return;
        }
        let mut events_open = true;
        loop {
            tokio::select! {
                _ = self.devices.closed() => break,
                // The thread ended by itself (it saw the feed closed).
                _ = &mut done => return,
                t = triggers.recv(), if events_open => match t {
                    Some(t) => {
                        if wake.send(Wake::Trigger(t)).is_err() {
                            return;
                        }
                    }
                    None => events_open = false,
                },
            }
        }
        let _ = wake.send(Wake::Stop);
        let _ = done.await;
    }

    /// The thread's loop: a timed wait for the next trigger or the next
    /// interval (which, as a missed tick of `tokio::time::interval` with
    /// `Delay`, comes one interval after the last one, whatever the
    /// triggers did), then a scan.
    fn serve_wakes(&self, wakes: &std_mpsc::Receiver<Wake>, config: RescanConfig) {
        let mut next_tick = Instant::now() + config.interval;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let trigger = match wakes.recv_timeout(wait) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(Wake::Trigger(t)) => {
                    // Let the rest of the burst arrive, then drain it.
                    std::thread::sleep(config.settle);
                    loop {
                        match wakes.try_recv() {
                            Ok(Wake::Trigger(_)) => {}
                            Ok(Wake::Stop) => return,
                            Err(_) => break,
                        }
                    }
                    t
                }
                Err(RecvTimeoutError::Timeout) => {
                    next_tick = Instant::now() + config.interval;
                    Trigger::Interval
                }
            };
            if self.devices.is_closed() {
                return;
            }
            // A scan that panics must not end the loop (on the blocking
            // pool a panic came back as an error of that one rescan).
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.rescan_here(trigger))) {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%error, trigger = trigger.label(), "rescan failed; keeping the published devices");
                }
                Err(_) => {
                    tracing::warn!(
                        trigger = trigger.label(),
                        "rescan panicked; keeping the published devices"
                    );
                }
            }
        }
    }
}
