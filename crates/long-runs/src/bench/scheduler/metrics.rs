//! Reading the control plane's own instruments: Prometheus histograms and
//! counters from `/metrics` text (quantiles of the difference of two
//! scrapes, as `histogram_quantile` over an `increase` would give), the
//! scheduler's secure port (metrics, CPU profile) and etcd's client port.
//!
//! The scheduler's port is not kept by the local cluster, so it is read back
//! from the process's command line (`--secure-port=N`), as etcd's client URL
//! (`--listen-client-urls=`).

use std::path::Path;
use std::time::Duration;

use local_cluster::error::{Error, Result};

/// A histogram summed over every series whose labels pass a filter:
/// cumulative counts per upper bound (`le`), ascending, `+Inf` last.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

/// Splits one exposition line into name, labels (without braces) and value.
fn sample(line: &str) -> Option<(&str, &str, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.trim().parse::<f64>().ok()?;
    Some(match series.split_once('{') {
        Some((name, labels)) => (name, labels.trim_end_matches('}'), value),
        None => (series, "", value),
    })
}

impl Histogram {
    /// `base`'s buckets, sum and count in `text`, over the series whose
    /// labels (`a="x",b="y"`, without `le`) pass `keep`.
    pub fn parse(text: &str, base: &str, keep: impl Fn(&str) -> bool) -> Histogram {
        let bucket = format!("{base}_bucket");
        let sum = format!("{base}_sum");
        let count = format!("{base}_count");
        let mut h = Histogram::default();
        for (name, labels, value) in text.lines().filter_map(sample) {
            if !keep(labels) {
                continue;
            }
            if name == bucket {
                let Some(le) = crate::bench::measure::label(labels, "le") else {
                    continue;
                };
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    match le.parse::<f64>() {
                        Ok(v) => v,
                        Err(_) => continue,
                    }
                };
                match h.buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += value,
                    None => h.buckets.push((le, value)),
                }
            } else if name == sum {
                h.sum += value;
            } else if name == count {
                h.count += value;
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
    }

    /// What was observed between `earlier` and `self` (a later scrape of
    /// the same process).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, (c - before(*le)).max(0.0)))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// The `q` quantile, interpolated linearly inside its bucket as
    /// Prometheus's `histogram_quantile` does (the first bucket from 0; a
    /// rank in the `+Inf` bucket answers the highest finite bound). `None`
    /// without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last().map(|(_, c)| *c)?;
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut lower = (0.0, 0.0);
        for &(le, count) in &self.buckets {
            if count >= rank {
                if le.is_infinite() {
                    return Some(lower.0);
                }
                let width = count - lower.1;
                let within = if width > 0.0 {
                    (rank - lower.1) / width
                } else {
                    1.0
                };
                return Some(lower.0 + (le - lower.0) * within);
            }
            lower = (le, count);
        }
        Some(lower.0)
    }
}

/// The sum of every sample of `name` whose labels pass `keep` (a counter
/// or gauge over its series).
pub fn total(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter_map(sample)
        .filter(|(n, labels, _)| *n == name && keep(labels))
        .map(|(_, _, v)| v)
        .sum()
}

/// The value of `--flag=value` in a command line.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let prefix = format!("{flag}=");
    args.iter().find_map(|a| a.strip_prefix(prefix.as_str()))
}

/// The port of the first URL of a comma-separated list (`http://127.0.0.1:2379,...`).
pub fn url_port(urls: &str) -> Option<u16> {
    let first = urls.split(',').next()?;
    let authority = first.split_once("://").map_or(first, |(_, rest)| rest);
    authority
        .trim_end_matches('/')
        .rsplit_once(':')?
        .1
        .parse()
        .ok()
}

/// A process's command line, `None` when it is gone.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// kube-scheduler's secure port, reached with the cluster's admin identity
/// (the scheduler authorizes `/metrics` and `/debug/pprof` with a
/// SubjectAccessReview; `system:masters` passes). Its serving certificate
/// is self-signed in its cert dir, so it is not verified: loopback only.
#[derive(Clone)]
pub struct SchedulerPort {
    client: kube::Client,
}

impl SchedulerPort {
    /// For the scheduler process `pid`, with the admin kubeconfig.
    pub async fn connect(pid: i32, admin_kubeconfig: &Path) -> Result<SchedulerPort> {
        let args = cmdline(pid)
            .ok_or_else(|| Error::Testbed(format!("kube-scheduler (pid {pid}) is gone")))?;
        let port = flag_value(&args, "--secure-port")
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| Error::Testbed("kube-scheduler has no --secure-port".into()))?;
        let err = |message: String| Error::Kubeconfig {
            path: admin_kubeconfig.to_path_buf(),
            message,
        };
        let kubeconfig = kube::config::Kubeconfig::read_from(admin_kubeconfig)
            .map_err(|e| err(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| err(e.to_string()))?;
        config.cluster_url = format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e| Error::Testbed(format!("scheduler URL: {e}")))?;
        config.accept_invalid_certs = true;
        config.root_cert = None;
        config.read_timeout = Some(Duration::from_secs(300));
        let client = kube::Client::try_from(config).map_err(|source| Error::Kube {
            action: "building a client for kube-scheduler's port".into(),
            source,
        })?;
        Ok(SchedulerPort { client })
    }

    async fn get(&self, path: &str) -> Result<Vec<u8>> {
        let mut req = http::Request::new(kube::client::Body::from(Vec::new()));
        *req.uri_mut() = http::Uri::try_from(path)
            .map_err(|e| Error::Testbed(format!("scheduler path {path}: {e}")))?;
        let kube_err = |source| Error::Kube {
            action: format!("GET {path} of kube-scheduler"),
            source,
        };
        let response = self.client.send(req).await.map_err(kube_err)?;
        let status = response.status();
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .map_err(kube_err)?;
        if !status.is_success() {
            return Err(Error::Testbed(format!(
                "GET {path} of kube-scheduler: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            )));
        }
        Ok(body.to_vec())
    }

    /// `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.get("/metrics").await?).into_owned())
    }

    /// A CPU profile over the next `seconds` (pprof protobuf, gzipped).
    pub async fn cpu_profile(&self, seconds: u64) -> Result<Vec<u8>> {
        self.get(&format!("/debug/pprof/profile?seconds={seconds}"))
            .await
    }
}

/// etcd's `/metrics` (plain HTTP on its client port), for process `pid`.
pub async fn etcd_metrics(pid: i32) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = cmdline(pid)
        .as_deref()
        .and_then(|a| flag_value(a, "--listen-client-urls"))
        .and_then(url_port)
        .ok_or_else(|| Error::Testbed("etcd has no --listen-client-urls".into()))?;
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| Error::Testbed("etcd /metrics: no answer in 10 s".into()))?
        .map_err(|e| Error::Testbed(format!("etcd /metrics: {e}")))?;
    let text = String::from_utf8_lossy(&response).into_owned();
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => Ok(body.to_string()),
        _ => Err(Error::Testbed(format!(
            "etcd /metrics: {}",
            text.lines().next().unwrap_or("empty answer")
        ))),
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
