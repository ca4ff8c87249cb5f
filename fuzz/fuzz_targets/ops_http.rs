//! The ops HTTP server (`/metrics`, `/healthz`, `/readyz`) on one
//! connection fed a mix of well-formed requests and raw bytes, as anything
//! on the pod network may send to the driver's metrics port. Never a panic,
//! and the connection ends once the peer stops writing (both checked by
//! `ops_exchange`). Whatever comes back is HTTP/1.x with a status the server
//! or hyper can give; when the input starts with a well-formed request, the
//! first answer is the one that request deserves for the drawn readiness
//! and health: 200, 503, 404 or 405.
//!
//! Input: the first byte draws readiness (bit 0) and health (bit 1); the
//! rest is a script (see [`Script`]).
#![no_main]

use dra_core::fuzzing::ops_exchange;
use libfuzzer_sys::fuzz_target;

#[path = "common/script.rs"]
mod script;
use script::Script;

const METHODS: [&str; 5] = ["GET", "HEAD", "POST", "DELETE", "OPTIONS"];
const PATHS: [&str; 6] = [
    "/metrics",
    "/healthz",
    "/readyz",
    "/",
    "/readyz?verbose=1",
    "/metrics/../healthz",
];
/// Every status the ops server answers, and those hyper answers a request
/// it cannot parse with (400 bad request, 408 head read timed out, 413/414/
/// 431 too large, 501 unknown transfer coding, 505 version).
const STATUSES: [u16; 12] = [200, 404, 405, 503, 400, 408, 413, 414, 431, 500, 501, 505];

/// A well-formed request: method, path, an optional header whose value
/// is drawn from the input (visible ASCII only), and for a POST a small
/// body with its length.
fn request(script: &mut Script<'_>, out: &mut Vec<u8>) -> (usize, usize) {
    let method = usize::from(script.byte()) % METHODS.len();
    let path = usize::from(script.byte()) % PATHS.len();
    out.extend_from_slice(
        format!(
            "{} {} HTTP/1.1\r\nHost: node\r\n",
            METHODS[method], PATHS[path]
        )
        .as_bytes(),
    );
    if script.byte() & 1 == 1 {
        let n = usize::from(script.byte() % 64);
        let value: Vec<u8> = script
            .bytes(n)
            .iter()
            .map(|b| if b.is_ascii_graphic() { *b } else { b'x' })
            .collect();
        out.extend_from_slice(b"X-Probe: ");
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    }
    if METHODS[method] == "POST" {
        out.extend_from_slice(b"Content-Length: 3\r\n\r\nabc");
    } else {
        out.extend_from_slice(b"\r\n");
    }
    (method, path)
}

/// The status the first request deserves.
fn deserved(method: usize, path: usize, ready: bool, healthy: bool) -> u16 {
    if !matches!(METHODS[method], "GET" | "HEAD") {
        return 405;
    }
    // The query string is not part of the path the server routes on.
    match PATHS[path].split('?').next().unwrap_or_default() {
        "/metrics" => 200,
        "/healthz" if healthy => 200,
        "/readyz" if ready && healthy => 200,
        "/healthz" | "/readyz" => 503,
        _ => 404,
    }
}

/// The status of a response; hyper answers an HTTP/1.0 request in 1.0.
fn status_at(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

fuzz_target!(|data: &[u8]| {
    let mut script = Script(data);
    let flags = script.byte();
    let (ready, healthy) = (flags & 1 == 1, flags & 2 == 2);
    let mut stream = Vec::new();
    let mut first = None;
    let mut turns = 0;
    while !script.done() && turns < 32 {
        turns += 1;
        if script.byte() % 4 == 0 {
            let n = usize::from(script.byte());
            stream.extend_from_slice(script.bytes(n));
        } else {
            let drawn = request(&mut script, &mut stream);
            if turns == 1 {
                first = Some(drawn);
            }
        }
    }
    let answer = ops_exchange(&stream, ready, healthy);
    if answer.is_empty() {
        // Only input the server never saw a whole request head in may go
        // unanswered.
        assert!(first.is_none(), "no answer to a well-formed first request");
        return;
    }
    let status = status_at(&answer).unwrap_or_else(|| {
        panic!(
            "not an HTTP/1.x status line: {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(64)])
        )
    });
    assert!(STATUSES.contains(&status), "unexpected status {status}");
    if let Some((method, path)) = first {
        assert_eq!(
            status,
            deserved(method, path, ready, healthy),
            "{} {} (ready {ready}, healthy {healthy})",
            METHODS[method],
            PATHS[path]
        );
    }
});
