//! Crash points for the crash-consistency tests: in a test build, the
//! process aborts at the point named by `DRA_CORE_CRASH_AT` while a group
//! of two or more calls is being committed (see `state::group`); in every
//! other build a point is nothing.

#[cfg(test)]
static GROUP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The size of the group being served (test builds only).
#[cfg(test)]
pub(crate) fn group_size(calls: usize) {
    GROUP.store(calls, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn group_size(_calls: usize) {}

/// Aborts here when asked to (test builds only).
#[cfg(test)]
pub(crate) fn point(name: &str) {
    if GROUP.load(std::sync::atomic::Ordering::SeqCst) >= 2
        && std::env::var("DRA_CORE_CRASH_AT").is_ok_and(|at| at == name)
    {
        // What a SIGKILL would leave: no destructor, no flush.
        std::process::abort();
    }
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn point(_name: &str) {}
