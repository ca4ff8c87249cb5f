//! The LeaderWorkerSet controller beside the local cluster: built from its
//! Go module (`e2e/go/lws`), its CRD and webhook configurations read from
//! that module's source in the Go module cache, and the program run as a
//! host process that serves its webhooks on 127.0.0.1.
//!
//! LWS's own deployment runs it in a pod behind a Service, with its
//! internal cert manager writing the serving certificate into a Secret.
//! Here there is no pod network, so (from v0.7.0's `cmd/main.go` and
//! `pkg/config`): a `Configuration` file turns the internal cert
//! management off and puts the webhook server on 127.0.0.1 with a
//! certificate we sign; the webhook configurations point at that address by
//! URL instead of at the Service; leader election, metrics and health
//! probes are off. The webhooks stay on (`ENABLE_WEBHOOKS` unset): the pod
//! webhook is what turns the `exclusive-topology` annotation into pod
//! affinity and sets `LWS_LEADER_ADDRESS`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use local_cluster::go_build::Progress;
use local_cluster::pki::ClusterCa;
use local_cluster::process::ManagedProcess;
use serde_json::{Value, json};

/// The wrapper module and what it builds.
const MODULE_DIR: &str = "e2e/go/lws";
const MODULE: &str = "sigs.k8s.io/lws";
const PACKAGE: &str = "sigs.k8s.io/lws/cmd";
const BINARY: &str = "lws";
/// LWS's kustomize overlay (`config/default`) names its objects with this
/// prefix.
const NAME_PREFIX: &str = "lws-";

/// The built controller and its module source.
#[derive(Debug, Clone)]
pub struct LwsTool {
    pub binary: PathBuf,
    pub version: String,
    /// `sigs.k8s.io/lws@<version>` in the module cache (CRD, webhooks).
    pub source: PathBuf,
}

/// Builds (or finds up to date) the controller, as the autoscale run builds
/// Karpenter: into `<cache>/bin/lws-<version>`, the Go build cache emptied
/// afterwards.
pub fn build(progress: &mut Progress) -> Result<LwsTool> {
    let dir = local_cluster::paths::repo_root().join(MODULE_DIR);
    let (binary, version, source) =
        crate::autoscale::tools::build_one(&dir, MODULE, BINARY, PACKAGE, progress)?;
    Ok(LwsTool {
        binary,
        version,
        source,
    })
}

/// LWS's CustomResourceDefinitions, from the module's `config/crd/bases`.
pub fn crds(tool: &LwsTool) -> Result<Vec<Value>> {
    yaml_dir(&tool.source.join("config/crd/bases"))
}

fn yaml_dir(dir: &Path) -> Result<Vec<Value>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        out.extend(e2e::manifests::read(&file)?);
    }
    ensure!(!out.is_empty(), "no manifest in {}", dir.display());
    Ok(out)
}

/// LWS's webhook configurations (`config/webhook/manifests.yaml` with the
/// module's own `mutating-patch.yaml` and `validating-patch.yaml`, which
/// narrow the pod webhooks to LWS's pods), each webhook sent to
/// `https://<addr><path>` and trusting `ca_pem`.
pub fn webhook_configurations(
    tool: &LwsTool,
    addr: SocketAddr,
    ca_pem: &[u8],
) -> Result<Vec<Value>> {
    let dir = tool.source.join("config/webhook");
    let read = |name: &str| -> Result<Vec<Value>> { Ok(e2e::manifests::read(&dir.join(name))?) };
    let mut configs = read("manifests.yaml")?;
    for (kind, patch) in [
        ("MutatingWebhookConfiguration", "mutating-patch.yaml"),
        ("ValidatingWebhookConfiguration", "validating-patch.yaml"),
    ] {
        let ops = read(patch)?;
        let config = configs
            .iter_mut()
            .find(|c| c["kind"] == kind)
            .with_context(|| format!("no {kind} in manifests.yaml"))?;
        for op in ops
            .iter()
            .flat_map(|o| o.as_array().cloned().unwrap_or_default())
        {
            apply_replace(config, &op).with_context(|| format!("{patch}: {op}"))?;
        }
    }
    let ca_bundle = serde_json::to_value(k8s_openapi::ByteString(ca_pem.to_vec()))?;
    for config in &mut configs {
        point_at(config, addr, &ca_bundle)?;
    }
    Ok(configs)
}

