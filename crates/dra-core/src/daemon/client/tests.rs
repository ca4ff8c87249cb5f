//! The client: kubeconfig resolution, and what its connections are.

use std::sync::{Arc, Mutex};

use super::*;

#[tokio::test]
async fn explicit_kubeconfig_errors_name_the_file() {
    let missing = Path::new("/nonexistent/kubeconfig");
    let err = kube_client(Some(missing), Duration::from_secs(1))
        .await
        .err()
        .expect("missing file");
    assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kc");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
         contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .expect("write");
    let client = kube_client(Some(&file), Duration::from_secs(1))
        .await
        .expect("client from file");
    assert_eq!(client.default_namespace(), "default");
}

/// A TLS server that offers `h2` and `http/1.1` as the API server does,
/// counts the connections it accepts, notes each request's HTTP version and
/// the client's address, and holds `/watch` open until told.
struct Server {
    address: std::net::SocketAddr,
    connections: Arc<Mutex<Vec<std::net::SocketAddr>>>,
    versions: Arc<Mutex<Vec<hyper::Version>>>,
    release_watch: Arc<tokio::sync::Notify>,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

async fn tls_server() -> Server {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().expect("ip"))];
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca_cert.pem()).expect("write ca");

    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("server tls");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let connections = Arc::new(Mutex::new(Vec::new()));
    let versions = Arc::new(Mutex::new(Vec::new()));
    let release_watch = Arc::new(tokio::sync::Notify::new());
    {
        let (connections, versions, release_watch) =
            (connections.clone(), versions.clone(), release_watch.clone());
        tokio::spawn(async move {
            loop {
                let Ok((socket, peer)) = listener.accept().await else {
                    return;
                };
                connections.lock().unwrap().push(peer);
                let (acceptor, versions, release_watch) =
                    (acceptor.clone(), versions.clone(), release_watch.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(socket).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                        let (versions, release_watch) = (versions.clone(), release_watch.clone());
                        async move {
                            versions.lock().unwrap().push(request.version());
                            if request.uri().path() == "/watch" {
                                release_watch.notified().await;
                            }
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(hyper::body::Bytes::from_static(b"{}")),
                            ))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                });
            }
        });
    }
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{address}\n    certificate-authority: {}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n",
            ca_file.display()
        ),
    )
    .expect("write kubeconfig");
    Server {
        address,
        connections,
        versions,
        release_watch,
        kubeconfig,
        _dir: dir,
    }
}

/// A [`tls_server`] and our client of it, connected by one GET.
async fn connected() -> (Server, kube::Client) {
    let server = tls_server().await;
    let client = kube_client(Some(&server.kubeconfig), Duration::from_secs(10))
        .await
        .expect("client");
    assert_eq!(get(&client, "/version").await, "{}");
    (server, client)
}

async fn get(client: &kube::Client, path: &str) -> String {
    let request = hyper::Request::get(path).body(Vec::new()).expect("request");
    client.request_text(request).await.expect("GET")
}

/// A request held open (the publisher's watch) and a burst of GETs (a
/// burst of prepares) share the one HTTP/2 connection: with kube's
/// HTTP/1.1 stack each GET in flight beside the watch needed a connection
/// of its own, opened inside the prepare call.
#[tokio::test]
async fn requests_share_one_http2_connection_while_a_watch_holds_it() {
    let (server, client) = connected().await;
    let watch = {
        let client = client.clone();
        tokio::spawn(async move { get(&client, "/watch").await })
    };
    while server.versions.lock().unwrap().len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let burst = futures::future::join_all((0..8).map(|_| get(&client, "/version"))).await;
    assert!(burst.iter().all(|body| body == "{}"), "{burst:?}");
    assert!(
        !watch.is_finished(),
        "the watch was still open during the burst"
    );
    server.release_watch.notify_one();
    assert_eq!(watch.await.expect("watch task"), "{}");

    let versions = server.versions.lock().unwrap().clone();
    assert_eq!(versions.len(), 10, "{versions:?}");
    assert!(
        versions.iter().all(|v| *v == hyper::Version::HTTP_2),
        "{versions:?}"
    );
    let connections = server.connections.lock().unwrap().clone();
    assert_eq!(
        connections.len(),
        1,
        "one connection for all: {connections:?}"
    );
}

/// The client's end of the connection: Nagle off (a request is never held
/// back for the ACK of the one before) and TCP keepalive on at our timings.
#[tokio::test]
async fn the_connection_sends_at_once_and_is_kept_alive() {
    let (server, client) = connected().await;
    let ours = server.connections.lock().unwrap()[0];
    let socket = client_socket(ours, server.address).expect("the client's socket in /proc/self/fd");
    use nix::sys::socket::{getsockopt, sockopt};
    // SAFETY: the fd is this process's open socket, found just above, and
    // the client that owns it lives to the end of this test.
    #[allow(unsafe_code)]
    let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(socket) };
    assert!(getsockopt(&socket, sockopt::TcpNoDelay).expect("TCP_NODELAY"));
    assert!(getsockopt(&socket, sockopt::KeepAlive).expect("SO_KEEPALIVE"));
    let seconds = |d: Duration| u32::try_from(d.as_secs()).expect("small");
    assert_eq!(
        getsockopt(&socket, sockopt::TcpKeepIdle).expect("TCP_KEEPIDLE"),
        seconds(connection::KEEPALIVE_IDLE)
    );
    assert_eq!(
        getsockopt(&socket, sockopt::TcpKeepInterval).expect("TCP_KEEPINTVL"),
        seconds(connection::KEEPALIVE_INTERVAL)
    );
    assert_eq!(
        getsockopt(&socket, sockopt::TcpKeepCount).expect("TCP_KEEPCNT"),
        connection::KEEPALIVE_PROBES
    );
    drop(client);
}

/// The fd of this process's TCP socket from `local` to `peer`.
fn client_socket(
    local: std::net::SocketAddr,
    peer: std::net::SocketAddr,
) -> Option<std::os::fd::RawFd> {
    use nix::sys::socket::{SockaddrIn, getpeername, getsockname};
    let v4 = |a: SockaddrIn| std::net::SocketAddr::from((a.ip(), a.port()));
    std::fs::read_dir("/proc/self/fd")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .find(|&fd| {
            getsockname::<SockaddrIn>(fd).ok().map(v4) == Some(local)
                && getpeername::<SockaddrIn>(fd).ok().map(v4) == Some(peer)
        })
}
