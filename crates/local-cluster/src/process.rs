//! Child processes that cannot outlive the test that started them.
//!
//! Each component runs in its own process group (so a Go binary's helpers go
//! with it) with stdout and stderr appended to its log file. Teardown is by
//! pid: SIGTERM to the group, a grace period, then SIGKILL. A process-wide
//! registry of teardown hooks plus a SIGINT/SIGTERM handler makes Ctrl-C tear
//! clusters down too; `Drop` covers success, failure and panic.
//!
//! Processes that leave their group on purpose (containerd's shims, container
//! processes) are not reachable through the group; the node code finds those
//! through cgroups and kills them by pid as well.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::error::{Error, Result, io};

/// A running child in its own process group, with its log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<String>,
}

impl ManagedProcess {
    /// Starts `command` in a new process group, output appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self> {
        if let Some(parent) = log.parent() {
            fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io("opening log", log))?;
        let err = out.try_clone().map_err(io("duplicating log handle", log))?;
        let rendered = format!("{command:?}");
        {
            use std::io::Write;
            let mut header = &out;
            let _ = writeln!(header, "==> {rendered}");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                command: rendered,
                source,
            })?;
        tracing::debug!(process = name, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            exited: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> i32 {
        // Linux pids fit in i32 (pid_max ≤ 2^22).
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Err(ProcessExited)` if the process has exited (reaping it).
    pub fn check_running(&mut self) -> Result<()> {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status.to_string());
        }
        match &self.exited {
            None => Ok(()),
            Some(status) => Err(Error::ProcessExited {
                name: self.name.clone(),
                pid: self.pid(),
                status: status.clone(),
                log: self.log.clone(),
                tail: log_tail(&self.log, 8),
            }),
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.check_running().is_ok()
    }

    /// Sends `signal` to the whole process group.
    pub fn signal_group(&self, signal: Signal) {
        if self.exited.is_none() {
            let _ = killpg(Pid::from_raw(self.pid()), signal);
        }
    }

    /// SIGTERM to the group, up to `grace` to exit, then SIGKILL; reaps the child.
    pub fn terminate(&mut self, grace: Duration) {
        if !self.is_running() {
            // The leader is gone, but helpers in its group may not be.
            self.kill_group_of_reaped_leader();
            return;
        }
        self.signal_group(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.is_running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.is_running() {
            let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
        } else {
            self.kill_group_of_reaped_leader();
        }
        if self.exited.is_none()
            && let Ok(status) = self.child.wait()
        {
            self.exited = Some(status.to_string());
        }
        tracing::debug!(process = %self.name, pid = self.pid(), "stopped");
    }

    /// SIGKILL to the group of a leader already reaped. While a helper of
    /// the group lives, the kernel keeps the leader's pid as the group id and
    /// hands it to no new process; once none does, the pid is free and may
    /// belong to an unrelated process, maybe the leader of its own group (a
    /// container of another cluster, with pids wrapping on a busy machine).
    /// So a process now holding the pid means the group is gone and the pid
    /// is someone else's: no signal.
    fn kill_group_of_reaped_leader(&self) {
        if !Path::new(&format!("/proc/{}", self.pid())).exists() {
            let _ = killpg(Pid::from_raw(self.pid()), Signal::SIGKILL);
        }
    }

    /// SIGKILL to the group at once (a crash, for resilience tests), reaped.
    pub fn kill(&mut self) {
        self.terminate(Duration::ZERO);
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}

/// Fields 3 onwards of `/proc/<pid>/stat` (those after the parenthesised
/// command, which may hold spaces); `None` if there is no such process.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether fields 3 onwards of a stat line are a live process: field 3 is
/// the state, and Z (zombie) or X (dead) is not.
fn live(fields: &[String]) -> bool {
    fields
        .first()
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Field 22, the start time (clock ticks since boot), from fields 3 onwards.
fn started_at(fields: &[String]) -> Option<u64> {
    fields.get(22 - 3)?.parse().ok()
}

/// A NUL-separated `/proc/<pid>/<file>` as strings.
pub(crate) fn proc_strings(pid: i32, file: &str) -> Result<Vec<String>> {
    let path = format!("/proc/{pid}/{file}");
    let bytes = std::fs::read(&path).map_err(crate::error::io("reading", &path))?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// True while a process with this pid exists (and is not a zombie we own).
pub fn pid_alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| live(&f))
}

/// When process `pid` started (field 22 of `/proc/<pid>/stat`, clock ticks
/// since boot); `None` if there is no such process.
pub fn start_time(pid: i32) -> Option<u64> {
    started_at(&stat_fields(pid)?)
}

/// The processes a run started, each with its start time. Pids are reused:
/// with `pid_max` at 32768 and three clusters and a build on one machine, a
/// driver that a scenario restarted early in a run can see its pid handed to
/// an unrelated process before teardown; only a live process with the same
/// start time is still the one the run started.
#[derive(Debug, Clone, Default)]
pub struct StartedPids(BTreeMap<i32, Option<u64>>);

impl StartedPids {
    /// Records `pid` (call it right after the spawn).
    pub fn insert(&mut self, pid: i32) {
        self.0.insert(pid, start_time(pid));
    }

    /// Records each of `pids`.
    pub fn extend(&mut self, pids: impl IntoIterator<Item = i32>) {
        for pid in pids {
            self.insert(pid);
        }
    }

    /// The recorded processes that are still alive: same pid, same start
    /// time, not a zombie.
    pub fn alive(&self) -> std::collections::BTreeSet<i32> {
        self.0
            .iter()
            .filter(|(pid, started)| {
                // One read of the stat file: live, and started when recorded.
                started.is_some()
                    && stat_fields(**pid).is_some_and(|f| live(&f) && started_at(&f) == **started)
            })
            .map(|(pid, _)| *pid)
            .collect()
    }
}

type Hook = Arc<dyn Fn() + Send + Sync>;

fn registry() -> &'static Mutex<BTreeMap<u64, Hook>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<u64, Hook>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Removes its hook from the registry when dropped.
pub struct TeardownGuard(u64);

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if let Ok(mut hooks) = registry().lock() {
            hooks.remove(&self.0);
        }
    }
}

/// Registers `hook` to run if the process gets SIGINT/SIGTERM (then exits
/// with 130/143). Installs the signal handler on first use.
pub fn on_interrupt(hook: Hook) -> TeardownGuard {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static HANDLER: OnceLock<()> = OnceLock::new();
    HANDLER.get_or_init(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(mut signals) => {
                std::thread::spawn(move || {
                    if let Some(signal) = signals.forever().next() {
                        eprintln!("aws-dra-e2e: signal {signal}, tearing down local clusters");
                        let hooks: Vec<Hook> = registry()
                            .lock()
                            .map(|h| h.values().cloned().collect())
                            .unwrap_or_default();
                        for hook in hooks {
                            hook();
                        }
                        std::process::exit(128 + signal);
                    }
                });
            }
            Err(err) => {
                tracing::warn!(%err, "cannot install SIGINT handler; Ctrl-C will leak processes")
            }
        }
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut hooks) = registry().lock() {
        hooks.insert(id, hook);
    }
    TeardownGuard(id)
}

/// Runs `cmd` to completion and returns its stdout; a failure to start or a
/// non-zero exit is an error that names the command and carries its output.
pub fn run_checked(cmd: &mut std::process::Command) -> Result<String> {
    let rendered = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| Error::Spawn {
        command: rendered.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::CommandFailed {
            command: rendered,
            status: out.status.to_string(),
            output_tail: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last `n` lines of the log at `path`, each cut to 400 characters and
/// indented; a note when it cannot be read.
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return format!("    (cannot read {})", path.display());
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| {
            let cut: String = l.chars().take(400).collect();
            format!("    {cut}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminate_kills_the_whole_group() {
        // A background grandchild in the same group, then the leader waits.
        let (_dir, log, mut p) = spawn_sh("sh", "sleep 300 & echo child=$!; wait");
        let deadline = Instant::now() + Duration::from_secs(5);
        let child_pid = loop {
            if let Some(pid) = logged_child(&log) {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "no child pid in {}",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(pid_alive(child_pid));
        p.terminate(Duration::from_secs(2));
        assert!(!p.is_running());
        wait_gone(child_pid, "grandchild");
    }

    /// `sh -c script` as a managed process named `name`, logging to
    /// `<name>.log` in a temp directory (kept while the returned guard is).
    fn spawn_sh(name: &str, script: &str) -> (tempfile::TempDir, PathBuf, ManagedProcess) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(format!("{name}.log"));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        let p = ManagedProcess::spawn(name, cmd, &log).unwrap();
        (dir, log, p)
    }

    /// Waits up to 5 s for the process to exit by itself.
    fn wait_exited(p: &mut ManagedProcess, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.is_running() {
            assert!(Instant::now() < deadline, "{what} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid a test's `sh` wrote to its log as `child=<pid>`.
    fn logged_child(log: &Path) -> Option<i32> {
        fs::read_to_string(log)
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("child="))?
            .trim()
            .parse()
            .ok()
    }

    /// Waits up to 5 s for `pid` to be gone; fails the test naming `what`.
    fn wait_gone(pid: i32, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while pid_alive(pid) {
            assert!(Instant::now() < deadline, "{what} {pid} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_reaped_leaders_helpers_are_still_killed() {
        // The leader leaves a helper in its group and exits.
        let (_dir, log, mut p) = spawn_sh("sh", "sleep 300 & echo child=$!");
        wait_exited(&mut p, "the leader");
        let child = logged_child(&log).expect("the leader logged its helper's pid");
        assert!(pid_alive(child));
        p.terminate(Duration::from_secs(1));
        wait_gone(child, "helper");
    }

    #[test]
    fn started_pids_are_alive_only_as_the_same_process() {
        let mut child = Command::new("sleep").arg("300").spawn().unwrap();
        let pid = child.id() as i32;
        let mut started = StartedPids::default();
        started.insert(pid);
        assert!(start_time(pid).is_some());
        assert_eq!(started.alive().into_iter().collect::<Vec<_>>(), [pid]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(started.alive().is_empty(), "a reaped process is not alive");

        // A live pid that started at another time is someone else's now.
        let me = std::process::id() as i32;
        let mine = start_time(me).unwrap();
        let reused = StartedPids(BTreeMap::from([(me, Some(mine + 1))]));
        assert!(reused.alive().is_empty());
        let same = StartedPids(BTreeMap::from([(me, Some(mine))]));
        assert_eq!(same.alive().into_iter().collect::<Vec<_>>(), [me]);
        // Gone before it could be recorded: never counted.
        let never = StartedPids(BTreeMap::from([(me, None)]));
        assert!(never.alive().is_empty());
    }

    #[test]
    fn early_exit_names_the_log_and_says_why() {
        let (_dir, _log, mut p) = spawn_sh(
            "false",
            "echo starting; echo 'listen tcp: bind: address already in use'; exit 1",
        );
        wait_exited(&mut p, "false");
        let err = p.check_running().unwrap_err().to_string();
        assert!(err.contains("false.log"), "{err}");
        assert!(err.contains("exit status: 1"), "{err}");
        assert!(
            err.ends_with("    starting\n    listen tcp: bind: address already in use"),
            "{err}"
        );
    }
}
