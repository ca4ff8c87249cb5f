//! Rewrites the HTTP/2 `:authority` of client requests on the registration
//! socket, so that kubelet's plugin watcher can talk to a tonic server.
//!
//! kubelet's grpc-go dials the registration socket by its bare path and sends
//! the percent-encoded path as `:authority`; `h2` rejects that value and
//! resets the stream before any handler runs. This adapter sits between the
//! accepted Unix socket and the HTTP/2 server: it passes the connection
//! preface and every frame through unchanged, except client header blocks
//! (HEADERS plus any CONTINUATION frames), which it HPACK-decodes, gives
//! `:authority: localhost`, and re-encodes. It keeps two HPACK contexts, one
//! mirroring the client's encoder and one whose output only the server sees,
//! so both dynamic tables stay consistent. Padding is dropped, priority
//! fields and END_STREAM are kept. Server-to-client bytes are copied as is.
//! Limit: it assumes the server's default 4096-byte HPACK table (h2's
//! default; we never change it).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Every HTTP/2 peer must accept frames of this size (SETTINGS_MAX_FRAME_SIZE
/// initial value); we never emit larger ones.
const MAX_OUT_FRAME: usize = 16_384;
/// The authority the server is given instead of the socket path.
const AUTHORITY: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("client did not send the HTTP/2 connection preface")]
    BadPreface,
    #[error("malformed HEADERS frame on stream {stream}: {reason}")]
    MalformedHeaders { stream: u32, reason: &'static str },
    #[error("frame of type {frame_type:#x} on stream {stream} interrupts a header block")]
    InterruptedHeaderBlock { frame_type: u8, stream: u32 },
    #[error("HPACK decoding failed: {0:?}")]
    Hpack(loona_hpack::decoder::DecoderError),
}

/// One HTTP/2 frame as read off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub frame_type: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let len = self.payload.len();
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
        out.push(self.frame_type);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7fff_ffff).to_be_bytes());
        out.extend_from_slice(&self.payload);
    }
}

/// A header block being collected across HEADERS + CONTINUATION frames.
struct PendingBlock {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The frame-level rewriting state of one connection (client to server).
pub struct HeaderRewriter {
    from_client: Decoder<'static>,
    to_server: Encoder<'static>,
    pending: Option<PendingBlock>,
}

impl Default for HeaderRewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderRewriter {
    pub fn new() -> Self {
        Self {
            from_client: Decoder::new(),
            to_server: Encoder::new(),
            pending: None,
        }
    }

    /// Takes one client frame, returns the bytes to forward to the server
    /// (empty while a header block is still incomplete).
    pub fn feed(&mut self, frame: Frame) -> Result<Vec<u8>, AdapterError> {
        let mut out = Vec::new();
        match (frame.frame_type, self.pending.take()) {
            (TYPE_CONTINUATION, Some(mut block)) if frame.stream == block.stream => {
                block.fragment.extend_from_slice(&frame.payload);
                if frame.flags & FLAG_END_HEADERS != 0 {
                    self.emit(block, &mut out)?;
                } else {
                    self.pending = Some(block);
                }
            }
            (frame_type, Some(block)) => {
                return Err(AdapterError::InterruptedHeaderBlock {
                    frame_type,
                    stream: block.stream,
                });
            }
            (TYPE_HEADERS, None) => {
                let block = parse_headers(&frame)?;
                if frame.flags & FLAG_END_HEADERS != 0 {
                    self.emit(block, &mut out)?;
                } else {
                    self.pending = Some(block);
                }
            }
            // Everything else, including a stray CONTINUATION (the server
            // will call that a protocol error, as it should), passes through.
            (_, None) => frame.encode(&mut out),
        }
        Ok(out)
    }

    fn emit(&mut self, block: PendingBlock, out: &mut Vec<u8>) -> Result<(), AdapterError> {
        let mut headers = self
            .from_client
            .decode(&block.fragment)
            .map_err(AdapterError::Hpack)?;
        for (name, value) in headers.iter_mut() {
            if name.as_slice() == b":authority" {
                *value = AUTHORITY.to_vec();
            }
        }
        let encoded = self
            .to_server
            .encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));

