//! One registration connection carrying many requests, as kubelet's gRPC
//! client keeps it open: a stream of well-formed HEADERS blocks (some split
//! into CONTINUATION frames) encoded against one HPACK dynamic table that
//! grows, evicts and is resized by table size updates, fed through the
//! `:authority` rewriter in arbitrary pieces. The state carried from frame
//! to frame is what this target exercises (the `authority` target mostly
//! sees blocks that do not decode). Never a panic; while every size update
//! stays within the table the server announced (4096 bytes), every block
//! reaches the server intact but for `:authority`, which reads
//! `localhost`; a size update above it ends the connection with an error.
//!
//! Input: a byte stream read as a script (see [`Script`]).
#![no_main]

use dra_core::fuzzing::{Frame, InboundStream, PREFACE, Rewrite};
use libfuzzer_sys::fuzz_target;

#[path = "common/relay_output.rs"]
mod relay_output;
#[path = "common/script.rs"]
mod script;
use relay_output::frames_after_preface;
use script::Script;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// One header block's (name, value) pairs, in order.
type HeaderList = Vec<(Vec<u8>, Vec<u8>)>;

/// The dynamic table size the relay accepts, as its SETTINGS say.
const TABLE_LIMIT: usize = 4096;

const NAMES: [&[u8]; 8] = [
    b":method",
    b":path",
    b":scheme",
    b":authority",
    b"content-type",
    b"te",
    b"grpc-timeout",
    b"x-trace",
];
const VALUES: [&[u8]; 6] = [
    b"POST",
    b"/v1beta1.DRAPlugin/NodePrepareResources",
    b"http",
    b"unix:///var/lib/kubelet/plugins/efa.networking.k8s.aws/dra.sock",
    b"application/grpc",
    b"trailers",
];

impl Script<'_> {
    /// A value: one of the usual ones, or up to 255 bytes of the input (to
    /// fill the table and make it evict).
    fn value(&mut self) -> Vec<u8> {
        let pick = self.byte();
        if pick < 200 {
            return VALUES[usize::from(pick) % VALUES.len()].to_vec();
        }
        let len = usize::from(self.byte());
        (0..len).map(|_| self.byte()).collect()
    }
}

/// The connection the script describes: the bytes the client sends, each
/// block's header list as sent, and whether a size update went above the
/// limit.
fn connection(script: &mut Script<'_>) -> (Vec<u8>, Vec<HeaderList>, bool) {
    let mut encoder = loona_hpack::Encoder::new();
    let mut wire = PREFACE.to_vec();
    let mut sent = Vec::new();
    let mut oversize = false;
    let mut stream = 1u32;
    while !script.done() && sent.len() < 256 {
        let control = script.byte();
        let mut block = Vec::new();
        if control & 0x80 != 0 {
            // A dynamic table size update, first in the block (RFC 7541
            // 6.3): 001 and the size as a 5-bit-prefix integer.
            let size = usize::from(u16::from_be_bytes([script.byte(), script.byte()]));
            let mut update = loona_hpack::encoder::encode_integer(size, 5);
            update[0] |= 0x20;
            block.extend(update);
            if size > TABLE_LIMIT {
                oversize = true;
            } else {
                encoder.set_max_table_size(size);
            }
        }
        let count = usize::from(control & 0x7) + 1;
        let headers: Vec<(Vec<u8>, Vec<u8>)> = (0..count)
            .map(|_| {
                let name = NAMES[usize::from(script.byte()) % NAMES.len()].to_vec();
                (name, script.value())
            })
            .collect();
        block.extend(encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..]))));
        // Split the block over a HEADERS and a CONTINUATION frame.
        let split = if control & 0x40 != 0 {
            usize::from(script.byte()).min(block.len())
        } else {
            block.len()
        };
        let (first, rest) = block.split_at(split);
        let end_headers = if rest.is_empty() { END_HEADERS } else { 0 };
        for frame in [
            Some(Frame {
                frame_type: TYPE_HEADERS,
                flags: END_STREAM | end_headers,
                stream,
                payload: first.to_vec(),
            }),
            (!rest.is_empty()).then(|| Frame {
                frame_type: TYPE_CONTINUATION,
                flags: END_HEADERS,
                stream,
                payload: rest.to_vec(),
            }),
        ]
        .into_iter()
        .flatten()
        {
            frame.encode(&mut wire);
        }
        sent.push(headers);
        stream += 2;
    }
    (wire, sent, oversize)
}

/// The header lists the server decodes from the relay's output.
fn server_side(out: &[u8]) -> Vec<HeaderList> {
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(TABLE_LIMIT);
    let mut lists = Vec::new();
    let mut block: Vec<u8> = Vec::new();
    for frame in frames_after_preface(out) {
        assert!(
            frame.frame_type == TYPE_HEADERS || frame.frame_type == TYPE_CONTINUATION,
            "only header frames were sent"
        );
        block.extend_from_slice(&frame.payload);
        if frame.flags & END_HEADERS != 0 {
            let list = decoder
                .decode(&block)
                .expect("the server decodes every block the relay forwards");
            lists.push(list);
            block.clear();
        }
    }
    lists
}

/// `list` without `:authority`, and whether every `:authority` it had was
/// `localhost`.
fn without_authority(list: &[(Vec<u8>, Vec<u8>)]) -> (HeaderList, bool) {
    let local = list
        .iter()
        .filter(|(n, _)| n == b":authority")
        .all(|(_, v)| v == b"localhost");
    let rest = list
        .iter()
        .filter(|(n, _)| n != b":authority")
        .cloned()
        .collect();
    (rest, local)
}

fuzz_target!(|input: &[u8]| {
    let Some((&piece, script)) = input.split_first() else {
        return;
    };
    let (wire, sent, oversize) = connection(&mut Script(script));
    let mut relay = InboundStream::new(Rewrite::Authority);
    let mut out = Vec::new();
    let mut refused = false;
    for chunk in wire.chunks(usize::from(piece) + 1) {
        match relay.push(chunk) {
            Ok(bytes) => out.extend(bytes),
            Err(_) => {
                refused = true;
                break;
            }
        }
    }
    if oversize {
        assert!(
            refused,
            "a table size update above {TABLE_LIMIT} was accepted"
        );
        return;
    }
    assert!(!refused, "a well-formed connection was refused");
    let received = server_side(&out);
    assert_eq!(received.len(), sent.len(), "every block is forwarded");
    for (got, want) in received.iter().zip(&sent) {
        let (got, local) = without_authority(got);
        assert!(local, ":authority is rewritten to localhost");
        assert_eq!(
            got,
            without_authority(want).0,
            "the rest of the block is intact"
        );
    }
});
