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
        let len =
            (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2]);
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

fn encoded(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        f.encode(&mut out);
    }
    out
}

#[test]
fn inbound_stream_checks_the_preface_byte_by_byte() {
    let mut s = InboundStream::new(Rewrite::Authority);
    assert_eq!(s.push(&PREFACE[..10]).unwrap(), b"");
    assert!(s.is_mid_frame());
    assert!(matches!(s.finish(), Err(AdapterError::Truncated(_))));
    // The first wrong byte is enough: no waiting for 24 bytes.
    let err = InboundStream::new(Rewrite::Authority)
        .push(b"GET")
        .unwrap_err();
    assert!(matches!(err, AdapterError::BadPreface), "{err}");
    let mut s = InboundStream::new(Rewrite::PassThrough);
    assert_eq!(s.push(PREFACE).unwrap(), PREFACE);
    assert!(!s.is_mid_frame());
    s.finish().unwrap();
}

#[test]
fn inbound_stream_output_does_not_depend_on_how_bytes_arrive() {
    let mut client = Encoder::new();
    let block = client.encode(
        request(PATH_AUTHORITY, b"/a")
            .iter()
            .map(|(n, v)| (&n[..], &v[..])),
    );
    let mut bytes = PREFACE.to_vec();
    bytes.extend(encoded(&[
        Frame {
            frame_type: 0x4,
            flags: 0,
            stream: 0,
            payload: vec![],
        },
        Frame {
            frame_type: TYPE_HEADERS,
            flags: FLAG_END_HEADERS,
            stream: 1,
            payload: block,
        },
    ]));
    let whole = InboundStream::new(Rewrite::Authority).push(&bytes).unwrap();
    let mut s = InboundStream::new(Rewrite::Authority);
    let mut bytewise = Vec::new();
    for b in &bytes {
        bytewise.extend(s.push(std::slice::from_ref(b)).unwrap());
    }
    s.finish().unwrap();
    assert_eq!(whole, bytewise);
    let frames = split_frames(&whole[PREFACE.len()..]);
    let blocks = server_view(&frames, &mut Decoder::new());
    assert_eq!(blocks[0].1, request(AUTHORITY, b"/a"));
}

#[test]
fn oversized_frames_are_refused_from_their_header() {
    let mut bytes = PREFACE.to_vec();
    // Only the header of a 16 MiB frame: refused before any payload.
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0x0, 0x0, 0, 0, 0, 1]);
    for rewrite in [Rewrite::Authority, Rewrite::PassThrough] {
        let err = InboundStream::new(rewrite).push(&bytes).unwrap_err();
        assert!(
            matches!(err, AdapterError::FrameTooLarge { len: 0xff_ffff }),
            "{err}"
        );
    }
}

#[test]
fn header_lists_that_decode_past_the_limit_are_refused() {
    // One 4000-byte value in the dynamic table, then a small block
    // referencing it 40 times: 160 KB decoded from 40 bytes.
    let mut first = vec![0x40, 5];
    first.extend_from_slice(b"x-big");
    let value = vec![b'v'; 4000];
    let mut len = Vec::new();
    // The value's length as a 7-bit prefixed integer: 127, then the
    // remaining 3873 in 7-bit groups.
    len.push(0x7f);
    let mut rest = 4000 - 127;
    while rest >= 128 {
        len.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    len.push(rest as u8);
    first.extend_from_slice(&len);
    first.extend_from_slice(&value);
    let mut rewriter = HeaderRewriter::new();
    rewriter
        .feed(Frame {
            frame_type: TYPE_HEADERS,
            flags: FLAG_END_HEADERS,
            stream: 1,
            payload: first,
        })
        .unwrap();
    let bomb = vec![0x80 | 62; 40];
    let err = rewriter
        .feed(Frame {
            frame_type: TYPE_HEADERS,
            flags: FLAG_END_HEADERS,
            stream: 3,
            payload: bomb,
        })
        .unwrap_err();
    assert!(
        matches!(err, AdapterError::HeaderListTooLarge { stream: 3 }),
        "{err}"
    );
}

#[test]
fn endless_continuations_are_refused() {
    let mut rewriter = HeaderRewriter::new();
    rewriter
        .feed(Frame {
            frame_type: TYPE_HEADERS,
            flags: 0,
            stream: 1,
            payload: vec![0x82],
        })
        .unwrap();
    let mut result = Ok(Vec::new());
    for _ in 0..=(MAX_HEADER_LIST / MAX_IN_FRAME) {
        result = rewriter.feed(Frame {
            frame_type: TYPE_CONTINUATION,
            flags: 0,
            stream: 1,
            payload: vec![0x82; MAX_IN_FRAME],
        });
        if result.is_err() {
            break;
        }
    }
    assert!(matches!(
        result,
        Err(AdapterError::HeaderListTooLarge { stream: 1 })
    ));
}

/// `value` as an HPACK integer with an `n`-bit prefix, `flags` in the
/// first byte's high bits (RFC 7541 §5.1).
fn hpack_int(flags: u8, n: u32, value: usize) -> Vec<u8> {
    let max = (1usize << n) - 1;
    if value < max {
        return vec![flags | value as u8];
    }
    let mut out = vec![flags | max as u8];
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
    out
}

/// A literal header with incremental indexing and a new name (§6.2.1).
fn indexed_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0x40];
    out.extend(hpack_int(0, 7, name.len()));
    out.extend_from_slice(name);
    out.extend(hpack_int(0, 7, value.len()));
    out.extend_from_slice(value);
    out
}

