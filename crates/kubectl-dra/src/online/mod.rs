//! Reading the same objects from a live cluster, with kubectl's kubeconfig
//! rules (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, in-cluster;
//! `--context`; the context's namespace unless `-n`; `-A`; kubectl's
//! `--request-timeout`).
//!
//! Errors say what could not be read and what usually fixes it (RBAC, an
//! API server older than `resource.k8s.io/v1`, a timeout), because the
//! person reading them is stuck on a Pending pod, not debugging us.
//!
//! Lists are read in pages (`pages`), as kubectl reads them, and only
//! what a command needs is asked for: `topology NODE` and `devices --node`
//! ask for that node's ResourceSlices by field selector instead of the
//! fleet's (~77 MB of JSON on 1,000 nodes).

mod pages;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::inventory::{Inventory, TaintRule};
pub use pages::{PAGE_SIZE, Progress, list_pages, page_params};

#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    #[error(
        "kubeconfig: {0}; point --kubeconfig or KUBECONFIG at a valid file and pick a context \
         with --context, or work offline with -f FILE (kubectl get … -o yaml dumps)"
    )]
    Kubeconfig(String),
    #[error("cannot reach the API server: {0}")]
    Client(#[source] kube::Error),
    #[error("listing {what}: {source}{}", list_hint(what, source))]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The usual fix for a failed list, by what the server answered.
fn list_hint(what: &str, e: &kube::Error) -> String {
    let resource = what.to_lowercase();
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "; the user may not list {resource}: grant `list` on them (kubectl auth can-i list \
             {resource}), or run offline on dumps with -f"
        ),
        kube::Error::Api(s) if s.code == 404 => format!(
            "; the API server does not serve {resource} in the version kubectl-dra reads \
             (resource.k8s.io/v1 needs Kubernetes 1.34 or later)"
        ),
        kube::Error::Api(s) if s.code == 410 => format!(
            "; the listing of {resource} took longer than the API server keeps its place in a \
             list: run the command again"
        ),
        kube::Error::Api(s) if s.code == 401 => {
            "; the credentials were refused: refresh them (log in again) or pick another \
             --context"
                .to_string()
        }
        other if is_timeout(other) => {
            "; the request timed out: raise --request-timeout (0 waits forever) or check that \
             the API server is reachable"
                .to_string()
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            "; check that the API server of the context is reachable (kubectl cluster-info), or \
             work offline with -f"
                .to_string()
        }
        _ => String::new(),
    }
}

fn is_timeout(e: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        let text = s.to_string().to_lowercase();
        if text.contains("timed out") || text.contains("timeout") {
            return true;
        }
        source = s.source();
    }
    false
}

/// kubectl's `--request-timeout`: `0` (no limit), a bare number of seconds,
/// or Go duration syntax (`500ms`, `30s`, `1m30s`, `1.5h`).
pub fn parse_request_timeout(s: &str) -> Result<Option<Duration>, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok((secs > 0).then(|| Duration::from_secs(secs)));
    }
    let invalid = || {
        format!(
            "invalid timeout {s:?}: use a number of seconds or a duration with units \
             (500ms, 30s, 2m, 1h; 0 for none)"
        )
    };
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += value * scale;
        rest = tail;
    }
    if !total.is_finite() || total > 1e9 {
        return Err(invalid());
    }
    Ok((total > 0.0).then(|| Duration::from_secs_f64(total)))
}

/// How to connect, as kubectl's flags say.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Limit on each request (connect, send, answer); `None` waits forever.
    pub request_timeout: Option<Duration>,
}

