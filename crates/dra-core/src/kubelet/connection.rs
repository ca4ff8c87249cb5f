//! Every connection accepted on the plugin's sockets, between the client and
//! the HTTP/2 server: the relay that closes it when the client goes away,
//! misbehaves or stalls, and when the plugin shuts down.
//!
//! Why a relay and not the server's own handling: hyper waits for the
//! connection preface and for the rest of a frame without any time limit,
//! and its graceful shutdown waits for every connection to finish; a client
//! that stalls (or, before this module, a registration connection whose
//! adapter had given up) held the socket open and kept SIGTERM from ever
//! completing. Here each connection is one task that owns both the client
//! socket and the server's end of an in-memory pipe, so ending the task
//! closes both at once, whatever either side is doing.
//!
//! Rules: the client's bytes go through [`InboundStream`] (preface check,
//! frame size bound, `:authority` rewriting on the registration socket).
//! The connection closes when the client sends something invalid, closes
//! mid-frame, takes longer than [`ConnectionLimits::preface`] to send the
//! preface or longer than [`ConnectionLimits::frame`] to finish a frame it
//! has started, when the server closes its end, or
//! [`ConnectionLimits::shutdown_grace`] after shutdown began. A client idle
//! between frames is left alone (kubelet keeps its connections open).
//!
//! Bounds of the servers behind the relays, all in [`ConnectionLimits`]: at
//! most `max_connections` open connections per socket (the next client
//! waits in the listen backlog until one closes), `max_concurrent_streams`
//! calls at once on one connection (announced in the server's SETTINGS),
//! requests of at most `max_request_bytes`, and every call answered or
//! cancelled within `call_deadline`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::kubelet::authority::{AdapterError, InboundStream, MAX_IN_FRAME, Rewrite};

/// Time and size limits of the connections and calls on one socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct ConnectionLimits {
    /// From accept to the last byte of the connection preface.
    pub preface: Duration,
    /// From the moment the relay waits on a partly received frame (or
    /// header block) to its last byte.
    pub frame: Duration,
    /// Once shutdown begins, how long open connections get to finish
    /// before they are cut. Keep it well under the 5 s that SIGTERM has.
    pub shutdown_grace: Duration,
    /// Open connections per socket; kubelet keeps one or two (calls and
    /// the health stream), the liveness self-check one for a moment.
    pub max_connections: usize,
    /// Concurrent calls (HTTP/2 streams) on one connection: a burst of
    /// pods on a node is one call per pod on kubelet's one connection.
    pub max_concurrent_streams: u32,
    /// Largest request message: a prepare of a thousand claims is about
    /// 150 KiB.
    pub max_request_bytes: usize,
    /// Longest a call may take before it is answered `DEADLINE_EXCEEDED`
    /// (kubelet gives up on its calls after 45 s). A prepare may wait for a
    /// device's release, so the DRA socket's calls get at least the
    /// plugin's `device_release_wait` plus `DEADLINE_MARGIN`.
    pub call_deadline: Duration,
}

/// What a prepare's deadline adds to the time it may wait for a device's
/// release: the resolve, the driver and the commit.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(10);

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            preface: Duration::from_secs(10),
            frame: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(2),
            max_connections: 64,
            max_concurrent_streams: 128,
            max_request_bytes: 1024 * 1024,
            call_deadline: Duration::from_secs(45),
        }
    }
}

/// Why a connection ended, for the log.
#[derive(Debug)]
enum Closed {
    /// The server closed its end (the normal end of an HTTP/2 connection).
    ByServer,
    /// Shutdown began and the grace period ran out.
    Shutdown,
    /// The client broke a rule; the error says which.
    Invalid(AdapterError),
}

/// A connection as the HTTP/2 server sees it: the far end of the relay.
pub(crate) struct RelayedConnection(DuplexStream);

