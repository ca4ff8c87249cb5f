//! What a process costs at rest: its CPU time and wake-ups over a window
//! ([`IdleMeter`]), from its own cgroup (nanoseconds) or `/proc` (clock
//! ticks), for `cargo xtask bench` and `cargo xtask bench neuron`.

use serde::Serialize;

/// User + system CPU time of a process so far, seconds.
pub fn proc_cpu_seconds(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_seconds_from_stat(&stat, clock_ticks())
}

pub(super) fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

fn cpu_seconds_from_stat(stat: &str, ticks: f64) -> Option<f64> {
    super::process_cpu::own_ticks(stat).map(|t| t as f64 / ticks)
}

/// Wake-ups of a process so far: the voluntary context switches of all its
/// threads (a thread that blocks and is woken again counts one), summed over
/// `/proc/<pid>/task/*/status`. Threads that have exited are not counted
/// (one that exits while the directory is read is skipped), so compare two
/// samples of a process whose threads live (tokio's workers). `None` when
/// the process is gone.
pub fn proc_wakeups(pid: i32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += voluntary_switches(&status).unwrap_or(0);
    }
    Some(total)
}

fn voluntary_switches(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU time and wake-ups of a process over a window at rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct IdleCost {
    pub window_s: f64,
    /// User + system CPU time per minute of the window, ms: from the
    /// process's accounting cgroup (nanoseconds) when [`IdleMeter`] could
    /// make one, else from `/proc/<pid>/stat` (clock ticks).
    pub cpu_ms_per_min: f64,
    /// Where `cpu_ms_per_min` comes from: `true` for the cgroup's
    /// nanosecond count, `false` for clock ticks (10 ms each: a window of
    /// `w` seconds is then exact to 2 ticks, `1200 / w` ms per minute).
    /// Reports before this field: absent (ticks).
    #[serde(default)]
    pub cpu_exact: bool,
    /// Voluntary context switches per minute of the window.
    pub wakeups_per_min: f64,
}

impl IdleCost {
    /// `CPU 3.3 ms/min, wake-ups 31/min`, with `(clock ticks)` after the
    /// CPU figure when it is not [`IdleCost::cpu_exact`].
    pub fn summary(&self) -> String {
        format!(
            "CPU {:.1} ms/min{}, wake-ups {:.0}/min",
            self.cpu_ms_per_min,
            if self.cpu_exact { "" } else { " (clock ticks)" },
            self.wakeups_per_min
        )
    }
}

/// A sample of a process's CPU time and wake-ups, to difference later.
#[derive(Debug, Clone, Copy)]
pub struct CostSample {
    at: std::time::Instant,
    cpu_s: f64,
    /// The accounting cgroup's CPU time, when the process has one.
    cpu_exact_s: Option<f64>,
    wakeups: u64,
}

impl CostSample {
    pub fn take(pid: i32) -> Option<CostSample> {
        Some(CostSample {
            at: std::time::Instant::now(),
            cpu_s: proc_cpu_seconds(pid)?,
            cpu_exact_s: None,
            wakeups: proc_wakeups(pid)?,
        })
    }

    /// The cost from `self` to `later`, per minute.
    pub fn until(&self, later: &CostSample) -> IdleCost {
        let window_s = later.at.duration_since(self.at).as_secs_f64();
        let per_min = |x: f64| {
            if window_s > 0.0 {
                x * 60.0 / window_s
            } else {
                0.0
            }
        };
        let (cpu_s, cpu_exact) = match (self.cpu_exact_s, later.cpu_exact_s) {
            (Some(a), Some(b)) => (b - a, true),
            _ => (later.cpu_s - self.cpu_s, false),
        };
        IdleCost {
            window_s,
            cpu_ms_per_min: per_min(cpu_s * 1e3),
            cpu_exact,
            wakeups_per_min: per_min(later.wakeups.saturating_sub(self.wakeups) as f64),
        }
    }
}

/// Measures a process at rest: CPU time and wake-ups over a window.
///
/// `/proc/<pid>/stat` counts CPU time in clock ticks (10 ms), which over a
/// few minutes of a process that uses tens of milliseconds a minute is too
/// coarse to compare two drivers. So the meter first moves the process into
/// a child cgroup of its own in the `cpuacct` hierarchy (cgroup v1, under
/// the cgroup it was in) or the unified hierarchy (v2, `cpu.stat`), whose
/// counter is in nanoseconds and keeps the time of threads that exited
/// (tokio's blocking threads come and go). Where that cannot be done (not
/// root, no such hierarchy), it falls back to the ticks and says so
/// ([`IdleCost::cpu_exact`]). The cgroup is removed when the meter is
/// dropped, the process moved back first.
#[derive(Debug)]
pub struct IdleMeter {
    pid: i32,
    group: Option<CpuGroup>,
    from: Option<CostSample>,
}

impl IdleMeter {
    /// Starts measuring process `pid`; `label` names its cgroup.
    pub fn start(pid: i32, label: &str) -> IdleMeter {
        let group = CpuGroup::attach(pid, label);
        let from = CostSample::take(pid).map(|mut s| {
            s.cpu_exact_s = group.as_ref().and_then(CpuGroup::seconds);
            s
        });
        IdleMeter { pid, group, from }
    }

    /// The cost since [`IdleMeter::start`]: `None` when the process's
    /// `/proc` entries could not be read.
    pub fn cost(&self) -> Option<IdleCost> {
        let mut now = CostSample::take(self.pid)?;
        now.cpu_exact_s = self.group.as_ref().and_then(CpuGroup::seconds);
        Some(self.from.as_ref()?.until(&now))
    }
}

/// A cgroup made for one process, for its CPU time.
#[derive(Debug)]
struct CpuGroup {
    dir: std::path::PathBuf,
    parent: std::path::PathBuf,
    /// cgroup v1 `cpuacct.usage` (ns) or v2 `cpu.stat` (`usage_usec`).
    v2: bool,
}

impl CpuGroup {
    fn attach(pid: i32, label: &str) -> Option<CpuGroup> {
        let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let (mount, relative, v2) = cpu_cgroup_of(&own, &mount_points())?;
        let parent = mount.join(relative.trim_start_matches('/'));
        let dir = parent.join(format!("aws-dra-bench-{label}-{pid}"));
        std::fs::create_dir(&dir).ok()?;
        let group = CpuGroup { dir, parent, v2 };
        // cgroup.procs moves every thread of the process (v1 and v2).
        std::fs::write(group.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        group.seconds()?;
        Some(group)
    }

    fn seconds(&self) -> Option<f64> {
        if self.v2 {
            let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
            let usec: f64 = stat
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse()
                .ok()?;
            Some(usec / 1e6)
        } else {
            let ns: f64 = std::fs::read_to_string(self.dir.join("cpuacct.usage"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(ns / 1e9)
        }
    }
}

impl Drop for CpuGroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `(mount point, fstype, options)` of every cgroup mount.
fn mount_points() -> Vec<(std::path::PathBuf, String, String)> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| {
                (
                    std::path::PathBuf::from(f[1]),
                    f[2].to_string(),
                    f[3].to_string(),
                )
            })
        })
        .collect()
}