/// A client and the namespace kubectl would default to.
pub async fn connect(conn: &Connection) -> Result<(Client, String), OnlineError> {
    let options = KubeConfigOptions {
        context: conn.context.clone(),
        ..Default::default()
    };
    let config = match &conn.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| OnlineError::Kubeconfig(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| OnlineError::Kubeconfig(e.to_string()))?
        }
        None if conn.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| OnlineError::Kubeconfig(e.to_string()))?,
        None => Config::infer()
            .await
            .map_err(|e| OnlineError::Kubeconfig(e.to_string()))?,
    };
    let mut config = config;
    if let Some(t) = conn.request_timeout {
        config.connect_timeout = Some(t);
        config.read_timeout = Some(t);
        config.write_timeout = Some(t);
        // The limit counts from each request, not from when a pooled
        // connection went idle.
        config.reset_reader_on_write = true;
    }
    let namespace = config.default_namespace.clone();
    // rustls refuses to guess when feature unification (a workspace build,
    // `cargo test --workspace`) compiles in more than one crypto provider:
    // pick ring, as kube is configured. Err only means one is already set.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_from(config).map_err(OnlineError::Client)?;
    Ok((client, namespace))
}

/// Every object of `api` that `params` selects, page by page.
async fn list<K>(
    api: Api<K>,
    what: &'static str,
    params: &ListParams,
) -> Result<Vec<K>, OnlineError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    list_pages(
        what,
        params,
        |p| {
            let api = api.clone();
            async move { api.list(&p).await }
        },
        |item| out.push(item),
        &mut Progress::on_stderr(what),
    )
    .await?;
    Ok(out)
}

/// The ResourceSlices `params` selects, added to `inventory` a page at a
/// time (the typed page is dropped before the next is read).
async fn list_slices(
    client: &Client,
    params: &ListParams,
    inventory: &mut Inventory,
) -> Result<(), OnlineError> {
    let api = Api::<ResourceSlice>::all(client.clone());
    list_pages(
        "ResourceSlices",
        params,
        |p| {
            let api = api.clone();
            async move { api.list(&p).await }
        },
        |slice: ResourceSlice| inventory.add_slice(&slice),
        &mut Progress::on_stderr("ResourceSlices"),
    )
    .await
    .map(|_| ())
}

/// Which ResourceSlices a command reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceScope {
    /// Only the slices of this node, and those of no single node (which may
    /// hold devices of it).
    pub node: Option<String>,
    /// Only the slices of this driver.
    pub driver: Option<String>,
}

impl SliceScope {
    /// The field selectors to list with, one list each; `[None]`: everything.
    pub fn field_selectors(&self) -> Vec<Option<String>> {
        let driver = self.driver.as_deref().map(|d| format!("spec.driver={d}"));
        let with_driver = |node: String| match &driver {
            Some(d) => format!("{node},{d}"),
            None => node,
        };
        match &self.node {
            // A slice without nodeName (allNodes, nodeSelector, per-device
            // nodeName) selects as `spec.nodeName=`.
            Some(n) => vec![
                Some(with_driver(format!("spec.nodeName={n}"))),
                Some(with_driver("spec.nodeName=".to_string())),
            ],
            None => vec![driver],
        }
    }
}

/// The DeviceTaintRules, from the newest `resource.k8s.io` version the
/// server serves (`v1` from 1.37, `v1beta2` in 1.36, `v1alpha3` before).
/// None served (the feature is off), or not allowed to list them: none.
async fn taint_rules(client: &Client) -> Result<Vec<TaintRule>, OnlineError> {
    for version in ["v1", "v1beta2", "v1alpha3"] {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", version, "DeviceTaintRule");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "devicetaintrules");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match list(api, "DeviceTaintRules", &ListParams::default()).await {
            Ok(items) => {
                return Ok(items
                    .iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .filter_map(|v| TaintRule::from_value(&v))
                    .collect());
            }
            Err(OnlineError::List {
                source: kube::Error::Api(e),
                ..
            }) if e.code == 404 || e.code == 403 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Vec::new())
}

/// Everything cluster-wide that allocation depends on, plus the namespace's
/// templates and, when asked, one pod.
pub async fn fetch(
    client: &Client,
    namespace: &str,
    pod: Option<&str>,
) -> Result<Inventory, OnlineError> {
    fetch_in(client, Some(namespace), pod).await
}

