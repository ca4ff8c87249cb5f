//! Helpers the scenarios share: polling with timeouts, applying examples,
//! reading pods, claims, slices, events and the probe's report.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

mod probe;
pub use probe::{ProbeReport, probe};

use crate::manifests;
use crate::testbed::{DriverKind, Testbed};

/// A wait at least this long is logged when it ends.
const SLOW_WAIT: Duration = Duration::from_secs(5);

/// Logs a wait for `what` that began at `started` if it took [`SLOW_WAIT`]
/// or more: the long waits say where a slow scenario's time went.
fn log_if_slow(started: Instant, what: &str) {
    let waited = started.elapsed();
    if waited >= SLOW_WAIT {
        eprintln!(
            "aws-dra-e2e: waited {:.1}s for {what}",
            waited.as_secs_f64()
        );
    }
}

/// Polls `f` every 250 ms until it yields a value or `timeout` passes; the
/// error names `what` and the testbed's log locations. A wait of
/// 5 s or more is logged with its duration.
pub async fn wait_for<T, F, Fut>(
    tb: &impl Testbed,
    what: &str,
    timeout: Duration,
    mut f: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => {
                log_if_slow(started, what);
                return Ok(v);
            }
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if started.elapsed() > timeout {
            return Err(anyhow!(
                "timed out after {timeout:?} waiting for {what}{}; {}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default(),
                tb.logs_hint()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates namespace `name` (fresh per scenario, so scenarios never see each
/// other's objects).
pub async fn namespace(tb: &impl Testbed, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(tb.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context(format!("creating namespace {name}")),
    }
    // Pods are refused until the controller manager has made the
    // namespace's default ServiceAccount (seen on 1.34: s29's first pod).
    let accounts: Api<ServiceAccount> = Api::namespaced(tb.client(), name);
    let what = format!("ServiceAccount {name}/default");
    wait_for(tb, &what, Duration::from_secs(60), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await
}

/// The Kubernetes Node name of the testbed node the scenarios call `node`.
pub fn node_name(tb: &impl Testbed, node: &str) -> String {
    tb.nodes()
        .into_iter()
        .find(|n| n.name == node)
        .map_or_else(|| node.to_string(), |n| n.node_name)
}

/// Reads an example file; pods are adapted to the testbed and, when `node` is
/// given, pinned to it with a nodeSelector (the scheduler still allocates).
pub fn example(tb: &impl Testbed, path: &Path, node: Option<&str>) -> Result<Vec<Value>> {
    let mut objs = manifests::read(path)?;
    for o in objs.iter_mut().filter(|o| o["kind"] == "Pod") {
        tb.adapt_pod(o);
        if let Some(node) = node {
            o["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node_name(tb, node)});
        }
    }
    Ok(objs)
}

/// Server-side applies every object into `ns`.
pub async fn apply_all(tb: &impl Testbed, ns: &str, objs: &[Value]) -> Result<()> {
    for o in objs {
        manifests::apply(&tb.client(), o, Some(ns))
            .await
            .with_context(|| format!("applying {}", manifests::id(o)))?;
    }
    Ok(())
}

/// A pod for `template` (a ResourceClaimTemplate name) or `claim` (a
/// ResourceClaim name), adapted to the testbed.
pub fn pod_with_claim(
    tb: &impl Testbed,
    name: &str,
    template: Option<&str>,
    claim: Option<&str>,
    node: Option<&str>,
) -> Value {
    let mut rc = json!({"name": "devices"});
    if let Some(t) = template {
        rc["resourceClaimTemplateName"] = json!(t);
    }
    if let Some(c) = claim {
        rc["resourceClaimName"] = json!(c);
    }
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [rc],
            "containers": [{"name": "app", "image": "probe", "resources": {"claims": [{"name": "devices"}]}}],
        },
    });
    tb.adapt_pod(&mut pod);
    if let Some(node) = node {
        pod["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node_name(tb, node)});
    }
    pod
}

/// The pod's first container: its id (`containerd://<id>`) and how often
/// kubelet restarted it; `None` before it has started.
pub fn first_container(p: &Pod) -> Option<(String, i32)> {
    let s = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
    Some((s.container_id.clone()?, s.restart_count))
}

pub async fn get_pod(tb: &impl Testbed, ns: &str, name: &str) -> Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    Ok(pods.get_opt(name).await?)
}

/// Events of `ns` about object `name`, as `reason: message` lines.
pub async fn events(tb: &impl Testbed, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
    let api: Api<Event> = Api::namespaced(tb.client(), ns);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// Waits for the pod to be Running; fails early when it failed, and the
/// timeout message carries its status and events. Once it runs, checks that
/// `kubectl dra explain` agrees ([`super::agreement::check_pod`]).
pub async fn running(tb: &impl Testbed, ns: &str, name: &str, timeout: Duration) -> Result<Pod> {
    let started = Instant::now();
    loop {
        let pod = get_pod(tb, ns, name).await?;
        if let Some(pod) = &pod {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if phase == "Running" {
                log_if_slow(started, &format!("pod {ns}/{name} Running"));
                super::agreement::check_pod(tb, ns, name).await?;
                return Ok(pod.clone());
            }
            if phase == "Failed" || phase == "Succeeded" {
                bail!(
                    "pod {ns}/{name} ended ({phase}): {:?}; events {:?}; {}",
                    pod.status,
                    events(tb, ns, name).await?,
                    tb.logs_hint()
                );
            }
        }
        if started.elapsed() > timeout {
            bail!(
                "pod {ns}/{name} not Running after {timeout:?}: status {:?}; events {:?}; {}",
                pod.and_then(|p| p.status),
                events(tb, ns, name).await.unwrap_or_default(),
                tb.logs_hint()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the pod is reported unschedulable, then checks that it stays
/// so for a while and that `kubectl dra explain` agrees; returns the
/// scheduler's `(reason, message)` and the explanation.
pub async fn stays_pending(
    tb: &impl Testbed,
    ns: &str,
    pod: &str,
) -> Result<(String, String, String)> {
    let cond = wait_for(
        tb,
        &format!("{ns}/{pod} reported unschedulable"),
        Duration::from_secs(60),
        || async { Ok(get_pod(tb, ns, pod).await?.as_ref().and_then(unschedulable)) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = get_pod(tb, ns, pod)
        .await?
        .ok_or_else(|| anyhow!("{pod} vanished"))?;
    ensure!(
        p.spec.as_ref().and_then(|s| s.node_name.clone()).is_none(),
        "{pod} was scheduled after all"
    );
    for c in pod_claims(tb, ns, pod).await.unwrap_or_default() {
        ensure!(allocation(&c).is_empty(), "claim of {pod} got allocated");
    }
    let explained = super::agreement::check_pod(tb, ns, pod).await?;
    Ok((cond.0, cond.1, explained))
}

/// Deletes pods and waits until they are gone.
pub async fn delete_pods(
    tb: &impl Testbed,
    ns: &str,
    names: &[&str],
    timeout: Duration,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    for n in names {
        match pods.delete(n, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context(format!("deleting pod {ns}/{n}")),
        }
    }
    for n in names {
        wait_for(tb, &format!("pod {ns}/{n} gone"), timeout, || async {
            Ok(get_pod(tb, ns, n).await?.is_none().then_some(()))
        })
        .await?;
    }
    Ok(())
}

/// Deletes every pod of `ns` and waits until they are gone.
pub async fn delete_all_pods(tb: &impl Testbed, ns: &str, timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    delete_pods(tb, ns, &refs, timeout).await
}

/// Deletes a namespace without waiting (its pods must already be gone).
pub async fn drop_namespace(tb: &impl Testbed, ns: &str) {
    let api: Api<Namespace> = Api::all(tb.client());
    let _ = api.delete(ns, &DeleteParams::default()).await;
}

/// One allocated device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocated {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

pub fn allocation(claim: &ResourceClaim) -> Vec<Allocated> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| {
            d.results
                .iter()
                .flatten()
                .map(|r| Allocated {
                    request: r.request.clone(),
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The ResourceClaims of a pod (template-generated or referenced).
pub async fn pod_claims(tb: &impl Testbed, ns: &str, pod: &str) -> Result<Vec<ResourceClaim>> {
    let p = get_pod(tb, ns, pod)
        .await?
        .ok_or_else(|| anyhow!("pod {ns}/{pod} not found"))?;
    let mut names = Vec::new();
    for rc in p
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default()
    {
        if let Some(n) = rc.resource_claim_name {
            names.push(n);
        } else if let Some(st) = p
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|v| v.iter().find(|s| s.name == rc.name))
            .and_then(|s| s.resource_claim_name.clone())
        {
            names.push(st);
        } else {
            bail!(
                "pod {ns}/{pod}: claim {} has no generated ResourceClaim yet",
                rc.name
            );
        }
    }
    let claims: Api<ResourceClaim> = Api::namespaced(tb.client(), ns);
    let mut out = Vec::new();
    for n in names {
        out.push(
            claims
                .get(&n)
                .await
                .with_context(|| format!("reading claim {ns}/{n}"))?,
        );
    }
    Ok(out)
}

/// Every allocated device of the pod's claims.
pub async fn pod_devices(tb: &impl Testbed, ns: &str, pod: &str) -> Result<Vec<Allocated>> {
    let mut all = Vec::new();
    for c in pod_claims(tb, ns, pod).await? {
        let a = allocation(&c);
        if a.is_empty() {
            bail!(
                "claim {ns}/{} of pod {pod} is not allocated",
                c.metadata.name.unwrap_or_default()
            );
        }
        all.extend(a);
    }
    all.sort();
    Ok(all)
}

/// The slices of `driver` on `node`.
pub async fn slices(tb: &impl Testbed, node: &str, kind: DriverKind) -> Result<Vec<ResourceSlice>> {
    let api: Api<ResourceSlice> = Api::all(tb.client());
    let node = node_name(tb, node);
    let list = api
        .list(&ListParams::default().fields(&format!(
            "spec.nodeName={node},spec.driver={}",
            kind.driver_name()
        )))
        .await?;
    Ok(list.items)
}

/// Published devices of `driver` on `node`, by name.
pub async fn devices(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
) -> Result<BTreeMap<String, Device>> {
    Ok(slices(tb, node, kind)
        .await?
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| (d.name.clone(), d))
        .collect())
}

/// A string attribute of a device (`name` with domain for foreign ones).
pub fn attr_str(d: &Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}

pub fn attr_int(d: &Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

/// Looks up an allocated device's published attributes.
pub async fn published(tb: &impl Testbed, a: &Allocated) -> Result<Device> {
    let kind = DriverKind::ALL
        .into_iter()
        .find(|k| k.driver_name() == a.driver)
        .ok_or_else(|| anyhow!("unknown driver {}", a.driver))?;
    devices(tb, &a.pool, kind)
        .await?
        .remove(&a.device)
        .ok_or_else(|| anyhow!("{} {} not published on {}", a.driver, a.device, a.pool))
}

/// The pod's PodScheduled=False condition `(reason, message)`, if any.
pub fn unschedulable(pod: &Pod) -> Option<(String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The value of an unlabelled sample, or of the sample with exactly these
/// labels as written (`state="unhealthy"`), in Prometheus text.
pub fn gauge(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let head = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&head))
        .and_then(|v| v.trim().parse().ok())
}

/// The EFA driver's node-side gauges on `node`: prepared claims, prepared
/// devices and published devices as expected, and no unhealthy device.
/// Polled for a while: kubelet may unprepare after the pod object is gone.
pub async fn efa_gauges(
    tb: &impl Testbed,
    node: &str,
    (claims, devices, published): (usize, usize, usize),
) -> Result<()> {
    let want = (
        Some(claims as f64),
        Some(devices as f64),
        Some(published as f64),
        Some(0.0),
    );
    let started = Instant::now();
    loop {
        let metrics = tb.driver_metrics(node, DriverKind::Efa).await?;
        let g = |name: &str, labels: &str| gauge(&metrics, name, labels);
        let seen = (
            g("aws_dra_checkpoint_claims", ""),
            g("aws_dra_checkpoint_devices", ""),
            g("aws_dra_publish_pool_devices", ""),
            g("aws_dra_efa_devices_by_health", "state=\"unhealthy\""),
        );
        if seen == want {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "EFA driver on {node}: (prepared claims, prepared devices, published, unhealthy) = {seen:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "    EFA driver on {node}: prepared claims {claims}, prepared devices {devices}, published {published}, unhealthy 0"
    );
    Ok(())
}

/// The EFA's index N of `uverbsN` from its device name (`efa-DDDD-BB-DD-F`)
/// via the fixture description.
pub fn efa_uverbs(fixture: &sysfs_fixtures::Fixture, device: &str) -> Option<u32> {
    let bdf = efa_bdf(device)?;
    fixture.efa(&bdf).map(|e| e.uverbs)
}

/// `efa-0000-4f-00-0` → `0000:4f:00.0`.
pub fn efa_bdf(device: &str) -> Option<String> {
    let rest = device.strip_prefix("efa-")?;
    let parts: Vec<&str> = rest.split('-').collect();
    match parts.as_slice() {
        [d, b, s, f] => Some(format!("{d}:{b}:{s}.{f}")),
        _ => None,
    }
}

/// `neurondeviceN` → N.
pub fn neuron_index(device: &str) -> Option<u32> {
    device.strip_prefix("neurondevice")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn probe_reports_parse() {
        let log = "noise\nprobe-begin\ndev /dev/null char 1:3\ndev /dev/infiniband/uverbs3 char 231:195\nenv A=b=c\nenv PATH=/bin\nprobe-end\n";
        let r = ProbeReport::parse(log).unwrap();
        assert_eq!(r.devices["/dev/infiniband/uverbs3"], "char 231:195");
        assert_eq!(r.env["A"], "b=c");
        assert_eq!(
            r.devices_with_prefix("/dev/infiniband/"),
            BTreeSet::from(["/dev/infiniband/uverbs3".to_string()])
        );
        assert_eq!(
            ProbeReport::parse("probe-begin\ndev x char 1:1\n"),
            None,
            "incomplete report"
        );
    }

    #[test]
    fn gauges_are_read_by_name_and_labels() {
        let text = "# HELP aws_dra_checkpoint_claims x\naws_dra_checkpoint_claims 2\naws_dra_checkpoint_claims_other 9\naws_dra_efa_devices_by_health{state=\"healthy\"} 31\naws_dra_efa_devices_by_health{state=\"unhealthy\"} 1\n";
        assert_eq!(gauge(text, "aws_dra_checkpoint_claims", ""), Some(2.0));
        assert_eq!(
            gauge(text, "aws_dra_efa_devices_by_health", "state=\"unhealthy\""),
            Some(1.0)
        );
        assert_eq!(gauge(text, "aws_dra_checkpoint_devices", ""), None);
    }

    #[test]
    fn device_names_map_back_to_hardware() {
        assert_eq!(efa_bdf("efa-0000-4f-00-0").as_deref(), Some("0000:4f:00.0"));
        assert_eq!(efa_bdf("gpu-0"), None);
        assert_eq!(neuron_index("neurondevice12"), Some(12));
        assert_eq!(neuron_index("neurondevicex"), None);
    }
}
