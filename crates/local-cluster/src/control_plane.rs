//! Starting the control plane of a [`LocalCluster`]: etcd, kube-apiserver
//! (with generated certificates and the release's flags from
//! [`crate::versions`]), kube-controller-manager and kube-scheduler, each
//! waited for, then the configured nodes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use serde_json::json;

use crate::cgroups;
use crate::cluster::{LocalCluster, client_from_kubeconfig};
use crate::cluster_config::{ClusterConfig, NODE_IP, PortAllocator, SERVICE_CIDR, write_json};
use crate::error::Result;
use crate::node;

impl LocalCluster {
    pub(crate) async fn bring_up(&mut self, config: &ClusterConfig) -> Result<()> {
        node::ensure_node_ip(NODE_IP)?;
        cgroups::create_everywhere(&self.inner.cgroup)?;
        let run_dir = self.inner.run_dir.clone();
        let timeout = config.start_timeout;
        let mut ports = PortAllocator::default();

        // etcd
        let etcd_client = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let etcd_peer = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let mut etcd = Command::new(&self.binaries.etcd);
        etcd.arg("--name=e2e")
            .arg(format!(
                "--data-dir={}",
                self.inner.state_dir.join("etcd").display()
            ))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=e2e={peer_url}"))
            // Throwaway data: skip fsync, it is the slowest part on a small VM.
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        self.spawn_control_plane("etcd", etcd)?;
        self.wait_until("etcd /health", timeout, || {
            http_get_ok(SocketAddr::from(([127, 0, 0, 1], etcd_client)), "/health")
        })
        .await?;

        // kube-apiserver
        let pki_dir = run_dir.join("pki");
        let api_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        self.server = format!("https://127.0.0.1:{api_port}");
        let serving = self.ca.serving_cert(
            "kube-apiserver",
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(NODE_IP),
            ],
        )?;
        // The apiserver's identity toward kubelets (logs, exec): full access.
        let kubelet_client = self.ca.client_cert(
            "kube-apiserver-kubelet-client",
            "kube-apiserver",
            &["system:masters"],
        )?;
        let sa = self.ca.service_account_key()?;
        // Everything that differs between Kubernetes releases comes from its table.
        let release = self.binaries.kubernetes_version.release()?;
        let mut apiserver = Command::new(&self.binaries.kube_apiserver);
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={api_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("apiserver-generated").display()
            ))
            .arg(format!("--tls-cert-file={}", serving.cert_file.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                serving.key_file.display()
            ))
            .arg(format!("--client-ca-file={}", self.ca.cert_file.display()))
            .arg(format!(
                "--kubelet-client-certificate={}",
                kubelet_client.cert_file.display()
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                kubelet_client.key_file.display()
            ))
            .arg(format!(
                "--kubelet-certificate-authority={}",
                self.ca.cert_file.display()
            ))
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                sa.public_key_file.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa.private_key_file.display()
            ))
            .arg("--authorization-mode=Node,RBAC")
            // Added to the default-on set (which includes ValidatingAdmissionPolicy).
            .arg("--enable-admission-plugins=NodeRestriction")
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--allow-privileged=true")
            // A loopback advertise address is refused by the endpoint reconciler.
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false")
            .args(config.enable.control_plane_flags(release, true));
        if config.audit_log {
            apiserver.args(audit_flags(&run_dir)?);
        }
        self.spawn_control_plane("kube-apiserver", apiserver)?;

        let admin = self
            .ca
            .client_cert("admin", "system:admin", &["system:masters"])?;
        let admin_kubeconfig = self.admin_kubeconfig.clone();
        self.write_kubeconfig(&admin_kubeconfig, "system:admin", &admin)?;
        let client = client_from_kubeconfig(&admin_kubeconfig).await?;
        self.wait_until_async("kube-apiserver /readyz", timeout, || {
            let client = client.clone();
            async move {
                let req = http_request("/readyz");
                matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok")
            }
        })
        .await?;
        self.client = Some(client.clone());

        // kube-controller-manager
        let kcm_cert = self.ca.client_cert(
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let kcm_kubeconfig = run_dir.join("kube-controller-manager.kubeconfig");
        self.write_kubeconfig(&kcm_kubeconfig, "system:kube-controller-manager", &kcm_cert)?;
        let kcm_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let mut kcm = Command::new(&self.binaries.kube_controller_manager);
        kcm.arg(format!("--kubeconfig={}", kcm_kubeconfig.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                kcm_kubeconfig.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                kcm_kubeconfig.display()
            ))
            .arg("--use-service-account-credentials")
            .arg(format!(
                "--service-account-private-key-file={}",
                sa.private_key_file.display()
            ))
            .arg(format!("--root-ca-file={}", self.ca.cert_file.display()))
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={kcm_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("kcm-generated").display()
            ))
            .arg("--controllers=*")
            .args(config.enable.control_plane_flags(release, false));
        self.spawn_control_plane("kube-controller-manager", kcm)?;

        // kube-scheduler
        let sched_cert = self
            .ca
            .client_cert("kube-scheduler", "system:kube-scheduler", &[])?;
        let sched_kubeconfig = run_dir.join("kube-scheduler.kubeconfig");
        self.write_kubeconfig(&sched_kubeconfig, "system:kube-scheduler", &sched_cert)?;
        let sched_config = run_dir.join("kube-scheduler.config.json");
        write_json(
            &sched_config,
            &json!({
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": sched_kubeconfig},
                "leaderElection": {"leaderElect": false},
            }),
        )?;
        let sched_port = ports.pick(IpAddr::V4(Ipv4Addr::LOCALHOST))?;
        let mut scheduler = Command::new(&self.binaries.kube_scheduler);
        scheduler
            .arg(format!("--config={}", sched_config.display()))
            .arg(format!(
                "--authentication-kubeconfig={}",
                sched_kubeconfig.display()
            ))
            .arg(format!(
                "--authorization-kubeconfig={}",
                sched_kubeconfig.display()
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={sched_port}"))
            .arg(format!(
                "--cert-dir={}",
                pki_dir.join("scheduler-generated").display()
            ))
            .args(config.enable.control_plane_flags(release, false));
        self.spawn_control_plane("kube-scheduler", scheduler)?;

        // The controller-manager is up once it created the default ServiceAccount
        // (ServiceAccount admission rejects pods until then).
        let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        self.wait_until_async("ServiceAccount default/default", timeout, || {
            let sa_api = sa_api.clone();
            async move { matches!(sa_api.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;
        self.wait_until("kube-scheduler port", timeout, || {
            TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], sched_port)),
                Duration::from_millis(200),
            )
            .is_ok()
        })
        .await?;

        for spec in &config.nodes {
            self.add_node(spec, &mut ports, timeout).await?;
        }
        Ok(())
    }
}

/// Metadata of every request but the control plane's and the kubelets'
/// (they would drown what is measured), logged in batches so that the log
/// adds no latency to a request.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:kube-scheduler", "system:kube-controller-manager", "system:apiserver"]
- level: None
  userGroups: ["system:nodes", "system:serviceaccounts:kube-system"]
- level: Metadata
"#;

/// The API server flags of the audit log at `<run_dir>/audit.log`.
fn audit_flags(run_dir: &std::path::Path) -> Result<Vec<String>> {
    let policy = run_dir.join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).map_err(crate::error::io("writing", &policy))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", run_dir.join("audit.log").display()),
        "--audit-log-format=json".into(),
        "--audit-log-mode=batch".into(),
        "--audit-log-batch-max-wait=1s".into(),
        "--audit-log-maxsize=0".into(),
    ])
}

fn http_request(path: &str) -> http::Request<Vec<u8>> {
    let mut req = http::Request::new(Vec::new());
    *req.uri_mut() = http::Uri::try_from(path).unwrap_or_default();
    req
}

/// Minimal HTTP/1.0 GET on loopback (etcd's /health), true on a 200.
fn http_get_ok(addr: SocketAddr, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}
