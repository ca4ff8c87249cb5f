//! One ops-server connection fed arbitrary bytes: the `ops_http` fuzz
//! target's way in. The connection is served exactly as [`OpsServer::serve`]
//! serves one ([`http1`], [`handle`]), over an in-memory pipe instead of TCP.
//!
//! [`OpsServer::serve`]: super::OpsServer::serve

use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus::{IntCounter, Registry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{HealthProbe, Readiness, State, handle, http1};

/// How long a connection may stay open after its peer stopped writing
/// before [`ops_exchange`] calls it a hang.
const AFTER_INPUT: Duration = Duration::from_secs(30);

/// What the ops server writes back on one connection that carries `input`
/// and is then closed for writing. `ready` is the readiness flag and
/// `healthy` the probe's result. Panics if the connection outlives its
/// input by [`AFTER_INPUT`]: the server must end a connection whose peer
/// has stopped writing.
#[cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]
pub fn ops_exchange(input: &[u8], ready: bool, healthy: bool) -> Vec<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(async {
        let registry = Registry::new();
        if let Ok(counter) = IntCounter::new("aws_dra_fuzz_total", "fuzz") {
            counter.inc();
            let _ = registry.register(Box::new(counter));
        }
        let readiness = Readiness::default();
        readiness.set(ready);
        let state = Arc::new(State::new(
            registry,
            HealthProbe::new(move || async move {
                if healthy {
                    Ok(())
                } else {
                    Err("the plugin socket does not answer".to_owned())
                }
            }),
            readiness,
        ));
        let (client, server) = tokio::io::duplex(1 << 16);
        let connection = http1().serve_connection(
            TokioIo::new(server),
            service_fn(move |req| handle(state.clone(), req)),
        );
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let write = async {
            let _ = to_server.write_all(input).await;
            let _ = to_server.shutdown().await;
        };
        let read = async {
            let mut out = Vec::new();
            let _ = from_server.read_to_end(&mut out).await;
            out
        };
        let everything = async {
            let (_, (), out) = tokio::join!(connection, write, read);
            out
        };
        tokio::time::timeout(AFTER_INPUT, everything)
            .await
            .expect("the ops server kept a connection open after its peer stopped writing")
    })
}
