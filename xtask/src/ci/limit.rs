//! Each CI step's time limit: a step that runs past its limit is stopped
//! (with every process it started) and fails, and CI says which step ran out
//! and what its limit was, instead of hanging until someone notices.
//!
//! The limits ([`super::Step::limit`]) are sized from measured runs
//! (docs/e2e.md): several times a warm run, and well above the cold figure,
//! so that only a step that hangs or has grown out of its budget meets them.
//! The waiting is written against a [`Clock`] and a [`Watched`] process so
//! that its logic is tested without wall time.

use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How often a running step is checked.
const POLL: Duration = Duration::from_millis(200);

/// How long a stopped step's processes have to end after SIGTERM (an e2e
/// leg stops its cluster) before they are killed.
pub(super) const GRACE: Duration = Duration::from_secs(30);

/// How a watched step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// It exited by itself: whether it succeeded.
    Exited(bool),
    /// It ran past its limit and was stopped.
    RanOut,
}

/// The time a watch measures and waits in.
pub(super) trait Clock {
    /// Time since the watch started.
    fn elapsed(&self) -> Duration;
    fn sleep(&mut self, d: Duration);
}

/// The process a watch waits for.
pub(super) trait Watched {
    /// `Some(success)` once it has exited.
    fn exited(&mut self) -> Result<Option<bool>>;
    /// Asks it and everything it started to end (SIGTERM).
    fn terminate(&mut self);
    /// Ends it and everything it started (SIGKILL).
    fn kill(&mut self);
}

/// Waits for `process` for at most `limit`. Past the limit, it is asked to
/// end, given [`GRACE`] and then killed; either way the step ran out.
pub(super) fn watch(
    process: &mut impl Watched,
    limit: Duration,
    clock: &mut impl Clock,
) -> Result<Ended> {
    loop {
        if let Some(ok) = process.exited()? {
            return Ok(Ended::Exited(ok));
        }
        let now = clock.elapsed();
        if now >= limit {
            break;
        }
        clock.sleep(POLL.min(limit - now));
    }
    process.terminate();
    let stop_by = clock.elapsed() + GRACE;
    loop {
        if process.exited()?.is_some() {
            return Ok(Ended::RanOut);
        }
        let now = clock.elapsed();
        if now >= stop_by {
            break;
        }
        clock.sleep(POLL.min(stop_by - now));
    }
    process.kill();
    // Reaps it; what it exited with no longer matters.
    while process.exited()?.is_none() {
        clock.sleep(POLL);
    }
    Ok(Ended::RanOut)
}

/// What CI says of a step that ran out.
pub(super) fn ran_out_message(step: &str, limit: Duration) -> String {
    format!(
        "step {step} ran out of its time limit of {}s and was stopped",
        limit.as_secs()
    )
}

/// The wall clock, from when the step started.
pub(super) struct WallClock(Instant);

impl WallClock {
    pub(super) fn start() -> Self {
        WallClock(Instant::now())
    }
}

impl Clock for WallClock {
    fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A step's process and, when it is stopped, every process below it.
pub(super) struct StepProcess<'a>(pub(super) &'a mut Child);

impl StepProcess<'_> {
    /// Signals the step's process and all its descendants, the deepest
    /// first, so that no parent restarts a child that was just stopped.
    fn signal(&mut self, signal: &str) {
        let table = process_table();
        let mut pids = descendants(self.0.id(), &table);
        pids.reverse();
        pids.push(self.0.id());
        let _ = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .args(pids.iter().map(u32::to_string))
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Watched for StepProcess<'_> {
    fn exited(&mut self) -> Result<Option<bool>> {
        Ok(self
            .0
            .try_wait()
            .context("waiting for a step")?
            .map(|s| s.success()))
    }
    fn terminate(&mut self) {
        self.signal("TERM");
    }
    fn kill(&mut self) {
        self.signal("KILL");
    }
}

/// `(pid, parent pid)` of every process, from `/proc/<pid>/stat`.
fn process_table() -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((pid, parent_of(&stat)?))
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: the second field after the
/// command name, which is in parentheses and may itself hold spaces and `)`.
fn parent_of(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Every process below `root` in `table`, parents before their children.
fn descendants(root: u32, table: &[(u32, u32)]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, _) in table
            .iter()
            .filter(|(pid, ppid)| *ppid == parent && *pid != root)
        {
            if !out.contains(pid) {
                out.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
