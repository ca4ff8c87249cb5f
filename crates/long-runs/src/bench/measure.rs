//! The benchmark's measuring instruments, all plain parsing: Prometheus text
//! (kubelet's DRA gRPC histogram), `/proc` (memory), the API server's audit
//! log (requests per client), and summary statistics. What a process costs
//! at rest (CPU time, wake-ups) is [`super::idle`].

use std::collections::BTreeMap;

use serde::Serialize;

/// `(sum, count)` of every series of the histogram `base` (`base_sum` /
/// `base_count`) whose labels pass `keep`, added up.
pub fn histogram_totals(text: &str, base: &str, keep: impl Fn(&str) -> bool) -> (f64, u64) {
    let (mut sum, mut count) = (0.0, 0u64);
    let sum_name = format!("{base}_sum");
    let count_name = format!("{base}_count");
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if !keep(labels) {
            continue;
        }
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        if name == sum_name {
            sum += v;
        } else if name == count_name {
            count += v as u64;
        }
    }
    (sum, count)
}

/// The value of `key` in a Prometheus label set (`a="x",b="y"`).
pub fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let needle = format!("{key}=\"");
    let mut rest = labels;
    loop {
        let at = rest.find(&needle)?;
        // A whole label name: at the start or after a comma.
        if at == 0 || rest[..at].ends_with(',') {
            let value = &rest[at + needle.len()..];
            return value.find('"').map(|end| &value[..end]);
        }
        rest = &rest[at + needle.len()..];
    }
}

/// Mean, median and 99th percentile (nearest rank) of a sample.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(values: &[f64]) -> Stats {
        if values.is_empty() {
            return Stats::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let r = (q * v.len() as f64).ceil() as usize;
            v[r.clamp(1, v.len()) - 1]
        };
        Stats {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.5),
            p99: rank(0.99),
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

/// `VmRSS` and `VmHWM` (peak) of a process, KiB.
pub fn proc_memory_kib(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One request in the audit log (metadata level).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRequest {
    pub audit_id: String,
    pub verb: String,
    pub user: String,
    pub resource: String,
    /// `requestReceivedTimestamp`, seconds since the Unix epoch.
    pub received: f64,
    /// `stageTimestamp` of its `ResponseComplete` event, when logged: the
    /// response has been written. The API server stamps `received` before
    /// authentication, so `completed - received` is the whole request as
    /// the server saw it (authentication, authorization, storage, encoding).
    pub completed: Option<f64>,
}

impl AuditRequest {
    /// How long the API server spent on it, seconds.
    pub fn server_seconds(&self) -> Option<f64> {
        self.completed.map(|c| c - self.received)
    }
}

/// Every request of an audit log (JSON lines), once each: a watch or a
/// long request has several events (`ResponseStarted`, `ResponseComplete`).
pub fn parse_audit_log(text: &str) -> Vec<AuditRequest> {
    let mut at: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<AuditRequest> = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or_default();
        let id = s("/auditID").to_string();
        if id.is_empty() {
            continue;
        }
        let completed = (s("/stage") == "ResponseComplete")
            .then(|| parse_rfc3339_utc(s("/stageTimestamp")))
            .flatten();
        if let Some(&i) = at.get(&id) {
            out[i].completed = out[i].completed.or(completed);
            continue;
        }
        let Some(received) = parse_rfc3339_utc(s("/requestReceivedTimestamp")) else {
            continue;
        };
        at.insert(id.clone(), out.len());
        out.push(AuditRequest {
            audit_id: id,
            verb: s("/verb").to_string(),
            user: s("/user/username").to_string(),
            resource: s("/objectRef/resource").to_string(),
            received,
            completed,
        });
    }
    out
}

/// API server time (ms) of the claim GETs of `user` received in `[from, to)`.
pub fn claim_get_server_ms(requests: &[AuditRequest], user: &str, from: f64, to: f64) -> Stats {
    Stats::of(&claim_gets_server_ms(requests, user, from, to))
}

