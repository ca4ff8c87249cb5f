//! Where each driver's prepare time went: kubelet's figure for a round split
//! with the driver's own timing line for the same call.
//!
//! Both drivers log one line per prepare call (`key=value` fields, seconds):
//! ours `prepare call timings` (a `dra_core` debug line: `get_seconds`, the
//! claim GET, and `total_seconds`, the whole call from its start), the
//! reference `"prepare timings"` (`get_seconds`, its helper's claim GET as
//! timed by a wrapper of its HTTP transport, and `total_seconds`, from the
//! start of that GET to the end of its prepare callback). The rounds are the
//! only prepares of a run, so the last lines of a log are the rounds' calls,
//! in order.

use serde::Serialize;

use super::measure::Stats;

/// One driver's prepares, split (ms).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Breakdown {
    /// The claim GET as the driver's client timed it.
    pub claim_get_ms: Stats,
    /// The driver's own work after the GET (resolution, device reads, CDI
    /// spec and checkpoint written and synced).
    pub after_get_ms: Stats,
    /// Kubelet's figure minus the driver's: the gRPC path both ways, the
    /// driver's request handling before its timer starts, kubelet's client.
    pub outside_ms: Stats,
}

/// The timing lines of a log carrying `marker`: `(get, total)` seconds.
pub fn timing_lines(log: &str, marker: &str) -> Vec<(f64, f64)> {
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| Some((field(l, "get_seconds")?, field(l, "total_seconds")?)))
        .collect()
}

/// The number after `key=` in a log line.
fn field(line: &str, key: &str) -> Option<f64> {
    let needle = format!("{key}=");
    let at = line.match_indices(&needle).find(|(i, _)| {
        *i == 0 || !line[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
    })?;
    let rest = &line[at.0 + needle.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Splits `kubelet_s` (one prepare per round, seconds, in order) with the
/// last `kubelet_s.len()` timing lines. `None` when the log has fewer lines
/// than rounds: the calls cannot be paired.
pub fn split(kubelet_s: &[f64], lines: &[(f64, f64)]) -> Option<Breakdown> {
    if kubelet_s.is_empty() || lines.len() < kubelet_s.len() {
        return None;
    }
    let lines = &lines[lines.len() - kubelet_s.len()..];
    let ms = |f: &dyn Fn(f64, (f64, f64)) -> f64| {
        Stats::of(
            &kubelet_s
                .iter()
                .zip(lines)
                .map(|(k, l)| f(*k, *l) * 1e3)
                .collect::<Vec<_>>(),
        )
    };
    Some(Breakdown {
        claim_get_ms: ms(&|_, (get, _)| get),
        after_get_ms: ms(&|_, (get, total)| total - get),
        outside_ms: ms(&|k, (_, total)| k - total),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "\
2026-12-02T18:27:52.59Z DEBUG dra_core::prepare::state: prepare call timings claims=1 get_seconds=0.002 lock_seconds=2.2e-5 save_seconds=0.0012 total_seconds=0.004
2026-12-02T18:27:53.00Z  INFO dra_core::prepare::state: prepare claim_uid=x seconds=0.001
2026-12-02T18:27:58.65Z DEBUG dra_core::prepare::state: prepare call timings claims=1 get_seconds=0.003 total_seconds=0.005
";
    const REFERENCE: &str = r#"I1202 18:42:25.042470   15925 main.go:188] "prepare timings" claims=1 get_seconds=0.001965551 work_seconds=0.003736803 total_seconds=0.005781262"#;

    #[test]
    fn lines_are_read_from_both_formats() {
        assert_eq!(
            timing_lines(OURS, "prepare call timings"),
            vec![(0.002, 0.004), (0.003, 0.005)]
        );
        assert_eq!(
            timing_lines(REFERENCE, "\"prepare timings\""),
            vec![(0.001965551, 0.005781262)]
        );
        // A key that only ends like another is not it.
        assert_eq!(
            field("xget_seconds=1 get_seconds=2", "get_seconds"),
            Some(2.0)
        );
        assert_eq!(field("seconds=2e-5", "seconds"), Some(2e-5));
    }

    #[test]
    fn the_last_lines_pair_with_the_rounds() {
        let lines = timing_lines(OURS, "prepare call timings");
        // One round: paired with the last line.
        let b = split(&[0.006], &lines).unwrap();
        assert!((b.claim_get_ms.mean - 3.0).abs() < 1e-9, "{b:?}");
        assert!((b.after_get_ms.mean - 2.0).abs() < 1e-9, "{b:?}");
        assert!((b.outside_ms.mean - 1.0).abs() < 1e-9, "{b:?}");
        assert_eq!(split(&[0.006, 0.006, 0.006], &lines), None);
        assert_eq!(split(&[], &lines), None);
    }
}