/// Accepts connections on `listener` until `shutdown`, each through a relay.
pub(crate) fn relayed_connections(
    listener: UnixListener,
    socket: &'static str,
    rewrite: Rewrite,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<RelayedConnection, io::Error>> {
    let (tx, rx) = mpsc::channel(16);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            // A slot first: at the limit, new clients wait in the backlog.
            let permit = match open.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    tracing::warn!(
                        socket,
                        limit = limits.max_connections,
                        "connection limit reached; new connections wait until one closes"
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        permit = open.clone().acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => break,
                        },
                    }
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => {
                        let conn = relay(client, socket, rewrite, limits, shutdown.clone(), permit);
                        if tx.send(Ok(conn)).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(socket, error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Puts a relay between an accepted client socket and the server.
pub(crate) fn relay(
    client: UnixStream,
    socket: &'static str,
    rewrite: Rewrite,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
    slot: OwnedSemaphorePermit,
) -> RelayedConnection {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        // Held until the connection is closed at both ends.
        let _slot = slot;
        match run_relay(client, ours, rewrite, limits, shutdown).await {
            Closed::Invalid(error) => {
                tracing::warn!(socket, %error, "connection closed: client broke the protocol");
            }
            closed => tracing::debug!(socket, ?closed, "connection closed"),
        }
        // Returning drops the client socket and the server's pipe: both
        // ends see the connection close.
    });
    RelayedConnection(theirs)
}

async fn run_relay(
    client: UnixStream,
    server: DuplexStream,
    rewrite: Rewrite,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Closed {
    let (client_r, mut client_w) = client.into_split();
    let (mut server_r, server_w) = tokio::io::split(server);
    let inbound = client_to_server(client_r, server_w, rewrite, limits);
    let outbound = async {
        let _ = tokio::io::copy(&mut server_r, &mut client_w).await;
        let _ = client_w.shutdown().await;
    };
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(limits.shutdown_grace).await;
    };
    tokio::pin!(inbound, outbound, deadline);
    tokio::select! {
        result = &mut inbound => match result {
            // The client finished cleanly and the server saw its end of
            // stream: let the server answer what it has and close.
            Ok(()) => tokio::select! {
                () = &mut outbound => Closed::ByServer,
                () = &mut deadline => Closed::Shutdown,
            },
            Err(error) => Closed::Invalid(error),
        },
        () = &mut outbound => Closed::ByServer,
        () = &mut deadline => Closed::Shutdown,
    }
}

/// Reads the client, forwards what [`InboundStream`] lets through, and on
/// the client's clean end of stream half-closes the server's side.
async fn client_to_server<R, W>(
    mut r: R,
    mut w: W,
    rewrite: Rewrite,
    limits: ConnectionLimits,
) -> Result<(), AdapterError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let preface_deadline = Instant::now() + limits.preface;
    let mut frame_deadline: Option<Instant> = None;
    let mut stream = InboundStream::new(rewrite);
    let mut chunk = vec![0u8; MAX_IN_FRAME + 9];
    loop {
        let read = r.read(&mut chunk);
        let n = if !stream.preface_seen() {
            tokio::time::timeout_at(preface_deadline, read)
                .await
                .map_err(|_| AdapterError::Stalled("connection preface", limits.preface))??
        } else if stream.is_mid_frame() {
            let deadline = *frame_deadline.get_or_insert_with(|| Instant::now() + limits.frame);
            tokio::time::timeout_at(deadline, read)
                .await
                .map_err(|_| AdapterError::Stalled("frame", limits.frame))??
        } else {
            read.await?
        };
        if n == 0 {
            stream.finish()?;
            w.shutdown().await?;
            return Ok(());
        }
        let out = stream.push(&chunk[..n])?;
        if !stream.is_mid_frame() {
            frame_deadline = None;
        }
        if !out.is_empty() {
            w.write_all(&out).await?;
            w.flush().await?;
        }
    }
}

impl AsyncRead for RelayedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RelayedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for RelayedConnection {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}