        let mut first = Vec::new();
        if let Some(p) = block.priority {
            first.extend_from_slice(&p);
        }
        let room = MAX_OUT_FRAME - first.len();
        let split = encoded.len().min(room);
        first.extend_from_slice(&encoded[..split]);
        let mut rest = encoded[split..].chunks(MAX_OUT_FRAME).peekable();
        let keep = block.flags & (FLAG_END_STREAM | FLAG_PRIORITY);
        let end = if rest.peek().is_none() {
            FLAG_END_HEADERS
        } else {
            0
        };
        Frame {
            frame_type: TYPE_HEADERS,
            flags: keep | end,
            stream: block.stream,
            payload: first,
        }
        .encode(out);
        while let Some(chunk) = rest.next() {
            let end = if rest.peek().is_none() {
                FLAG_END_HEADERS
            } else {
                0
            };
            Frame {
                frame_type: TYPE_CONTINUATION,
                flags: end,
                stream: block.stream,
                payload: chunk.to_vec(),
            }
            .encode(out);
        }
        Ok(())
    }
}

fn parse_headers(frame: &Frame) -> Result<PendingBlock, AdapterError> {
    let malformed = |reason| AdapterError::MalformedHeaders {
        stream: frame.stream,
        reason,
    };
    let p = &frame.payload;
    let mut start = 0;
    let mut pad = 0;
    if frame.flags & FLAG_PADDED != 0 {
        pad = usize::from(*p.first().ok_or_else(|| malformed("missing pad length"))?);
        start = 1;
    }
    let mut priority = None;
    if frame.flags & FLAG_PRIORITY != 0 {
        let bytes: [u8; 5] = p
            .get(start..start + 5)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| malformed("truncated priority fields"))?;
        priority = Some(bytes);
        start += 5;
    }
    let end = p
        .len()
        .checked_sub(pad)
        .filter(|end| *end >= start)
        .ok_or_else(|| malformed("padding longer than payload"))?;
    Ok(PendingBlock {
        stream: frame.stream,
        flags: frame.flags,
        priority,
        fragment: p[start..end].to_vec(),
    })
}

/// Reads one frame; `None` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 9];
    let mut got = 0;
    while got < head.len() {
        let n = r.read(&mut head[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += n;
    }
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Frame {
        frame_type: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    }))
}

async fn rewrite_client_to_server<R, W>(mut r: R, mut w: W) -> Result<(), AdapterError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    r.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(AdapterError::BadPreface);
    }
    w.write_all(&preface).await?;
    let mut rewriter = HeaderRewriter::new();
    while let Some(frame) = read_frame(&mut r).await? {
        let bytes = rewriter.feed(frame)?;
        if !bytes.is_empty() {
            w.write_all(&bytes).await?;
            w.flush().await?;
        }
    }
    w.shutdown().await?;
    Ok(())
}

/// A registration connection as the HTTP/2 server sees it: the far end of
/// the adapter.
pub struct RewrittenConnection(DuplexStream);

/// Puts the adapter between an accepted socket and the server.
pub fn adapt(socket: UnixStream) -> RewrittenConnection {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (socket_r, mut socket_w) = socket.into_split();
    let (mut server_r, server_w) = tokio::io::split(ours);
    tokio::spawn(async move {
        if let Err(e) = rewrite_client_to_server(socket_r, server_w).await {
            tracing::warn!(error = %e, "registration connection closed by the :authority adapter");
        }
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_r, &mut socket_w).await;
        let _ = socket_w.shutdown().await;
    });
    RewrittenConnection(theirs)
}

impl AsyncRead for RewrittenConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RewrittenConnection {
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

impl tonic::transport::server::Connected for RewrittenConnection {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

    const PATH_AUTHORITY: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fx-reg.sock";

