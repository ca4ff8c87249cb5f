use std::path::PathBuf;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::WatchParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::daemon::client::kube_client;

/// Short, so the tests are quick; the kind of error is what they assert.
const LIMIT: Duration = Duration::from_millis(300);

#[test]
fn watches_are_recognised_by_their_query() {
    let cases = [
        ("/api/v1/nodes/n1", false),
        (
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=x",
            false,
        ),
        (
            "/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion=1",
            true,
        ),
        ("/api/v1/nodes?resourceVersion=1&watch=1", true),
        ("/api/v1/nodes?watch=false", false),
        (
            "/api/v1/nodes?fieldSelector=metadata.name%3Dwatch%3Dtrue",
            false,
        ),
    ];
    for (uri, watch) in cases {
        let uri: Uri = uri.parse().unwrap();
        assert_eq!(is_watch(&uri), watch, "{uri}");
    }
}

/// What the test server does with each connection after reading the request.
#[derive(Clone, Copy)]
enum Server {
    /// Accepts and never answers.
    Silent,
    /// Sends the head of a 200 answer, then nothing of its body.
    HeadOnly,
}

/// A local API server that misbehaves as told; the kubeconfig pointing at it.
async fn serve(behaviour: Server) -> (tempfile::TempDir, PathBuf) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer).await;
            if let Server::HeadOnly = behaviour {
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-length: 1000\r\n\r\n{\"kind\":",
                    )
                    .await;
            }
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kubeconfig");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{address}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    (dir, file)
}

fn timed_out(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Service(e) if e.downcast_ref::<RequestTimedOut>() == Some(&RequestTimedOut { limit: LIMIT }))
}

#[tokio::test]
async fn a_request_the_server_never_answers_fails_with_its_deadline() {
    let (_dir, kubeconfig) = serve(Server::Silent).await;
    let client = kube_client(Some(&kubeconfig), LIMIT).await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let error = nodes.get("n1").await.expect_err("no answer");
    assert!(timed_out(&error), "{error:?}");
    assert!(
        error.to_string().contains("--api-request-timeout") || {
            let source = std::error::Error::source(&error).map(ToString::to_string);
            source.is_some_and(|s| s.contains("--api-request-timeout"))
        }
    );
}

#[tokio::test]
async fn a_body_that_stops_coming_fails_with_the_same_deadline() {
    let (_dir, kubeconfig) = serve(Server::HeadOnly).await;
    let client = kube_client(Some(&kubeconfig), LIMIT).await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let error = nodes.get("n1").await.expect_err("no whole answer");
    assert!(timed_out(&error), "{error:?}");
}

/// A watch is the server's to end: the deadline of the other requests does
/// not cut it (here it is still waiting after ten times that deadline).
#[tokio::test]
async fn a_watch_is_not_cut_by_the_request_deadline() {
    let (_dir, kubeconfig) = serve(Server::Silent).await;
    let client = kube_client(Some(&kubeconfig), LIMIT).await.unwrap();
    let nodes: Api<Node> = Api::all(client);
    let params = WatchParams::default();
    let watch = nodes.watch(&params, "0");
    let outcome = tokio::time::timeout(LIMIT * 10, watch).await;
    assert!(
        outcome.is_err(),
        "the watch ended early: {:?}",
        outcome.map(|r| r.err())
    );
}
