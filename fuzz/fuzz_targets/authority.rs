//! The registration socket's client side: arbitrary bytes, delivered in
//! arbitrary pieces, through the `:authority` rewriter and the DRA socket's
//! pass-through. Never a panic; either a clean connection error, or output
//! that is well-formed HTTP/2 for the server: the preface, then frames no
//! larger than the server accepts, whose header blocks decode (with one
//! decoder, as the server's) to lists whose `:authority` is `localhost`.
#![no_main]

use dra_core::fuzzing::{InboundStream, PREFACE, Rewrite};
use libfuzzer_sys::fuzz_target;

#[path = "common/relay_output.rs"]
mod relay_output;
use relay_output::frames_after_preface;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Feeds `data` in pieces of `piece` bytes; the output, or `None` on a
/// connection error.
fn run(rewrite: Rewrite, data: &[u8], piece: usize) -> Option<Vec<u8>> {
    let mut stream = InboundStream::new(rewrite);
    let mut out = Vec::new();
    for chunk in data.chunks(piece.max(1)) {
        out.extend(stream.push(chunk).ok()?);
    }
    // Whether the end is clean does not change what was forwarded.
    let _ = stream.finish();
    Some(out)
}

fn check_rewritten(out: &[u8]) {
    if out.is_empty() {
        return;
    }
    let mut server = loona_hpack::Decoder::new();
    let mut block: Option<Vec<u8>> = None;
    for frame in frames_after_preface(out) {
        let fragment = match frame.frame_type {
            TYPE_HEADERS => {
                assert!(block.is_none(), "no HEADERS inside a header block");
                assert_eq!(frame.flags & PADDED, 0, "padding is dropped");
                let start = if frame.flags & PRIORITY != 0 { 5 } else { 0 };
                block = Some(Vec::new());
                &frame.payload[start..]
            }
            // A stray CONTINUATION outside any block is the client's and
            // passes through for the server to refuse.
            TYPE_CONTINUATION if block.is_some() => &frame.payload[..],
            _ => {
                assert!(block.is_none(), "header blocks are not interleaved");
                continue;
            }
        };
        if let Some(b) = block.as_mut() {
            b.extend_from_slice(fragment);
        }
        if frame.flags & END_HEADERS != 0
            && let Some(b) = block.take()
        {
            let headers = server
                .decode(&b)
                .expect("the server can decode every block");
            for (name, value) in headers {
                if name == b":authority" {
                    assert_eq!(value, b"localhost");
                }
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&piece, data)) = input.split_first() else {
        return;
    };
    // Prefix the preface most of the time, so that the fuzzer spends its
    // effort on frames rather than on rediscovering 24 fixed bytes.
    let mut bytes = Vec::with_capacity(data.len() + PREFACE.len());
    if piece & 0x80 == 0 {
        bytes.extend_from_slice(PREFACE);
    }
    bytes.extend_from_slice(data);
    let piece = usize::from(piece & 0x7f) + 1;

    let whole = run(Rewrite::Authority, &bytes, bytes.len());
    let pieces = run(Rewrite::Authority, &bytes, piece);
    assert_eq!(whole, pieces, "how the bytes arrive does not matter");
    if let Some(out) = &whole {
        check_rewritten(out);
    }
    if let Some(out) = run(Rewrite::PassThrough, &bytes, piece) {
        check_rewritten_passthrough(&bytes, &out);
    }
});

/// Pass-through forwards the bytes it accepted, frame for frame.
fn check_rewritten_passthrough(input: &[u8], out: &[u8]) {
    assert!(out.len() <= input.len());
    // Only the reserved stream-id bit may differ.
    for (i, (a, b)) in input.iter().zip(out).enumerate() {
        if a != b {
            assert!(i >= PREFACE.len() && a & 0x7f == *b, "byte {i} changed");
        }
    }
}