    fn request(authority: &[u8], path: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), path.to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    fn split_frames(mut bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let len = (usize::from(bytes[0]) << 16)
                | (usize::from(bytes[1]) << 8)
                | usize::from(bytes[2]);
            frames.push(Frame {
                frame_type: bytes[3],
                flags: bytes[4],
                stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]),
                payload: bytes[9..9 + len].to_vec(),
            });
            bytes = &bytes[9 + len..];
        }
        frames
    }

    /// Reassembles the header blocks the server would see and decodes them
    /// with one decoder, as the server does.
    fn server_view(frames: &[Frame], decoder: &mut Decoder<'_>) -> Vec<(u8, HeaderList)> {
        let mut blocks = Vec::new();
        let mut current: Option<(u8, Vec<u8>)> = None;
        for f in frames {
            match f.frame_type {
                TYPE_HEADERS => {
                    assert!(f.flags & FLAG_PADDED == 0);
                    let start = if f.flags & FLAG_PRIORITY != 0 { 5 } else { 0 };
                    current = Some((f.flags, f.payload[start..].to_vec()));
                }
                TYPE_CONTINUATION => current.as_mut().unwrap().1.extend_from_slice(&f.payload),
                _ => continue,
            }
            if f.flags & FLAG_END_HEADERS != 0 {
                let (flags, block) = current.take().unwrap();
                blocks.push((flags, decoder.decode(&block).unwrap()));
            }
        }
        blocks
    }

    #[test]
    fn rewrites_authority_across_padding_priority_continuation_and_dynamic_table() {
        let mut client = Encoder::new();
        let mut rewriter = HeaderRewriter::new();
        let mut out = Vec::new();

        // Request 1: padded + priority HEADERS, block split into a CONTINUATION.
        let block = client.encode(
            request(PATH_AUTHORITY, b"/a")
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        let (head, tail) = block.split_at(block.len() / 2);
        let mut payload = vec![3u8];
        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        payload.extend_from_slice(head);
        payload.extend_from_slice(&[0, 0, 0]);
        out.extend(
            rewriter
                .feed(Frame {
                    frame_type: TYPE_HEADERS,
                    flags: FLAG_PADDED | FLAG_PRIORITY,
                    stream: 1,
                    payload,
                })
                .unwrap(),
        );
        assert!(out.is_empty(), "nothing is forwarded before END_HEADERS");
        out.extend(
            rewriter
                .feed(Frame {
                    frame_type: TYPE_CONTINUATION,
                    flags: FLAG_END_HEADERS,
                    stream: 1,
                    payload: tail.to_vec(),
                })
                .unwrap(),
        );
        // A DATA frame passes through byte for byte.
        let data = Frame {
            frame_type: 0x0,
            flags: FLAG_END_STREAM,
            stream: 1,
            payload: vec![0, 0, 0, 0, 0],
        };
        let mut data_bytes = Vec::new();
        data.encode(&mut data_bytes);
        let forwarded = rewriter.feed(data.clone()).unwrap();
        assert_eq!(forwarded, data_bytes);
        out.extend(forwarded);

        // Request 2 reuses the client's dynamic table entries.
        let block2 = client.encode(
            request(PATH_AUTHORITY, b"/b")
                .iter()
                .map(|(n, v)| (&n[..], &v[..])),
        );
        out.extend(
            rewriter
                .feed(Frame {
                    frame_type: TYPE_HEADERS,
                    flags: FLAG_END_HEADERS | FLAG_END_STREAM,
                    stream: 3,
                    payload: block2,
                })
                .unwrap(),
        );

        let frames = split_frames(&out);
        let mut server = Decoder::new();
        let blocks = server_view(&frames, &mut server);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].1, request(AUTHORITY, b"/a"));
        assert_eq!(blocks[0].0 & FLAG_PRIORITY, FLAG_PRIORITY);
        assert_eq!(blocks[1].1, request(AUTHORITY, b"/b"));
        assert_eq!(blocks[1].0 & FLAG_END_STREAM, FLAG_END_STREAM);
        assert_eq!(
            frames[0].payload[..5],
            [0, 0, 0, 0, 16],
            "priority fields kept"
        );
    }

    #[test]
    fn large_blocks_are_split_into_continuations() {
        let mut client = Encoder::new();
        let mut rewriter = HeaderRewriter::new();
        let mut headers = request(PATH_AUTHORITY, b"/a");
        headers.push((b"x-big".to_vec(), vec![b'v'; 40_000]));
        let block = client.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
        let out = rewriter
            .feed(Frame {
                frame_type: TYPE_HEADERS,
                flags: FLAG_END_HEADERS,
                stream: 1,
                payload: block,
            })
            .unwrap();
        let frames = split_frames(&out);
        assert!(frames.len() >= 3);
        assert!(frames.iter().all(|f| f.payload.len() <= MAX_OUT_FRAME));
        let blocks = server_view(&frames, &mut Decoder::new());
        assert_eq!(blocks[0].1[3], (b":authority".to_vec(), AUTHORITY.to_vec()));
        assert_eq!(blocks[0].1[6].1.len(), 40_000);
    }

    #[test]
    fn interrupted_header_block_and_bad_padding_are_errors() {
        let mut rewriter = HeaderRewriter::new();
        rewriter
            .feed(Frame {
                frame_type: TYPE_HEADERS,
                flags: 0,
                stream: 1,
                payload: vec![0x82],
            })
            .unwrap();
        let err = rewriter
            .feed(Frame {
                frame_type: 0x0,
                flags: 0,
                stream: 1,
                payload: vec![],
            })
            .unwrap_err();
        assert!(
            matches!(err, AdapterError::InterruptedHeaderBlock { .. }),
            "{err}"
        );
        let err = HeaderRewriter::new()
            .feed(Frame {
                frame_type: TYPE_HEADERS,
                flags: FLAG_PADDED | FLAG_END_HEADERS,
                stream: 1,
                payload: vec![9, 0x82],
            })
            .unwrap_err();
        assert!(
            matches!(err, AdapterError::MalformedHeaders { .. }),
            "{err}"
        );
    }
}