/// One JSON-patch operation of LWS's patch files: only `replace` occurs.
fn apply_replace(target: &mut Value, op: &Value) -> Result<()> {
    ensure!(op["op"] == "replace", "only replace is supported");
    let path = op["path"].as_str().context("no path")?;
    let slot = target
        .pointer_mut(path)
        .with_context(|| format!("{path} is not in the object"))?;
    *slot = op["value"].clone();
    Ok(())
}

/// Renames a webhook configuration as LWS's overlay does and sends each of
/// its webhooks to `addr` by URL (there is no Service to name).
fn point_at(config: &mut Value, addr: SocketAddr, ca_bundle: &Value) -> Result<()> {
    let name = config["metadata"]["name"]
        .as_str()
        .context("webhook configuration without a name")?;
    config["metadata"]["name"] = json!(format!("{NAME_PREFIX}{name}"));
    let webhooks = config["webhooks"]
        .as_array_mut()
        .context("webhook configuration without webhooks")?;
    for w in webhooks {
        let path = w["clientConfig"]["service"]["path"]
            .as_str()
            .with_context(|| format!("webhook {} has no service path", w["name"]))?;
        w["clientConfig"] = json!({"url": format!("https://{addr}{path}"), "caBundle": ca_bundle});
    }
    Ok(())
}

/// What the controller process needs on disk: the CA (for the webhook
/// configurations), the serving certificate in `tls.crt`/`tls.key` (the
/// names controller-runtime's webhook server reads) and its configuration.
pub struct ServingSetup {
    pub addr: SocketAddr,
    pub ca_pem: Vec<u8>,
    pub config_file: PathBuf,
}

/// Signs a certificate for 127.0.0.1 in `dir` and writes the
/// `Configuration` (config.lws.x-k8s.io/v1alpha1) the controller starts with.
pub fn serving_setup(dir: &Path) -> Result<ServingSetup> {
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let port = local_cluster::ports::reserve(ip, &|_| false)?;
    let certs = dir.join("certs");
    let ca = ClusterCa::create(&certs)?;
    ca.serving_cert("tls", "lws-webhook", &[], &[ip])?;
    let ca_pem = std::fs::read(&ca.cert_file)
        .with_context(|| format!("reading {}", ca.cert_file.display()))?;
    let config_file = dir.join("lws-config.yaml");
    std::fs::write(&config_file, configuration(ip, port, &certs).to_string())
        .with_context(|| format!("writing {}", config_file.display()))?;
    Ok(ServingSetup {
        addr: SocketAddr::new(ip, port),
        ca_pem,
        config_file,
    })
}

/// The controller's configuration (JSON is YAML): webhooks on `ip:port`
/// with the certificate in `cert_dir`, no internal cert management, no
/// leader election, metrics and health probes off ("0").
fn configuration(ip: IpAddr, port: u16, cert_dir: &Path) -> Value {
    json!({
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "internalCertManagement": {"enable": false},
        "leaderElection": {"leaderElect": false},
        "webhook": {"host": ip.to_string(), "port": port, "certDir": cert_dir},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": "0"},
    })
}

/// Starts the controller against the cluster of `kubeconfig`, logging to
/// `log`, and waits until its webhook server accepts connections.
pub fn start(
    tool: &LwsTool,
    setup: &ServingSetup,
    kubeconfig: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<ManagedProcess> {
    let mut cmd = Command::new(&tool.binary);
    cmd.env("KUBECONFIG", kubeconfig)
        .env_remove("ENABLE_WEBHOOKS")
        .arg("--config")
        .arg(&setup.config_file)
        .arg("--zap-log-level=info");
    let mut process = ManagedProcess::spawn("lws", cmd, log)?;
    let started = Instant::now();
    while TcpStream::connect_timeout(&setup.addr, Duration::from_millis(200)).is_err() {
        if !process.is_running() || started.elapsed() > timeout {
            process.terminate(Duration::from_secs(2));
            bail!(
                "the LWS controller serves no webhook on {} after {:.0}s; its log: {}",
                setup.addr,
                started.elapsed().as_secs_f64(),
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(process)
}

/// Applies objects that need a CRD just created, retrying for up to a
/// minute while the API server does not serve it yet.
pub async fn apply_when_served(client: &Client, obj: &Value, ns: Option<&str>) -> Result<()> {
    let started = Instant::now();
    loop {
        match e2e::manifests::apply(client, obj, ns).await {
            Ok(_) => return Ok(()),
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(anyhow::Error::from(e))
                    .with_context(|| format!("applying {}", e2e::manifests::id(obj)));
            }
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
