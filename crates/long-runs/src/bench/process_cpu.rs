//! Where a burst's CPU goes, by process name: every process's CPU time
//! (`/proc/<pid>/stat`: user and system time, its own and that of the
//! children it has reaped) read before and after a window, the growth
//! summed per command name.
//!
//! A process is known by its pid and start time, so a pid reused in the
//! window is a new process. One started in the window counts whole; one
//! that ended in it is lost, unless its parent reaped it, which then counts
//! its child's time (runc under containerd's shim, a container's process
//! under its shim): the shim's name stands for the pod's start and stop.
//! Except for pid 1, whose own time alone counts: it reaps every orphan of
//! the machine, among them the shims of pods deleted before the window
//! (whose time was counted while they lived), which made the machine's init
//! look like the busiest process of some bursts.
//! Clock ticks are 10 ms, fine for bursts that take seconds.

use std::collections::BTreeMap;

/// Every process's CPU time at one moment: (pid, start time) → (name, ticks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot(BTreeMap<(i32, u64), (String, u64)>);

impl Snapshot {
    /// Reads `/proc`; a process that exits while it is read is skipped.
    pub fn now() -> Snapshot {
        let mut all = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Snapshot(all);
        };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some(t) = parse_stat(&stat) {
                let ticks = counted(pid, &t);
                all.insert((pid, t.start), (t.name, ticks));
            }
        }
        Snapshot(all)
    }

    /// CPU time per process name from `self` to `later`, ms; names with
    /// none left out.
    pub fn growth_ms(&self, later: &Snapshot, ticks_per_s: f64) -> BTreeMap<String, f64> {
        let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
        for (key, (name, ticks)) in &later.0 {
            let before = self.0.get(key).map_or(0, |(_, t)| *t);
            *by_name.entry(name.clone()).or_default() += ticks.saturating_sub(before);
        }
        by_name
            .into_iter()
            .filter(|(_, t)| *t > 0)
            .map(|(name, t)| (name, t as f64 * 1e3 / ticks_per_s))
            .collect()
    }
}

/// The ticks a process counts: its own and its reaped children's, but
/// init's own alone.
fn counted(pid: i32, t: &Times) -> u64 {
    if pid == 1 { t.own } else { t.own + t.children }
}

/// utime + stime of one `/proc/<pid>/stat` line, ticks.
pub(super) fn own_ticks(stat: &str) -> Option<u64> {
    parse_stat(stat).map(|t| t.own)
}

/// What one `/proc/<pid>/stat` line says of a process's CPU time, ticks.
#[derive(Debug, PartialEq)]
struct Times {
    name: String,
    start: u64,
    /// utime + stime.
    own: u64,
    /// cutime + cstime: of the children it has reaped.
    children: u64,
}

fn parse_stat(stat: &str) -> Option<Times> {
    // The name is between the first '(' and the last ')', and may hold both.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    // After ')': state is field 3 of the line; utime 14, stime 15, cutime
    // 16, cstime 17, starttime 22.
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    // cutime and cstime are signed in the kernel's format; never negative in practice.
    Some(Times {
        name,
        start: field(22)?,
        own: field(14)? + field(15)?,
        children: field(16)? + field(17)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: i32, name: &str, utime: u64, cutime: u64, start: u64) -> String {
        format!(
            "{pid} ({name}) S 1 1 1 0 -1 4194560 10 0 0 0 {utime} 5 {cutime} 0 20 0 8 0 {start} 1000 100"
        )
    }

    #[test]
    fn a_stat_line_gives_its_name_start_and_all_four_times() {
        let line = stat(7, "containerd-shim", 30, 12, 999);
        let times = |name: &str, start, own, children| Times {
            name: name.into(),
            start,
            own,
            children,
        };
        assert_eq!(
            parse_stat(&line),
            Some(times("containerd-shim", 999, 30 + 5, 12))
        );
        let odd = "8 (a) b (c)) R 1 1 1 0 -1 0 0 0 0 0 1 2 3 4 20 0 1 0 77 0 0";
        assert_eq!(parse_stat(odd), Some(times("a) b (c)", 77, 3, 7)));
        assert_eq!(parse_stat("9 (short) R 1 2"), None);
    }

    #[test]
    fn growth_is_per_name_and_a_reused_pid_counts_as_new() {
        let snap = |lines: &[String]| {
            Snapshot(
                lines
                    .iter()
                    .map(|l| {
                        let pid = l.split(' ').next().unwrap().parse().unwrap();
                        let t = parse_stat(l).unwrap();
                        ((pid, t.start), (t.name.clone(), counted(pid, &t)))
                    })
                    .collect(),
            )
        };
        let before = snap(&[
            stat(1, "init", 7, 500, 1),
            stat(10, "kube-apiserver", 100, 0, 5),
            stat(11, "etcd", 50, 0, 5),
            stat(12, "runc", 3, 0, 6),
        ]);
        let after = snap(&[
            // Init reaped an orphaned shim of 900 ticks: only its own 1 counts.
            stat(1, "init", 8, 1400, 1),
            stat(10, "kube-apiserver", 130, 0, 5),
            // Unchanged: left out.
            stat(11, "etcd", 50, 0, 5),
            // Pid 12 ended and was reused by a new shim: counted whole.
            stat(12, "containerd-shim", 4, 2, 80),
            stat(13, "containerd-shim", 1, 0, 81),
        ]);
        let got = before.growth_ms(&after, 100.0);
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            [
                ("containerd-shim".to_string(), (9.0 + 2.0 + 6.0) * 10.0),
                ("init".to_string(), 10.0),
                ("kube-apiserver".to_string(), 300.0),
            ]
        );
    }
}
