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
//! The client's encoder may use at most the dynamic table size the server
//! advertises (SETTINGS_HEADER_TABLE_SIZE, never changed from the default
//! 4096 bytes by h2 or tonic), so the mirror decoder allows no more
//! ([`MAX_HEADER_TABLE`]): a size update above it is a decoding error that
//! closes the connection (RFC 7541 §4.2, §6.3), and eviction keeps the table
//! within the size (entries count name + value + 32 bytes). Without this
//! bound one connection could raise the table to 4 GiB and fill it. [`InboundStream`] is the whole client
//! side as a push parser with no I/O, so that `connection` can put time
//! limits around it and the fuzz targets can drive it; frames over
//! [`MAX_IN_FRAME`] and header lists over [`MAX_HEADER_LIST`] are refused.

use std::io;

use loona_hpack::{Decoder, Encoder};
#[cfg(any(test, feature = "testing"))]
use tokio::io::{AsyncRead, AsyncReadExt};

/// The client connection preface (RFC 9113 §3.4).
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
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
/// The largest frame a client may send: the server never raises
/// SETTINGS_MAX_FRAME_SIZE above its initial value (neither h2 nor tonic do
/// by default, and we do not configure it), so anything larger is a
/// FRAME_SIZE_ERROR the server would refuse anyway; refusing it here keeps
/// one connection from making us allocate 16 MiB.
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub const MAX_IN_FRAME: usize = 16_384;
/// The largest header block (compressed, across CONTINUATION frames) and
/// decoded header list (RFC 9113 §6.5.2 sizes: name + value + 32 each) we
/// accept. kubelet's registration calls send a few hundred bytes; without a
/// bound, endless CONTINUATION frames or one small block that references a
/// large dynamic-table entry thousands of times would exhaust memory.
pub(crate) const MAX_HEADER_LIST: usize = 64 * 1024;
/// The dynamic table size the server allows the client's encoder: HTTP/2's
/// initial SETTINGS_HEADER_TABLE_SIZE, which the server never changes.
pub(crate) const MAX_HEADER_TABLE: usize = 4096;
/// The authority the server is given instead of the socket path.
const AUTHORITY: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
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
    #[error("frame of {len} bytes is larger than the {MAX_IN_FRAME} the server accepts")]
    FrameTooLarge { len: usize },
    #[error("header block on stream {stream} is larger than {MAX_HEADER_LIST} bytes")]
    HeaderListTooLarge { stream: u32 },
    #[error("client closed the connection in the middle of a {0}")]
    Truncated(&'static str),
    #[error("client stalled in the middle of a {0} for longer than {1:?}")]
    Stalled(&'static str, std::time::Duration),
}

/// One HTTP/2 frame as read off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct Frame {
    pub frame_type: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
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
pub(crate) struct HeaderRewriter {
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
    pub(crate) fn new() -> Self {
        let mut from_client = Decoder::new();
        from_client.set_max_allowed_table_size(MAX_HEADER_TABLE);
        Self {
            from_client,
            to_server: Encoder::new(),
            pending: None,
        }
    }

    /// Takes one client frame, returns the bytes to forward to the server
    /// (empty while a header block is still incomplete).
    pub(crate) fn feed(&mut self, frame: Frame) -> Result<Vec<u8>, AdapterError> {
        let mut out = Vec::new();
        match (frame.frame_type, self.pending.take()) {
            (TYPE_CONTINUATION, Some(mut block)) if frame.stream == block.stream => {
                if block.fragment.len() + frame.payload.len() > MAX_HEADER_LIST {
                    return Err(AdapterError::HeaderListTooLarge {
                        stream: block.stream,
                    });
                }
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
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut size = 0usize;
        let mut too_large = false;
        self.from_client
            .decode_with_cb(&block.fragment, |name, value| {
                // The decoder has to go on to the end to keep its dynamic
                // table in step, but nothing more is kept once over the limit.
                size = size.saturating_add(name.len() + value.len() + 32);
                if size > MAX_HEADER_LIST {
                    too_large = true;
                    headers.clear();
                } else if !too_large {
                    let value = if name.as_ref() == b":authority" {
                        AUTHORITY.to_vec()
                    } else {
                        value.into_owned()
                    };
                    headers.push((name.into_owned(), value));
                }
            })
            .map_err(AdapterError::Hpack)?;
        if too_large {
            return Err(AdapterError::HeaderListTooLarge {
                stream: block.stream,
            });
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

/// Reads one frame; `None` on a clean end of stream between frames. For
/// reading a peer that is trusted to be well-behaved (tests, the self
/// check); connections from outside go through [`InboundStream`].
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
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

/// What the relay does to the frames a client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub enum Rewrite {
    /// Registration socket: header blocks get `:authority: localhost`.
    Authority,
    /// DRA socket: frames are checked for size and completeness only.
    PassThrough,
}

/// The client-to-server half of a connection as a push parser: bytes in as
/// they arrive, bytes for the server out. It never blocks and never
/// buffers more than one frame, so the caller decides about time (see
/// `connection`) and the fuzz targets can drive it directly.
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub struct InboundStream {
    rewriter: Option<HeaderRewriter>,
    preface_seen: bool,
    buf: Vec<u8>,
}

impl InboundStream {
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn new(rewrite: Rewrite) -> Self {
        Self {
            rewriter: match rewrite {
                Rewrite::Authority => Some(HeaderRewriter::new()),
                Rewrite::PassThrough => None,
            },
            preface_seen: false,
            buf: Vec::new(),
        }
    }

    /// Takes the next bytes from the client; returns what to forward. An
    /// error means the connection must be closed.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>, AdapterError> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        if !self.preface_seen {
            let n = self.buf.len().min(PREFACE.len());
            if self.buf[..n] != PREFACE[..n] {
                return Err(AdapterError::BadPreface);
            }
            if n < PREFACE.len() {
                return Ok(out);
            }
            self.preface_seen = true;
            out.extend_from_slice(PREFACE);
            self.buf.drain(..PREFACE.len());
        }
        let mut used = 0;
        while let Some((frame, len)) = parse_frame(&self.buf[used..])? {
            used += len;
            match &mut self.rewriter {
                Some(rewriter) => out.extend(rewriter.feed(frame)?),
                None => frame.encode(&mut out),
            }
        }
        self.buf.drain(..used);
        Ok(out)
    }

    /// Whether the client is in the middle of something (preface, frame or
    /// header block) that the server cannot act on until it is complete.
    pub(crate) fn is_mid_frame(&self) -> bool {
        !self.buf.is_empty() || self.rewriter.as_ref().is_some_and(|r| r.pending.is_some())
    }

    /// The client closed its side: fine between frames, an error otherwise.
    #[cfg_attr(
        not(any(feature = "testing", feature = "fuzzing")),
        allow(unreachable_pub)
    )]
    pub fn finish(&self) -> Result<(), AdapterError> {
        if !self.preface_seen {
            Err(AdapterError::Truncated("connection preface"))
        } else if !self.buf.is_empty() {
            Err(AdapterError::Truncated("frame"))
        } else if self.is_mid_frame() {
            Err(AdapterError::Truncated("header block"))
        } else {
            Ok(())
        }
    }

    /// Whether the connection preface has been seen whole.
    pub(crate) fn preface_seen(&self) -> bool {
        self.preface_seen
    }
}

/// One complete frame from the front of `buf` and its encoded length;
/// `None` if `buf` holds only part of one.
#[cfg_attr(
    not(any(feature = "testing", feature = "fuzzing")),
    allow(unreachable_pub)
)]
pub fn parse_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, AdapterError> {
    let Some(head) = buf.get(..9) else {
        return Ok(None);
    };
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    if len > MAX_IN_FRAME {
        return Err(AdapterError::FrameTooLarge { len });
    }
    let Some(payload) = buf.get(9..9 + len) else {
        return Ok(None);
    };
    Ok(Some((
        Frame {
            frame_type: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload: payload.to_vec(),
        },
        9 + len,
    )))
}

#[cfg(test)]
mod tests;