/// As [`fetch`], for `-A`: the templates of every namespace, and every pod
/// called `pod` whatever its namespace.
pub async fn fetch_all_namespaces(
    client: &Client,
    pod: Option<&str>,
) -> Result<Inventory, OnlineError> {
    fetch_in(client, None, pod).await
}

async fn fetch_in(
    client: &Client,
    namespace: Option<&str>,
    pod: Option<&str>,
) -> Result<Inventory, OnlineError> {
    let templates = match namespace {
        Some(ns) => Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns),
        None => Api::<ResourceClaimTemplate>::all(client.clone()),
    };
    let all = ListParams::default();
    let mut inventory = Inventory::default();
    list_slices(client, &all, &mut inventory).await?;
    inventory.classes = list(
        Api::<DeviceClass>::all(client.clone()),
        "DeviceClasses",
        &all,
    )
    .await?;
    inventory.claims = list(
        Api::<ResourceClaim>::all(client.clone()),
        "ResourceClaims",
        &all,
    )
    .await?;
    inventory.nodes = list(Api::<Node>::all(client.clone()), "Nodes", &all).await?;
    inventory.templates = list(templates, "ResourceClaimTemplates", &all).await?;
    inventory.taint_rules = taint_rules(client).await?;
    if let (Some(name), None) = (pod, namespace) {
        let pods: Api<Pod> = Api::all(client.clone());
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        inventory.pods = list(pods, "Pods", &params).await?;
    } else if let (Some(name), Some(namespace)) = (pod, namespace) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        if let Some(p) = pods
            .get_opt(name)
            .await
            .map_err(|source| OnlineError::List {
                what: "Pods",
                source,
            })?
        {
            inventory.pods.push(p);
        }
    }
    Ok(inventory)
}

/// What `devices` reads: the slices of `scope`, every claim and the
/// DeviceTaintRules. With a node, when a pool of its slices looks
/// incomplete, every slice is read instead (its other slices may be
/// elsewhere, and whether they are decides what the table says).
pub async fn fetch_devices(client: &Client, scope: &SliceScope) -> Result<Inventory, OnlineError> {
    let mut inventory = Inventory::default();
    list_scope(client, scope, &mut inventory).await?;
    if scope.node.is_some() && !inventory.pools_complete() {
        inventory = Inventory::default();
        list_slices(client, &ListParams::default(), &mut inventory).await?;
    }
    let all = ListParams::default();
    inventory.claims = list(
        Api::<ResourceClaim>::all(client.clone()),
        "ResourceClaims",
        &all,
    )
    .await?;
    inventory.taint_rules = taint_rules(client).await?;
    Ok(inventory)
}

/// What `topology NODE` reads: as [`fetch_devices`] for the node, and its
/// Node object. A node that publishes nothing reads every slice, to name
/// the nodes that do.
pub async fn fetch_topology(client: &Client, node: &str) -> Result<Inventory, OnlineError> {
    let scope = SliceScope {
        node: Some(node.to_string()),
        driver: None,
    };
    let mut inventory = fetch_devices(client, &scope).await?;
    if crate::world::World::new(&inventory)
        .on_node(node)
        .is_empty()
    {
        inventory.slices.clear();
        list_slices(client, &ListParams::default(), &mut inventory).await?;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(n) = nodes
        .get_opt(node)
        .await
        .map_err(|source| OnlineError::List {
            what: "Nodes",
            source,
        })?
    {
        inventory.nodes.push(n);
    }
    Ok(inventory)
}

/// The slices of `scope`, in the order one list of all of them has (by name).
async fn list_scope(
    client: &Client,
    scope: &SliceScope,
    inventory: &mut Inventory,
) -> Result<(), OnlineError> {
    for selector in scope.field_selectors() {
        let params = match &selector {
            Some(s) => ListParams::default().fields(s),
            None => ListParams::default(),
        };
        list_slices(client, &params, inventory).await?;
    }
    inventory.slices.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(())
}

#[cfg(test)]
mod tests;
