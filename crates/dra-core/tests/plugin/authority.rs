//! Raw HTTP/2, as kubelet's grpc-go speaks it to the registration socket:
//! a percent-encoded `:authority` gets an answer.

use super::*;

const PERCENT_ENCODED: &str =
    "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Ftest.example.com-reg.sock";

#[derive(Debug)]
enum RawOutcome {
    Answered {
        status: Vec<u8>,
        grpc_status: Vec<u8>,
        message: Vec<u8>,
    },
    Reset(u32),
    GoAway(u32),
}

async fn raw_get_info(socket: &Path, authority: &str) -> RawOutcome {
    let mut s = UnixStream::connect(socket).await.unwrap();
    let mut encoder = loona_hpack::Encoder::new();
    let headers: Vec<(&[u8], &[u8])> = vec![
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/pluginregistration.Registration/GetInfo"),
        (b":authority", authority.as_bytes()),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.72.1"),
        (b"te", b"trailers"),
    ];
    let block = encoder.encode(headers);
    let mut out = PREFACE.to_vec();
    Frame {
        frame_type: 0x4,
        flags: 0,
        stream: 0,
        payload: vec![],
    }
    .encode(&mut out);
    // HEADERS split in two, the second half in a CONTINUATION, with padding.
    let (a, b) = block.split_at(block.len() / 2);
    let mut payload = vec![2u8];
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0]);
    Frame {
        frame_type: 0x1,
        flags: 0x8,
        stream: 1,
        payload,
    }
    .encode(&mut out);
    Frame {
        frame_type: 0x9,
        flags: 0x4,
        stream: 1,
        payload: b.to_vec(),
    }
    .encode(&mut out);
    // Empty InfoRequest: uncompressed flag + zero length.
    Frame {
        frame_type: 0x0,
        flags: 0x1,
        stream: 1,
        payload: vec![0, 0, 0, 0, 0],
    }
    .encode(&mut out);
    s.write_all(&out).await.unwrap();

    let mut decoder = loona_hpack::Decoder::new();
    let mut status = Vec::new();
    let mut message = Vec::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s))
            .await
            .expect("server answered in time")
            .unwrap()
            .expect("server kept the connection open until it answered");
        match frame.frame_type {
            0x4 if frame.flags & 0x1 == 0 => {
                let mut ack = Vec::new();
                Frame {
                    frame_type: 0x4,
                    flags: 0x1,
                    stream: 0,
                    payload: vec![],
                }
                .encode(&mut ack);
                s.write_all(&ack).await.unwrap();
            }
            0x1 if frame.stream == 1 => {
                assert!(
                    frame.flags & 0x4 != 0,
                    "test expects unsplit response headers"
                );
                let headers = decoder.decode(&frame.payload).unwrap();
                let get = |name: &[u8]| {
                    headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                };
                if let Some(s) = get(b":status") {
                    status = s;
                }
                if frame.flags & 0x1 != 0 {
                    return RawOutcome::Answered {
                        status,
                        grpc_status: get(b"grpc-status").unwrap_or_default(),
                        message,
                    };
                }
            }
            0x0 if frame.stream == 1 => message.extend_from_slice(&frame.payload),
            0x3 if frame.stream == 1 => {
                return RawOutcome::Reset(u32::from_be_bytes(
                    frame.payload[..4].try_into().unwrap(),
                ));
            }
            0x7 => {
                return RawOutcome::GoAway(u32::from_be_bytes(
                    frame.payload[4..8].try_into().unwrap(),
                ));
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn raw_frames_with_percent_encoded_authority_get_plugin_info() {
    let h = start().await;
    match raw_get_info(&h.running.sockets.registration, PERCENT_ENCODED).await {
        RawOutcome::Answered {
            status,
            grpc_status,
            message,
        } => {
            assert_eq!(status, b"200");
            assert_eq!(grpc_status, b"0");
            assert_eq!(message[0], 0, "uncompressed");
            let len = u32::from_be_bytes(message[1..5].try_into().unwrap()) as usize;
            let info = reg::PluginInfo::decode(&message[5..5 + len]).unwrap();
            assert_eq!(info.name, DRIVER);
            assert_eq!(info.r#type, "DRAPlugin");
            assert_eq!(
                info.supported_versions,
                ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            );
        }
        other => panic!("registration socket refused kubelet's request: {other:?}"),
    }
    stop(h).await;
}

struct BareRegistration;

#[tonic::async_trait]
impl reg::registration_server::Registration for BareRegistration {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo::default()))
    }
    async fn notify_registration_status(
        &self,
        _: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Documents the trap the adapter exists for: a plain tonic server resets
/// kubelet's request. If h2 ever accepts it, this fails and the adapter can go.
#[tokio::test]
async fn without_the_adapter_h2_refuses_the_percent_encoded_authority() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bare-reg.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let token = CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                BareRegistration,
            ))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                token.clone().cancelled_owned(),
            ),
    );
    match raw_get_info(&path, PERCENT_ENCODED).await {
        RawOutcome::Reset(code) | RawOutcome::GoAway(code) => assert_eq!(code, 1, "PROTOCOL_ERROR"),
        other => panic!("h2 accepted the percent-encoded authority: {other:?}"),
    }
    // The same raw client with a valid authority is answered: the test client is sound.
    assert!(matches!(
        raw_get_info(&path, "localhost").await,
        RawOutcome::Answered { .. }
    ));
    token.cancel();
    server.await.unwrap().unwrap();
}
