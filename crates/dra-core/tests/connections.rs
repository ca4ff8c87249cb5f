//! Connections that misbehave, on the real plugin sockets: the server must
//! close each of them, and shutdown must finish within 5 s whatever they
//! are doing. The inputs are those that once left registration connections
//! open for ever, plus stalls.
//!
//! Every test runs on tokio's paused clock: time moves only when every task
//! waits on a timer, so each bound below is measured in the server's own
//! timeouts, never in how busy the machine running the tests is. Socket I/O
//! is real (the kernel delivers it before the clock may move on).

use std::time::Duration;

use tokio::time::Instant;

use dra_core::testing::ConnectionLimits;
use dra_core::testing::{Frame, PREFACE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

mod support;
use support::Plugin;

const DRIVER: &str = "conn.example.com";
/// How long the server may take to close a connection it should close.
const CLOSE_BOUND: Duration = Duration::from_secs(3);
/// What SIGTERM has (the requirement).
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

async fn start(limits: ConnectionLimits) -> Plugin {
    support::start_empty(DRIVER, "conn", |o| o.connections = limits).await
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Frame {
        frame_type,
        flags,
        stream,
        payload: payload.to_vec(),
    }
    .encode(&mut out);
    out
}

fn preface_and_settings() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out
}

/// The four inputs that once leaked registration connections.
fn leaking_inputs() -> Vec<(&'static str, Vec<u8>)> {
    // Indexed field 70: past the 61 static entries, and the dynamic table
    // is empty, so no HPACK decoder can make sense of it.
    let undecodable_hpack = {
        let mut b = preface_and_settings();
        b.extend(frame(0x1, 0x4 | 0x1, 1, &[0x80 | 70]));
        b
    };
    // A frame header announcing 100 bytes followed by only 10.
    let short_frame = {
        let mut b = preface_and_settings();
        let mut f = frame(0x0, 0, 1, &[0; 100]);
        f.truncate(9 + 10);
        b.extend(f);
        b
    };
    vec![
        (
            "bytes without the preface",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("a partial preface", PREFACE[..10].to_vec()),
        ("HEADERS with undecodable HPACK", undecodable_hpack),
        ("a frame longer than what is sent", short_frame),
    ]
}

/// Reads until the server closes; panics if it does not within `bound`.
async fn assert_closed_by_server(s: &mut UnixStream, bound: Duration, what: &str) {
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    loop {
        match tokio::time::timeout_at(started + bound, s.read(&mut buf)).await {
            Err(_) => panic!("{what}: server kept the connection open for {bound:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Nothing from the server but its own frames for `wait`: the connection is
/// still open.
async fn assert_still_open(s: &mut UnixStream, wait: Duration, what: &str) {
    let mut buf = [0u8; 4096];
    let until = Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return,
            Ok(Ok(0)) | Ok(Err(_)) => panic!("{what}: server closed the connection too early"),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(start_paused = true)]
async fn connections_are_closed_after_bad_input_and_hang_up() {
    let p = start(ConnectionLimits::default()).await;
    for socket in [p.registration(), p.dra()] {
        for (what, bytes) in leaking_inputs() {
            // Ten times each, as in the report.
            for _ in 0..10 {
                let mut s = UnixStream::connect(socket).await.unwrap();
                s.write_all(&bytes).await.unwrap();
                // The client hangs up its side.
                s.shutdown().await.unwrap();
                let what = format!("{what} on {}", socket.display());
                assert_closed_by_server(&mut s, CLOSE_BOUND, &what).await;
            }
        }
    }
    let started = Instant::now();
    p.token.cancel();
    p.running.wait().await.unwrap();
    assert!(started.elapsed() < SHUTDOWN_BOUND);
}

#[tokio::test(start_paused = true)]
async fn invalid_bytes_close_the_connection_without_a_hang_up() {
    let p = start(ConnectionLimits::default()).await;
    let too_large = {
        let mut b = preface_and_settings();
        b.extend(frame(0x0, 0, 1, &vec![0; 20_000]));
        b
    };
    let cases = [
        (
            "bytes without the preface",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("a frame over the maximum frame size", too_large),
    ];
    for socket in [p.registration(), p.dra()] {
        for (what, bytes) in &cases {
            let mut s = UnixStream::connect(socket).await.unwrap();
            s.write_all(bytes).await.unwrap();
            let what = format!("{what} on {}", socket.display());
            assert_closed_by_server(&mut s, CLOSE_BOUND, &what).await;
        }
    }
    p.token.cancel();
    p.running.wait().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn clients_that_stall_mid_frame_are_closed_after_the_frame_timeout() {
    let limits = ConnectionLimits {
        preface: Duration::from_millis(600),
        frame: Duration::from_millis(600),
        ..ConnectionLimits::default()
    };
    let p = start(limits).await;
    let partial_frame = {
        let mut b = preface_and_settings();
        let mut f = frame(0x0, 0, 1, &[0; 100]);
        f.truncate(9 + 10);
        b.extend(f);
        b
    };
    let partial_header = {
        let mut b = preface_and_settings();
        b.extend(&frame(0x4, 0, 0, &[])[..5]);
        b
    };
    let cases = [
        ("a stalled partial frame", partial_frame),
        ("a stalled frame header", partial_header),
        ("a stalled partial preface", PREFACE[..10].to_vec()),
        ("nothing at all", Vec::new()),
    ];
    for socket in [p.registration(), p.dra()] {
        for (what, bytes) in &cases {
            let mut s = UnixStream::connect(socket).await.unwrap();
            s.write_all(bytes).await.unwrap();
            let what = format!("{what} on {}", socket.display());
            // Not before the limit: a slow client is not a dead one...
            assert_still_open(&mut s, Duration::from_millis(300), &what).await;
            // ...but soon after it.
            assert_closed_by_server(&mut s, Duration::from_secs(2), &what).await;
        }
        // A client idle between frames is left alone.
        let mut idle = UnixStream::connect(socket).await.unwrap();
        idle.write_all(&preface_and_settings()).await.unwrap();
        assert_still_open(&mut idle, Duration::from_millis(1500), "an idle client").await;
    }
    p.token.cancel();
    p.running.wait().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_completes_within_5s_with_connections_open() {
    // Default limits: nothing times out on its own during the test.
    let p = start(ConnectionLimits::default()).await;
    let mut open = Vec::new();
    let mut channels = Vec::new();
    for socket in [p.registration().to_path_buf(), p.dra().to_path_buf()] {
        let mut inputs = leaking_inputs();
        inputs.push(("an idle client after the preface", preface_and_settings()));
        inputs.push(("nothing sent", Vec::new()));
        for (what, bytes) in inputs {
            // Some still connected, some hung up: neither may hold shutdown.
            for hang_up in [false, true] {
                let mut s = UnixStream::connect(&socket).await.unwrap();
                s.write_all(&bytes).await.unwrap();
                if hang_up {
                    s.shutdown().await.unwrap();
                }
                open.push((format!("{what} on {}", socket.display()), s));
            }
        }
        // A real gRPC client, connected and idle.
        channels.push(dra_core::testing::unix_channel(&socket).await.unwrap());
    }

    let started = Instant::now();
    p.token.cancel();
    tokio::time::timeout(SHUTDOWN_BOUND, p.running.wait())
        .await
        .expect("shutdown finished within 5 s")
        .unwrap();
    let took = started.elapsed();
    eprintln!(
        "shutdown with {} open connections took {took:?}",
        open.len() + channels.len()
    );
    for (what, s) in &mut open {
        assert_closed_by_server(s, Duration::from_secs(1), what).await;
    }
}