/// [`claim_get_server_ms`], each GET's time.
pub fn claim_gets_server_ms(requests: &[AuditRequest], user: &str, from: f64, to: f64) -> Vec<f64> {
    requests
        .iter()
        .filter(|r| r.user == user && r.verb == "get" && r.resource == "resourceclaims")
        .filter(|r| r.received >= from && r.received < to)
        .filter_map(|r| r.server_seconds())
        .map(|s| s * 1e3)
        .collect()
}

/// Requests of one client, by kind.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct RequestCounts {
    /// get, list
    pub reads: u64,
    /// watch (each new watch is one request)
    pub watches: u64,
    /// create, update, patch, delete, deletecollection
    pub writes: u64,
    /// `verb resource` → count.
    pub by_verb: BTreeMap<String, u64>,
}

impl RequestCounts {
    pub fn total(&self) -> u64 {
        self.reads + self.watches + self.writes
    }

    pub fn add(&mut self, r: &AuditRequest) {
        match r.verb.as_str() {
            "watch" => self.watches += 1,
            "get" | "list" => self.reads += 1,
            _ => self.writes += 1,
        }
        *self
            .by_verb
            .entry(format!("{} {}", r.verb, r.resource))
            .or_default() += 1;
    }
}

/// The requests of users passing `user` received in `[from, to)`.
pub fn count_requests(
    requests: &[AuditRequest],
    user: impl Fn(&str) -> bool,
    from: f64,
    to: f64,
) -> RequestCounts {
    let mut counts = RequestCounts::default();
    for r in requests
        .iter()
        .filter(|r| r.received >= from && r.received < to && user(&r.user))
    {
        counts.add(r);
    }
    counts
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` → seconds since the epoch (the audit log
/// writes UTC only).
pub fn parse_rfc3339_utc(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let frac: f64 = format!("0.{frac}").parse().ok()?;
    // Days from 1970-01-01 of a proleptic Gregorian date (civil-from-days inverse).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64 + frac)
}

/// Seconds since the epoch now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = r#"# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration
# TYPE dra_grpc_operations_duration_seconds histogram
dra_grpc_operations_duration_seconds_bucket{driver_name="a",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",le="+Inf"} 3
dra_grpc_operations_duration_seconds_sum{driver_name="a",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 0.03
dra_grpc_operations_duration_seconds_count{driver_name="a",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 3
dra_grpc_operations_duration_seconds_sum{driver_name="a",grpc_status_code="Unavailable",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 0.5
dra_grpc_operations_duration_seconds_count{driver_name="a",grpc_status_code="Unavailable",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1
dra_grpc_operations_duration_seconds_sum{driver_name="ab",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 7
dra_grpc_operations_duration_seconds_count{driver_name="ab",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 7
dra_grpc_operations_duration_seconds_sum{driver_name="a",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 0.02
dra_grpc_operations_duration_seconds_count{driver_name="a",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 2
"#;

    #[test]
    fn histogram_totals_pick_driver_and_method_over_every_status() {
        let keep = |l: &str| {
            label(l, "driver_name") == Some("a")
                && label(l, "method_name").is_some_and(|m| m.ends_with("/NodePrepareResources"))
        };
        let (sum, count) = histogram_totals(KUBELET, "dra_grpc_operations_duration_seconds", keep);
        assert!((sum - 0.53).abs() < 1e-9, "{sum}");
        assert_eq!(count, 4);
    }

    #[test]
    fn label_matches_whole_names_only() {
        assert_eq!(
            label(r#"xdriver_name="b",driver_name="a""#, "driver_name"),
            Some("a")
        );
        assert_eq!(label(r#"a="1""#, "b"), None);
    }

    #[test]
    fn stats_use_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = Stats::of(&v);
        assert_eq!(
            (s.n, s.p50, s.p99, s.min, s.max),
            (20, 10.0, 20.0, 1.0, 20.0)
        );
        assert!((s.mean - 10.5).abs() < 1e-9);
        assert_eq!(Stats::of(&[]).n, 0);
    }

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(
            parse_rfc3339_utc("2026-12-01T06:00:00.250000Z"),
            Some(1_796_104_800.25)
        );
        assert_eq!(
            parse_rfc3339_utc("2000-03-01T00:00:00Z"),
            Some(951_868_800.0)
        );
        assert_eq!(parse_rfc3339_utc("2000-03-01T00:00:00+01:00"), None);
    }

    #[test]
    fn audit_requests_are_counted_once_per_id_in_the_window() {
        let log = [
            r#"{"auditID":"1","stage":"ResponseStarted","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"resourceslices"},"requestReceivedTimestamp":"2026-12-01T06:00:01Z"}"#,
            r#"{"auditID":"1","stage":"ResponseComplete","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"resourceslices"},"requestReceivedTimestamp":"2026-12-01T06:00:01Z"}"#,
            r#"{"auditID":"2","stage":"ResponseComplete","verb":"create","user":{"username":"u"},"objectRef":{"resource":"resourceslices"},"requestReceivedTimestamp":"2026-12-01T06:00:02Z"}"#,
            r#"{"auditID":"3","stage":"ResponseComplete","verb":"get","user":{"username":"v"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:02Z"}"#,
            r#"{"auditID":"4","stage":"ResponseComplete","verb":"list","user":{"username":"u"},"objectRef":{"resource":"resourceslices"},"requestReceivedTimestamp":"2026-12-01T06:00:09Z"}"#,
            "not json",
        ]
        .join("\n");
        let requests = parse_audit_log(&log);
        assert_eq!(requests.len(), 4);
        let t0 = parse_rfc3339_utc("2026-12-01T06:00:00Z").unwrap();
        let c = count_requests(&requests, |u| u == "u", t0, t0 + 5.0);
        assert_eq!((c.watches, c.writes, c.reads), (1, 1, 0));
        assert_eq!(c.by_verb.get("create resourceslices"), Some(&1));
        assert_eq!(c.total(), 2);
    }

    #[test]
    fn server_time_runs_from_received_to_response_complete() {
        let log = [
            r#"{"auditID":"1","stage":"ResponseStarted","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:01.000000Z","stageTimestamp":"2026-12-01T06:00:01.001000Z"}"#,
            r#"{"auditID":"2","stage":"ResponseComplete","verb":"get","user":{"username":"u"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:02.000100Z","stageTimestamp":"2026-12-01T06:00:02.001600Z"}"#,
            r#"{"auditID":"3","stage":"ResponseComplete","verb":"get","user":{"username":"u"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:03.000000Z","stageTimestamp":"2026-12-01T06:00:03.002500Z"}"#,
            r#"{"auditID":"4","stage":"ResponseComplete","verb":"get","user":{"username":"v"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:03.000000Z","stageTimestamp":"2026-12-01T06:00:03.009000Z"}"#,
            r#"{"auditID":"1","stage":"ResponseComplete","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"resourceclaims"},"requestReceivedTimestamp":"2026-12-01T06:00:01.000000Z","stageTimestamp":"2026-12-01T06:01:01Z"}"#,
        ]
        .join("\n");
        let requests = parse_audit_log(&log);
        assert_eq!(requests.len(), 4);
        // The watch's completion comes from its later event.
        let watch = requests[0].server_seconds().unwrap();
        assert!((watch - 60.0).abs() < 1e-6, "{watch}");
        let t0 = parse_rfc3339_utc("2026-12-01T06:00:00Z").unwrap();
        let gets = claim_get_server_ms(&requests, "u", t0, t0 + 10.0);
        assert_eq!(gets.n, 2);
        assert!((gets.mean - 2.0).abs() < 1e-3, "{gets:?}");
        assert!((gets.min - 1.5).abs() < 1e-3, "{gets:?}");
        assert_eq!(
            claim_get_server_ms(&requests, "u", t0 + 2.5, t0 + 10.0).n,
            1
        );
    }
}
