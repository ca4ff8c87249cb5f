//! The limit logic on a clock that moves only when the watch sleeps, and a
//! process that exits when the test says.

use super::*;

/// Exits by itself once the clock reads `exits_at` (never when `None`);
/// after SIGTERM once `grace_needed` more has passed (never when `None`);
/// at once after SIGKILL. Records the signals it got and when.
struct Scripted<'c> {
    clock: &'c std::cell::Cell<Duration>,
    exits_at: Option<Duration>,
    success: bool,
    grace_needed: Option<Duration>,
    terminated_at: Option<Duration>,
    killed_at: Option<Duration>,
}

impl Watched for Scripted<'_> {
    fn exited(&mut self) -> Result<Option<bool>> {
        let now = self.clock.get();
        if self.killed_at.is_some() {
            return Ok(Some(false));
        }
        if let (Some(t), Some(g)) = (self.terminated_at, self.grace_needed)
            && now >= t + g
        {
            return Ok(Some(false));
        }
        Ok(self.exits_at.filter(|at| now >= *at).map(|_| self.success))
    }
    fn terminate(&mut self) {
        self.terminated_at = Some(self.clock.get());
    }
    fn kill(&mut self) {
        self.killed_at = Some(self.clock.get());
    }
}

/// A clock that advances by exactly what the watch sleeps, shared with the
/// process, which reads the time too.
struct Shared<'c>(&'c std::cell::Cell<Duration>);

impl Clock for Shared<'_> {
    fn elapsed(&self) -> Duration {
        self.0.get()
    }
    fn sleep(&mut self, d: Duration) {
        assert!(!d.is_zero(), "a zero sleep would spin");
        self.0.set(self.0.get() + d);
    }
}

fn scripted(clock: &std::cell::Cell<Duration>) -> Scripted<'_> {
    Scripted {
        clock,
        exits_at: None,
        success: true,
        grace_needed: None,
        terminated_at: None,
        killed_at: None,
    }
}

const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn a_step_that_ends_within_its_limit_keeps_its_result() {
    for success in [true, false] {
        let now = std::cell::Cell::new(Duration::ZERO);
        let mut p = Scripted {
            exits_at: Some(Duration::from_secs(599)),
            success,
            ..scripted(&now)
        };
        let ended = watch(&mut p, LIMIT, &mut Shared(&now)).unwrap();
        assert_eq!(ended, Ended::Exited(success));
        assert_eq!((p.terminated_at, p.killed_at), (None, None));
        assert!(now.get() < LIMIT, "{:?}", now.get());
    }
}

#[test]
fn a_step_past_its_limit_is_asked_to_end_and_fails() {
    let now = std::cell::Cell::new(Duration::ZERO);
    let mut p = Scripted {
        grace_needed: Some(Duration::from_secs(3)),
        ..scripted(&now)
    };
    let ended = watch(&mut p, LIMIT, &mut Shared(&now)).unwrap();
    assert_eq!(ended, Ended::RanOut);
    // Stopped at the limit exactly, not a poll later, and not killed: it
    // ended within the grace.
    assert_eq!(p.terminated_at, Some(LIMIT));
    assert_eq!(p.killed_at, None);
    assert_eq!(now.get(), LIMIT + Duration::from_secs(3));
}

#[test]
fn a_step_that_ignores_the_request_is_killed_after_the_grace() {
    let now = std::cell::Cell::new(Duration::ZERO);
    let mut p = scripted(&now);
    let ended = watch(&mut p, LIMIT, &mut Shared(&now)).unwrap();
    assert_eq!(ended, Ended::RanOut);
    assert_eq!(p.terminated_at, Some(LIMIT));
    assert_eq!(p.killed_at, Some(LIMIT + GRACE));
}

#[test]
fn a_step_that_exits_in_the_grace_still_ran_out() {
    // Exiting with success after SIGTERM does not make the step pass.
    let now = std::cell::Cell::new(Duration::ZERO);
    let mut p = Scripted {
        exits_at: Some(LIMIT + Duration::from_secs(1)),
        ..scripted(&now)
    };
    assert_eq!(
        watch(&mut p, LIMIT, &mut Shared(&now)).unwrap(),
        Ended::RanOut
    );
}

#[test]
fn the_message_names_the_step_and_its_limit() {
    assert_eq!(
        ran_out_message("e2e-1.37-host", Duration::from_secs(1500)),
        "step e2e-1.37-host ran out of its time limit of 1500s and was stopped"
    );
}

#[test]
fn descendants_are_found_below_the_step_only() {
    // 10 -> 11 -> 13, 10 -> 12; 20 -> 21 is someone else's.
    let table = [(10, 1), (11, 10), (12, 10), (13, 11), (20, 1), (21, 20)];
    let mut found = descendants(10, &table);
    found.sort();
    assert_eq!(found, [11, 12, 13]);
    assert!(descendants(13, &table).is_empty());
}

#[test]
fn the_parent_pid_is_read_past_a_command_name_with_spaces() {
    assert_eq!(parent_of("42 (cargo) S 7 42 42 0"), Some(7));
    assert_eq!(parent_of("43 (a b) c) R 9 43 43 0"), Some(9));
    assert_eq!(parent_of("garbage"), None);
}

#[test]
fn a_real_process_tree_is_stopped_whole() {
    // A shell that starts a grandchild which ignores nothing: both end when
    // the step is stopped (no time is asserted, only who is left). The
    // shell waits for that child by pid, so it exits with the child's
    // status (killed) even when the child gets the signal first; a bare
    // `wait` returns 0 then, and the shell exited "successfully".
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 300 & wait $!"])
        .spawn()
        .unwrap();
    // The grandchild is there once the table shows it.
    // Looked for a bounded number of times (a count, not a clock).
    let sleeper = (0..2000)
        .find_map(|_| {
            let found = descendants(child.id(), &process_table()).first().copied();
            if found.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            found
        })
        .expect("the shell never started its child");
    let mut p = StepProcess(&mut child);
    p.terminate();
    let status = child.wait().unwrap();
    assert!(!status.success());
    // The sleeper got the signal too: gone, or a zombie until init reaps
    // it. Checked a bounded number of times; the signal is delivered at
    // once, the exit takes the kernel a moment.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{sleeper}/stat")).is_ok_and(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    };
    let mut checks = 0;
    while alive() && checks < 500 {
        checks += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(), "the grandchild {sleeper} survived its step");
}
