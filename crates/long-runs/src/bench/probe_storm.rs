//! A storm of HTTP GETs at a fixed rate against a driver's ops server, for
//! `cargo xtask bench probes` ([`super::probes`]).
//!
//! Each request opens its own TCP connection and closes it after the
//! answer (`Connection: close`), as kubelet's HTTP prober does, so the
//! storm pays the server's accept and connection set-up per request. The
//! paths are taken in turn. Pacing is by deadline, not by interval: every
//! `TICK` the pacer sends as many requests as the rate owes since the
//! start, so the mean rate holds even when a tick is late on a busy
//! machine. At most `MAX_IN_FLIGHT` requests are open at once; a
//! request the cap refuses is counted as skipped rather than queued, so
//! a slow server sees the storm it can take and the figures say so.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;

/// How often the pacer wakes up.
const TICK: Duration = Duration::from_millis(10);
/// The most requests open at once.
const MAX_IN_FLIGHT: usize = 256;
/// A request that takes longer counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of an answer read (the status line is all the storm needs).
const MAX_ANSWER: u64 = 64 * 1024;

/// What a storm did, over its whole life.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct StormFigures {
    pub paths: Vec<String>,
    /// The rate asked for, requests per second.
    pub target_per_s: f64,
    /// Requests answered (any status) per second of the storm.
    pub answered_per_s: f64,
    pub window_s: f64,
    /// Answers by HTTP status code.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests that failed: no connection, no answer within the timeout,
    /// or no status line.
    pub failed: u64,
    /// Requests never sent because `MAX_IN_FLIGHT` were open.
    pub skipped: u64,
}

#[derive(Default)]
struct Counters {
    failed: AtomicU64,
    skipped: AtomicU64,
    by_status: std::sync::Mutex<BTreeMap<u16, u64>>,
}

/// A storm in progress; [`Storm::stop`] ends it and gives its figures.
pub struct Storm {
    stop: oneshot::Sender<()>,
    pacer: JoinHandle<f64>,
    counters: Arc<Counters>,
    in_flight: Arc<Semaphore>,
    paths: Vec<String>,
    rate: f64,
}

impl Storm {
    /// Starts `rate` requests per second to `address`, over `paths` in
    /// turn, on `runtime`.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        address: SocketAddr,
        paths: &[&str],
        rate: f64,
    ) -> Storm {
        let (stop, mut stopped) = oneshot::channel();
        let counters = Arc::new(Counters::default());
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let requests: Arc<[Arc<[u8]>]> = paths
            .iter()
            .map(|p| {
                format!("GET {p} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                    .into_bytes()
                    .into()
            })
            .collect();
        let pacer = {
            let counters = counters.clone();
            let in_flight = in_flight.clone();
            runtime.spawn(async move {
                let start = Instant::now();
                let mut sent: u64 = 0;
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = ticks.tick() => {}
                        _ = &mut stopped => break,
                    }
                    let owed = (start.elapsed().as_secs_f64() * rate) as u64;
                    while sent < owed {
                        let request = requests[(sent % requests.len() as u64) as usize].clone();
                        sent += 1;
                        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                            counters.skipped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        let counters = counters.clone();
                        tokio::spawn(async move {
                            let status = tokio::time::timeout(
                                REQUEST_TIMEOUT,
                                get_status(address, &request),
                            )
                            .await
                            .ok()
                            .flatten();
                            match status {
                                Some(code) => {
                                    *counters
                                        .by_status
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .entry(code)
                                        .or_default() += 1;
                                }
                                None => {
                                    counters.failed.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            drop(permit);
                        });
                    }
                }
                start.elapsed().as_secs_f64()
            })
        };
        Storm {
            stop,
            pacer,
            counters,
            in_flight,
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            rate,
        }
    }

    /// Stops sending, waits for the open requests (each bounded by its
    /// timeout), and gives the figures.
    pub async fn stop(self) -> StormFigures {
        // The pacer may have ended already only if it panicked; then the
        // window is unknown and reads as zero.
        let _ = self.stop.send(());
        let window_s = self.pacer.await.unwrap_or_default();
        // Every permit back: every request answered or timed out.
        let _all = self.in_flight.acquire_many(MAX_IN_FLIGHT as u32).await;
        let by_status = self
            .counters
            .by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let answered: u64 = by_status.values().sum();
        StormFigures {
            paths: self.paths,
            target_per_s: self.rate,
            answered_per_s: if window_s > 0.0 {
                answered as f64 / window_s
            } else {
                0.0
            },
            window_s,
            by_status,
            failed: self.counters.failed.load(Ordering::Relaxed),
            skipped: self.counters.skipped.load(Ordering::Relaxed),
        }
    }
}

/// One request on a new connection: the answer's status code, `None` when
/// the connection or the answer failed.
pub(super) async fn get_status(address: SocketAddr, request: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(address).await.ok()?;
    stream.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .await
        .ok()?;
    status_code(&answer)
}

/// The status code of an HTTP/1.x answer (`HTTP/1.1 200 OK`).
fn status_code(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_ascii_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/1."))?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn status_codes_from_status_lines() {
        let table: &[(&[u8], Option<u16>)] = &[
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n",
                Some(200),
            ),
            (b"HTTP/1.1 404 Not Found\r\n\r\n", Some(404)),
            (b"HTTP/1.0 503 Service Unavailable\r\n", Some(503)),
            (b"", None),
            (b"SSH-2.0-OpenSSH\r\n", None),
            (b"HTTP/1.1 abc\r\n", None),
        ];
        for (answer, want) in table {
            assert_eq!(
                status_code(answer),
                *want,
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
    }

    /// A storm against a local listener that answers every connection:
    /// each path taken in turn, every answer counted by its status.
    #[tokio::test]
    async fn storm_counts_every_answer_by_status() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let server = {
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        return;
                    };
                    let seen = seen.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1024];
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        let head = String::from_utf8_lossy(&buf[..n]).to_string();
                        let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                        let answer: &[u8] = if path == "/healthz" {
                            b"HTTP/1.1 200 OK\r\n\r\nok\n"
                        } else {
                            b"HTTP/1.1 404 Not Found\r\n\r\n"
                        };
                        seen.lock().unwrap().push(path);
                        let _ = stream.write_all(answer).await;
                    });
                }
            })
        };
        let storm = Storm::start(
            &tokio::runtime::Handle::current(),
            address,
            &["/healthz", "/nothing"],
            400.0,
        );
        // Wait for a count of answers, not for a time.
        while seen.lock().unwrap().len() < 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let figures = storm.stop().await;
        server.abort();
        assert_eq!(figures.failed, 0, "{figures:?}");
        let ok = figures.by_status.get(&200).copied().unwrap_or(0);
        let missing = figures.by_status.get(&404).copied().unwrap_or(0);
        assert!(ok >= 10 && missing >= 10, "{figures:?}");
        assert!(ok.abs_diff(missing) <= 1, "paths in turn: {figures:?}");
        assert_eq!(figures.paths, ["/healthz", "/nothing"]);
    }
}