/// Where a process's CPU time is counted: the mount of the v1 `cpuacct`
/// hierarchy and the process's cgroup in it (from `/proc/<pid>/cgroup`),
/// else the v2 mount and its v2 cgroup when `cpu.stat` is there.
fn cpu_cgroup_of(
    proc_cgroup: &str,
    mounts: &[(std::path::PathBuf, String, String)],
) -> Option<(std::path::PathBuf, String, bool)> {
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if id == "0" && controllers.is_empty() {
            v2_path = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "cpuacct") {
            let mount = mounts.iter().find(|(_, fstype, opts)| {
                fstype == "cgroup" && opts.split(',').any(|o| o == "cpuacct")
            })?;
            return Some((mount.0.clone(), path.to_string(), false));
        }
    }
    let path = v2_path?;
    let mount = mounts.iter().find(|(_, fstype, _)| fstype == "cgroup2")?;
    mount
        .0
        .join(path.trim_start_matches('/'))
        .join("cpu.stat")
        .exists()
        .then(|| (mount.0.clone(), path, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_are_the_voluntary_switches() {
        let status =
            "Name:\tefa-driver\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(super::voluntary_switches(status), Some(1234));
        assert_eq!(super::voluntary_switches("Name:\tx\n"), None);
        // This test's own process: its threads come and go (the harness
        // runs tests on threads), which must not make the sample fail.
        assert!(super::proc_wakeups(std::process::id() as i32).is_some());
        assert_eq!(super::proc_wakeups(i32::MAX), None);
    }

    #[test]
    fn idle_cost_is_per_minute() {
        let t = std::time::Instant::now();
        let a = super::CostSample {
            at: t,
            cpu_s: 1.0,
            cpu_exact_s: None,
            wakeups: 100,
        };
        let b = super::CostSample {
            at: t + std::time::Duration::from_secs(30),
            cpu_s: 1.5,
            cpu_exact_s: None,
            wakeups: 400,
        };
        let c = a.until(&b);
        assert!((c.cpu_ms_per_min - 1000.0).abs() < 1e-6, "{c:?}");
        assert!((c.wakeups_per_min - 600.0).abs() < 1e-6, "{c:?}");
        assert!(!c.cpu_exact);
        // With the cgroup's figure on both ends, that one counts.
        let a = super::CostSample {
            cpu_exact_s: Some(2.0),
            ..a
        };
        let b = super::CostSample {
            cpu_exact_s: Some(2.25),
            ..b
        };
        let c = a.until(&b);
        assert!((c.cpu_ms_per_min - 500.0).abs() < 1e-6, "{c:?}");
        assert!(c.cpu_exact);
        assert_eq!(c.summary(), "CPU 500.0 ms/min, wake-ups 600/min");
        let ticks = IdleCost {
            cpu_exact: false,
            ..c
        };
        assert_eq!(
            ticks.summary(),
            "CPU 500.0 ms/min (clock ticks), wake-ups 600/min"
        );
    }

    #[test]
    fn the_cpu_cgroup_is_found_in_either_hierarchy() {
        let mounts = |list: &[(&str, &str, &str)]| -> Vec<(std::path::PathBuf, String, String)> {
            list.iter()
                .map(|(m, t, o)| (m.into(), t.to_string(), o.to_string()))
                .collect()
        };
        let v1 = mounts(&[
            ("/sys/fs/cgroup/cpu", "cgroup", "rw,relatime,cpu"),
            ("/sys/fs/cgroup/cpuacct", "cgroup", "rw,relatime,cpuacct"),
            ("/sys/fs/cgroup/unified", "cgroup2", "rw,relatime"),
        ]);
        let own = "4:memory:/a\n2:cpuacct:/x/y\n1:cpu:/\n0::/\n";
        assert_eq!(
            super::cpu_cgroup_of(own, &v1),
            Some(("/sys/fs/cgroup/cpuacct".into(), "/x/y".into(), false))
        );
        // Joined controllers (cpu,cpuacct) on one mount.
        let joined = mounts(&[("/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct")]);
        assert_eq!(
            super::cpu_cgroup_of("3:cpu,cpuacct:/k\n", &joined),
            Some(("/sys/fs/cgroup/cpu,cpuacct".into(), "/k".into(), false))
        );
        // No cpuacct and no v2 line: nothing.
        assert_eq!(super::cpu_cgroup_of("4:memory:/a\n", &v1), None);
    }

    /// On a machine where the meter can make its cgroup (root, a cpuacct or
    /// v2 hierarchy), it counts a child's CPU time in nanoseconds, threads
    /// that exited included, and removes the cgroup when dropped; elsewhere
    /// it falls back to the ticks and says so.
    #[test]
    fn the_meter_counts_a_busy_child() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "read _; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 30",
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let meter = super::IdleMeter::start(pid, "test");
        let dir = meter.group.as_ref().map(|g| g.dir.clone());
        drop(child.stdin.take()); // starts the busy loop
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let cost = meter.cost().unwrap();
        assert!(cost.window_s >= 1.4, "{cost:?}");
        if let Some(dir) = &dir {
            assert!(cost.cpu_exact, "{cost:?}");
            assert!(cost.cpu_ms_per_min > 0.0, "the loop used CPU: {cost:?}");
            drop(meter);
            assert!(!dir.exists(), "the cgroup is removed");
        } else {
            assert!(!cost.cpu_exact);
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn cpu_time_from_stat_survives_odd_names() {
        let stat =
            "42 (kube apiserver) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 10 0 5 0 0";
        assert_eq!(cpu_seconds_from_stat(stat, 100.0), Some(4.0));
    }
}
