//! Steps that run side by side in lanes: the steps of one lane one after
//! another, the lanes at the same time. Each line a step prints goes to CI's
//! output prefixed with `[step]` as it comes, and to `<work>/ci-<step>.log`
//! whole. A background step ([`spawn_background`]) is logged the same way
//! and runs beside everything after it.
//!
//! The e2e legs are one lane each; the checks that need no cluster (clippy,
//! doc, the unit tests) are one more lane beside them, at a lower priority.
//! A leg is mostly waiting (for kubelets, the scheduler, timeouts: one leg
//! alone keeps about a fifth of 2 cores busy), so the checks use the cores
//! the legs leave idle instead of running before them.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{Step, announce, command_of, wait_within_limit};

/// One step's outcome.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) name: String,
    pub(super) ok: bool,
    /// The step's own duration.
    pub(super) took: Duration,
    /// The limit it ran out of, when it did (then `ok` is false).
    pub(super) ran_out: Option<Duration>,
}

impl Outcome {
    /// The step in CI's summary line.
    pub(super) fn summary(&self) -> String {
        let result = match (self.ok, self.ran_out) {
            (true, _) => "ok".to_string(),
            (false, None) => "FAILED".to_string(),
            (false, Some(l)) => format!("RAN OUT of its {}s limit", l.as_secs()),
        };
        format!("{} {result} ({:.0}s)", self.name, self.took.as_secs_f64())
    }
}