fn headers_frame(stream: u32, payload: Vec<u8>) -> Frame {
    Frame {
        frame_type: TYPE_HEADERS,
        flags: FLAG_END_HEADERS,
        stream,
        payload,
    }
}

/// Many header blocks on one connection, each adding a 1,000-byte entry
/// (1,010 + 32 bytes as HPACK counts it): the mirror table keeps only what
/// fits the 4,096 bytes the server allows, so after 10,000 blocks the three
/// newest entries are there and the fourth newest was evicted, whatever
/// size updates within the limit came in between.
#[test]
fn the_dynamic_table_stays_within_the_servers_size_over_many_blocks() {
    let mut rewriter = HeaderRewriter::new();
    let value = |i: usize| format!("{i:01000}").into_bytes();
    // The server's decoder, fed everything the relay forwards.
    let mut server = Decoder::new();
    let mut stream = 1;
    for i in 0..10_000 {
        let mut block = Vec::new();
        if i % 1_000 == 0 {
            // Size updates at the limit and below are fine (§6.3); 0
            // empties the table, then it is raised back to the limit.
            block.extend(hpack_int(0x20, 5, 0));
            block.extend(hpack_int(0x20, 5, MAX_HEADER_TABLE));
        }
        block.extend(indexed_literal(b"x-entry", &value(i)));
        let out = rewriter.feed(headers_frame(stream, block)).unwrap();
        server_view(&split_frames(&out), &mut server);
        stream += 2;
    }
    // The three newest entries are dynamic indexes 62, 63, 64 (§2.3.3).
    let out = rewriter
        .feed(headers_frame(stream, vec![0x80 | 62, 0x80 | 63, 0x80 | 64]))
        .unwrap();
    let seen = server_view(&split_frames(&out), &mut server);
    let values: Vec<&[u8]> = seen[0].1.iter().map(|(_, v)| v.as_slice()).collect();
    assert_eq!(
        values,
        [&value(9_999)[..], &value(9_998)[..], &value(9_997)[..]]
    );
    let err = rewriter
        .feed(headers_frame(stream + 2, vec![0x80 | 65]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            AdapterError::Hpack(loona_hpack::decoder::DecoderError::HeaderIndexOutOfBounds)
        ),
        "{err}"
    );
}

/// A dynamic table size update above what the server allows is a decoding
/// error (RFC 7541 §6.3), one byte over as much as 1 MiB: the connection
/// is closed before a single entry could make the table grow past 4,096.
#[test]
fn a_table_size_update_above_the_servers_limit_is_refused() {
    for size in [MAX_HEADER_TABLE + 1, 1 << 20] {
        let mut rewriter = HeaderRewriter::new();
        let mut block = hpack_int(0x20, 5, size);
        block.extend(indexed_literal(b"x-big", &vec![b'v'; 8_000]));
        let err = rewriter.feed(headers_frame(1, block)).unwrap_err();
        assert!(
            matches!(
                err,
                AdapterError::Hpack(loona_hpack::decoder::DecoderError::InvalidMaxDynamicSize)
            ),
            "{size}: {err}"
        );
        // Through the connection's parser too: the error closes it.
        let mut inbound = InboundStream::new(Rewrite::Authority);
        let mut bytes = PREFACE.to_vec();
        headers_frame(1, hpack_int(0x20, 5, size)).encode(&mut bytes);
        assert!(inbound.push(&bytes).is_err(), "{size}");
    }
}
