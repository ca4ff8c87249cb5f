//! Reading the same objects from a live cluster, with kubectl's kubeconfig
//! rules (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, in-cluster;
//! `--context`; the context's namespace unless `-n`).

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::inventory::{Inventory, TaintRule};

#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("cannot reach the API server: {0}")]
    Client(#[source] kube::Error),
    #[error("listing {what}: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// How to connect, as kubectl's flags say.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
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
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(OnlineError::Client)?;
    Ok((client, namespace))
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Vec<K>, OnlineError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| OnlineError::List { what, source })
}

/// The DeviceTaintRules, from the newest `resource.k8s.io` version the
/// server serves (`v1` from 1.37, `v1beta2` in 1.36, `v1alpha3` before).
/// None served (the feature is off), or not allowed to list them: none.
async fn taint_rules(client: &Client) -> Result<Vec<TaintRule>, OnlineError> {
    for version in ["v1", "v1beta2", "v1alpha3"] {
        let gvk = GroupVersionKind::gvk("resource.k8s.io", version, "DeviceTaintRule");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "devicetaintrules");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                return Ok(list
                    .items
                    .iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .filter_map(|v| TaintRule::from_value(&v))
                    .collect());
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => continue,
            Err(source) => {
                return Err(OnlineError::List {
                    what: "DeviceTaintRules",
                    source,
                });
            }
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
    let mut inventory = Inventory {
        slices: list(Api::<ResourceSlice>::all(client.clone()), "ResourceSlices").await?,
        classes: list(Api::<DeviceClass>::all(client.clone()), "DeviceClasses").await?,
        claims: list(Api::<ResourceClaim>::all(client.clone()), "ResourceClaims").await?,
        nodes: list(
            Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()),
            "Nodes",
        )
        .await?,
        templates: list(
            Api::<ResourceClaimTemplate>::namespaced(client.clone(), namespace),
            "ResourceClaimTemplates",
        )
        .await?,
        taint_rules: taint_rules(client).await?,
        ..Default::default()
    };
    if let Some(name) = pod {
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