/// Runs `batch` in lanes (grouped by [`Step::lane`], in the order the lanes
/// first appear). A lane stops at its first failed step unless `keep_going`.
/// Returns how many lanes ran, and the outcomes lane by lane, each lane's in
/// its order.
pub(super) fn run(
    batch: Vec<Step>,
    scratch: Option<&Path>,
    work: &Path,
    keep_going: bool,
) -> Result<(usize, Vec<Outcome>)> {
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let mut lanes: Vec<(String, Vec<Step>)> = Vec::new();
    for step in batch {
        let lane = step.lane.clone().unwrap_or_else(|| step.name.clone());
        match lanes.iter_mut().find(|(name, _)| *name == lane) {
            Some((_, steps)) => steps.push(step),
            None => lanes.push((lane, vec![step])),
        }
    }
    let count = lanes.len();
    let threads: Vec<_> = lanes
        .into_iter()
        .map(|(_, steps)| {
            let scratch = scratch.map(Path::to_path_buf);
            let work = work.to_path_buf();
            std::thread::spawn(move || -> Result<Vec<Outcome>> {
                let mut outcomes = Vec::new();
                for step in steps {
                    let outcome = run_logged(&step, scratch.as_deref(), &work)?;
                    let failed = !outcome.ok;
                    outcomes.push(outcome);
                    if failed && !keep_going {
                        break;
                    }
                }
                Ok(outcomes)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in threads {
        outcomes.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("a lane's thread panicked"))??,
        );
    }
    Ok((count, outcomes))
}

/// A step running in the background ([`Step::background`]).
pub(super) struct Background {
    thread: std::thread::JoinHandle<Result<(Outcome, Duration)>>,
    done: Arc<Mutex<Option<bool>>>,
}

impl Background {
    /// Whether the step has ended and failed (without waiting for it).
    pub(super) fn failed(&self) -> bool {
        self.done.lock().is_ok_and(|d| *d == Some(false))
    }

    /// Waits for the step: its outcome, and when it ended, counted from the
    /// `run_started` given to [`spawn_background`].
    pub(super) fn join(self) -> Result<(Outcome, Duration)> {
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("a background step's thread panicked"))?
    }
}

/// Starts `step` on a thread of its own, prefixed and logged like a lane's
/// step.
pub(super) fn spawn_background(
    step: Step,
    scratch: Option<std::path::PathBuf>,
    work: std::path::PathBuf,
    run_started: Instant,
) -> Background {
    let done = Arc::new(Mutex::new(None));
    let flag = Arc::clone(&done);
    let thread = std::thread::spawn(move || {
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        let result = run_logged(&step, scratch.as_deref(), &work);
        if let Ok(mut d) = flag.lock() {
            *d = Some(result.as_ref().is_ok_and(|o| o.ok));
        }
        Ok((result?, run_started.elapsed()))
    });
    Background { thread, done }
}

/// One step with its output prefixed and logged; its result is announced
/// when it ends.
fn run_logged(step: &Step, scratch: Option<&Path>, work: &Path) -> Result<Outcome> {
    let started = Instant::now();
    announce(step);
    let log_path = work.join(format!("ci-{}.log", step.name));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let log = Arc::new(Mutex::new(log));
    let mut child = command_of(step, scratch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting step {}", step.name))?;
    let out: Option<Box<dyn Read + Send>> = child
        .stdout
        .take()
        .map(|o| Box::new(o) as Box<dyn Read + Send>);
    let err: Option<Box<dyn Read + Send>> = child
        .stderr
        .take()
        .map(|e| Box::new(e) as Box<dyn Read + Send>);
    let copiers: Vec<_> = [out, err]
        .into_iter()
        .flatten()
        .map(|stream| {
            let name = step.name.clone();
            let log = Arc::clone(&log);
            std::thread::spawn(move || prefix_lines(&name, stream, &log))
        })
        .collect();
    let waited = wait_within_limit(step, &mut child);
    // A stopped step's pipes close with its processes.
    for c in copiers {
        let _ = c.join();
    }
    let took = started.elapsed();
    let (ok, ran_out) = waited?;
    eprintln!(
        "==> ci: {} {} after {:.0}s (whole output: {})",
        step.name,
        if ok { "ok" } else { "FAILED" },
        took.as_secs_f64(),
        log_path.display()
    );
    Ok(Outcome {
        name: step.name.clone(),
        ok,
        took,
        ran_out,
    })
}

/// Copies `stream` line by line to stderr, prefixed with `[name]`, and to `log`.
fn prefix_lines(name: &str, stream: Box<dyn Read + Send>, log: &Mutex<std::fs::File>) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        eprintln!("[{name}] {text}");
        if let Ok(mut f) = log.lock() {
            let _ = writeln!(f, "{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(name: &str, lane: &str, script: &str) -> Step {
        Step {
            name: name.into(),
            program: "sh",
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            lane: Some(lane.into()),
            background: false,
            nice: false,
            limit: Duration::from_secs(600),
        }
    }

    /// A shell loop that waits for `file` to exist, checking at most 400
    /// times (a count, not a clock), and prints what it found.
    fn wait_for(file: &Path) -> String {
        format!(
            "for i in $(seq 400); do [ -e '{f}' ] && break; sleep 0.05; done; \
             if [ -e '{f}' ]; then echo released; else echo never released; fi",
            f = file.display()
        )
    }

    fn names_and_results(outcomes: &[Outcome]) -> Vec<(&str, bool)> {
        outcomes.iter().map(|o| (o.name.as_str(), o.ok)).collect()
    }

    /// The niceness of a process started the way `step` is.
    fn niceness_of(step: Step, work: &Path) -> i64 {
        let (_, outcomes) = run(vec![step.clone_named("probe")], None, work, false).unwrap();
        assert!(outcomes[0].ok, "{outcomes:?}");
        let log = std::fs::read_to_string(work.join("ci-probe.log")).unwrap();
        log.trim().parse().unwrap()
    }

    impl Step {
        fn clone_named(&self, name: &str) -> Step {
            Step {
                name: name.into(),
                program: self.program,
                args: self.args.clone(),
                env: self.env.clone(),
                lane: self.lane.clone(),
                background: self.background,
                nice: self.nice,
                limit: self.limit,
            }
        }
    }

    #[test]
    fn a_nice_step_runs_at_lower_priority_with_its_environment() {
        let work = tempfile::tempdir().unwrap();
        // Field 19 of /proc/self/stat is the niceness (the command's name,
        // field 2, has no spaces here).
        let script = "test \"$CI_PROBE\" = set && cut -d' ' -f19 /proc/self/stat";
        let plain = Step {
            env: vec![("CI_PROBE", "set".into())],
            ..sh("probe", "probe", script)
        };
        let base = niceness_of(plain.clone_named("probe"), work.path());
        let lower = niceness_of(
            Step {
                nice: true,
                ..plain
            },
            work.path(),
        );
        // At most 19; a run that is already at 19 cannot go lower.
        assert_eq!(lower, (base + i64::from(super::super::NICE)).min(19));
        assert!(base == 19 || lower > base, "{base} {lower}");
    }

    #[test]
    fn a_background_step_runs_beside_the_caller_and_reports_when_it_ended() {
        let work = tempfile::tempdir().unwrap();
        let go = work.path().join("go");
        let started = Instant::now();
        let b = spawn_background(
            sh("bg", "bg", &format!("{}; exit 4", wait_for(&go))),
            None,
            work.path().to_path_buf(),
            started,
        );
        // Started, not waited for: the step cannot end before the caller
        // releases it, and the caller got here.
        assert!(!b.failed(), "not ended yet");
        std::fs::write(&go, "").unwrap();
        // Seen as failed once it has ended, without joining.
        let mut checks = 0;
        while !b.failed() && checks < 2000 {
            checks += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(b.failed(), "never ended");
        let (outcome, ended) = b.join().unwrap();
        assert_eq!((outcome.name.as_str(), outcome.ok), ("bg", false));
        assert_eq!(outcome.ran_out, None);
        // When it ended is counted from the run's start, its duration from
        // its own.
        assert!(ended >= outcome.took, "{ended:?} {outcome:?}");
        let log = std::fs::read_to_string(work.path().join("ci-bg.log")).unwrap();
        assert_eq!(log, "released\n");
    }

    #[test]
    fn output_is_logged_whole_and_outcomes_are_per_step() {
        let work = tempfile::tempdir().unwrap();
        let (_, outcomes) = run(
            vec![
                sh("a", "a", "echo one; echo two >&2; echo three"),
                sh("b", "b", "echo late; exit 3"),
            ],
            None,
            work.path(),
            false,
        )
        .unwrap();
        assert_eq!(names_and_results(&outcomes), [("a", true), ("b", false)]);
        let a = std::fs::read_to_string(work.path().join("ci-a.log")).unwrap();
        let mut lines: Vec<&str> = a.lines().collect();
        lines.sort();
        assert_eq!(lines, ["one", "three", "two"]);
        let b = std::fs::read_to_string(work.path().join("ci-b.log")).unwrap();
        assert_eq!(b, "late\n");
    }

    #[test]
    fn lanes_run_at_the_same_time_and_their_steps_one_after_another() {
        let work = tempfile::tempdir().unwrap();
        let dir = work.path();
        let (first, second) = (dir.join("first-done"), dir.join("second-started"));
        // The leg waits for the checks lane's second step: it is released
        // only if the lanes run side by side. The second step finds the
        // first one's mark: the steps of a lane run in order.
        let (_, outcomes) = run(
            vec![
                sh("leg", "legs", &wait_for(&second)),
                sh("first", "checks", &format!("touch '{}'", first.display())),
                sh(
                    "second",
                    "checks",
                    &format!(
                        "test -e '{}' && touch '{}'",
                        first.display(),
                        second.display()
                    ),
                ),
            ],
            None,
            dir,
            false,
        )
        .unwrap();
        assert_eq!(
            names_and_results(&outcomes),
            [("leg", true), ("first", true), ("second", true)]
        );
        let leg = std::fs::read_to_string(dir.join("ci-leg.log")).unwrap();
        assert_eq!(leg, "released\n", "the lanes ran one after the other");
    }

    #[test]
    fn a_step_past_its_limit_fails_says_so_and_stops_its_lane() {
        let work = tempfile::tempdir().unwrap();
        let (_, outcomes) = run(
            vec![
                Step {
                    limit: Duration::from_secs(1),
                    ..sh("hangs", "checks", "sleep 300")
                },
                sh("after", "checks", "true"),
            ],
            None,
            work.path(),
            false,
        )
        .unwrap();
        assert_eq!(names_and_results(&outcomes), [("hangs", false)]);
        assert_eq!(outcomes[0].ran_out, Some(Duration::from_secs(1)));
        assert!(
            outcomes[0]
                .summary()
                .starts_with("hangs RAN OUT of its 1s limit"),
            "{}",
            outcomes[0].summary()
        );
    }

    #[test]
    fn a_lane_stops_at_its_first_failure_unless_told_to_keep_going() {
        let work = tempfile::tempdir().unwrap();
        let batch = || {
            vec![
                sh("leg", "leg", "true"),
                sh("broken", "checks", "exit 1"),
                sh("after", "checks", "true"),
            ]
        };
        let (lanes, outcomes) = run(batch(), None, work.path(), false).unwrap();
        assert_eq!(lanes, 2, "the leg's lane and the checks' lane");
        assert_eq!(
            names_and_results(&outcomes),
            [("leg", true), ("broken", false)]
        );
        let (_, outcomes) = run(batch(), None, work.path(), true).unwrap();
        assert_eq!(
            names_and_results(&outcomes),
            [("leg", true), ("broken", false), ("after", true)]
        );
    }
}
