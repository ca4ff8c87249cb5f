//! One benchmark round: a claim for one device of a driver's class, a pod
//! using it on the node, timed from the API (scheduled → running) and from
//! kubelet (its `dra_grpc_operations_duration_seconds` histogram, read
//! before and after, so the difference of `_sum` is the exact duration of
//! the round's one call).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::json;

use super::measure::{histogram_totals, label};
use local_cluster::error::{Error, Result};
use local_cluster::toolchain::PAUSE_IMAGE;

/// The namespace the rounds run in.
pub const NAMESPACE: &str = "bench";
const HISTOGRAM: &str = "dra_grpc_operations_duration_seconds";
const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

/// What one round measured.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Round {
    pub driver: String,
    pub index: usize,
    /// Kubelet's NodePrepareResources calls in the round and their total seconds.
    pub prepare_calls: u64,
    pub prepare_s: f64,
    pub unprepare_calls: u64,
    pub unprepare_s: f64,
    /// Pod observed scheduled (`spec.nodeName` set) → observed `Running`, seconds.
    pub scheduled_to_running_s: f64,
}

/// Kubelet's `/metrics` of `node`, through the API server's node proxy.
pub async fn kubelet_metrics(client: &kube::Client, node: &str) -> Result<String> {
    let mut req = http::Request::new(Vec::new());
    *req.uri_mut() = http::Uri::try_from(format!("/api/v1/nodes/{node}/proxy/metrics"))
        .map_err(|e| Error::Testbed(format!("metrics uri: {e}")))?;
    client
        .request_text(req)
        .await
        .map_err(|source| Error::Kube {
            action: format!("reading kubelet metrics of {node}"),
            source,
        })
}

/// `(seconds, calls)` of `driver`'s `method` (`NodePrepareResources`) in kubelet's histogram.
pub fn grpc_totals(metrics: &str, driver: &str, method: &str) -> (f64, u64) {
    let suffix = format!("/{method}");
    histogram_totals(metrics, HISTOGRAM, |l| {
        label(l, "driver_name") == Some(driver)
            && label(l, "method_name").is_some_and(|m| m.ends_with(&suffix))
    })
}

pub(super) fn kube_err(action: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, v: serde_json::Value) -> Result<T> {
    serde_json::from_value(v).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

/// Creates the namespace the rounds and bursts run in.
pub(super) async fn create_namespace(client: &kube::Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = from_json("namespace", json!({"metadata": {"name": NAMESPACE}}))?;
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .map_err(kube_err("creating the bench namespace".into()))?;
    Ok(())
}

/// Claim `name`: one device of `class`, with a CEL `selector` if any.
pub(super) fn claim(name: &str, class: &str, selector: Option<&str>) -> Result<ResourceClaim> {
    let mut exactly = json!({"deviceClassName": class});
    if let Some(cel) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": cel}}]);
    }
    from_json(
        "claim",
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}},
        }),
    )
}

/// Pod `name` on `node` (pause container, host network) using claim
/// `name`, with `labels`.
pub(super) fn pod(name: &str, node: &str, labels: serde_json::Value) -> Result<Pod> {
    from_json(
        "pod",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "hostNetwork": true,
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
                "containers": [{
                    "name": "c", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "dev"}]},
                }],
            },
        }),
    )
}

/// Runs one round of `driver` (device class `class`) on `node`.
pub async fn run_round(
    client: &kube::Client,
    node: &str,
    driver: &str,
    class: &str,
    short: &str,
    index: usize,
) -> Result<Round> {
    let name = format!("{short}-{index}");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let before = kubelet_metrics(client, node).await?;
    claims
        .create(&PostParams::default(), &claim(&name, class, None)?)
        .await
        .map_err(kube_err(format!("creating claim {name}")))?;
    let pod = pod(&name, node, json!({}))?;
    // Watch before creating, so no transition is missed.
    let events = watcher::watch_object(pods.clone(), &name);
    let mut events = std::pin::pin!(events);
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .map_err(kube_err(format!("creating pod {name}")))?;
    let uid = created.metadata.uid.unwrap_or_default();
    let (mut scheduled, mut running) = (None, None);
    let deadline = Instant::now() + ROUND_TIMEOUT;
    while running.is_none() {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        let Ok(Some(event)) = next else {
            return Err(Error::Testbed(format!(
                "pod {NAMESPACE}/{name} ({driver}) not running within {ROUND_TIMEOUT:?}"
            )));
        };
        let Ok(Some(p)) = event else { continue };
        let now = Instant::now();
        if scheduled.is_none() && p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
            scheduled = Some(now);
        }
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            running = Some(now);
        }
    }
    let scheduled_to_running_s = match (scheduled, running) {
        (Some(s), Some(r)) => r.duration_since(s).as_secs_f64(),
        _ => 0.0,
    };
    let prepared = kubelet_metrics(client, node).await?;
    pods.delete(&name, &DeleteParams::default())
        .await
        .map_err(kube_err(format!("deleting pod {name}")))?;
    tokio::time::timeout(
        ROUND_TIMEOUT,
        await_condition(pods.clone(), &name, conditions::is_deleted(&uid)),
    )
    .await
    .map_err(|_| Error::Testbed(format!("pod {name} not gone within {ROUND_TIMEOUT:?}")))?
    .map_err(|e| Error::Testbed(format!("waiting for pod {name} to go: {e}")))?;
    // Kubelet unprepares when the pod is terminated; wait for its call.
    let (un0_s, un0_n) = grpc_totals(&before, driver, "NodeUnprepareResources");
    let mut after = kubelet_metrics(client, node).await?;
    while grpc_totals(&after, driver, "NodeUnprepareResources").1 == un0_n {
        if Instant::now() > deadline {
            return Err(Error::Testbed(format!(
                "kubelet did not unprepare {name} ({driver})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        after = kubelet_metrics(client, node).await?;
    }
    claims
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(kube_err(format!("deleting claim {name}")))?;
    let (p0_s, p0_n) = grpc_totals(&before, driver, "NodePrepareResources");
    let (p1_s, p1_n) = grpc_totals(&prepared, driver, "NodePrepareResources");
    let (un1_s, un1_n) = grpc_totals(&after, driver, "NodeUnprepareResources");
    Ok(Round {
        driver: driver.to_string(),
        index,
        prepare_calls: p1_n - p0_n,
        prepare_s: p1_s - p0_s,
        unprepare_calls: un1_n - un0_n,
        unprepare_s: un1_s - un0_s,
        scheduled_to_running_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_per_driver_and_method() {
        let text = "dra_grpc_operations_duration_seconds_sum{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\"} 0.25\n\
            dra_grpc_operations_duration_seconds_count{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\"} 2\n\
            dra_grpc_operations_duration_seconds_count{driver_name=\"d\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources\"} 5\n";
        assert_eq!(grpc_totals(text, "d", "NodePrepareResources"), (0.25, 2));
        assert_eq!(grpc_totals(text, "d", "NodeUnprepareResources"), (0.0, 5));
        assert_eq!(grpc_totals(text, "e", "NodePrepareResources"), (0.0, 0));
    }
}
