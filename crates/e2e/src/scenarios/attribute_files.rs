//! Scenario 30: device attributes files (KEP-5304's device metadata), as
//! `examples/attributes-files/neuron-efa-pairing.yaml` uses them: 4 Neuron
//! chips and the 4 EFAs of their `devicegroup4_id` in one claim on trn2.
//!
//! The probe replaces the example's command, so the pairing is checked here
//! from what the node and the container hold: while the pod runs, each
//! driver has one file per request under the node's attributes directory
//! (`<driver>-<claimUID>-<request>.json`) whose devices are the claim's
//! allocation for that request, each with exactly the attributes its
//! ResourceSlice publishes (so each chip's `devicegroup1_id` names one of the
//! claim's EFAs); the claim's CDI spec mounts the file read-only at the
//! in-container path of a template's claim; and the container sees the same
//! bytes there (the probe prints the size and SHA-256 of every file under
//! the attributes directory). Once the pod and its claim are gone, so are
//! the files and the specs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::allocate::{GONE, RUNNING};
use super::kit::{self, Allocated};
use super::lifecycle::{uid, wait_unprepared};
use crate::host_env::examples_dir;
use crate::testbed::{DriverKind, NodeDir, Testbed};

const NODE: &str = "trn2";
const POD: &str = "neuron-efa-pairing";
/// The pod's name for its claim (`spec.resourceClaims[].name`).
const POD_CLAIM: &str = "neuron-efa";
const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
const GROUP1: &str = "resource.aws.com/devicegroup1_id";
/// The versions of the stream, newest first.
const VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];

/// Scenario 30.
pub async fn device_attribute_files(tb: &impl Testbed, ns: &str) -> Result<()> {
    let path = examples_dir().join("attributes-files/neuron-efa-pairing.yaml");
    let objs = kit::example(tb, &path, Some(NODE))?;
    kit::apply_all(tb, ns, &objs).await?;
    kit::running(tb, ns, POD, RUNNING).await?;
    let claims = kit::pod_claims(tb, ns, POD).await?;
    let [claim] = claims.as_slice() else {
        return Err(anyhow!("{POD} has {} claims, expected 1", claims.len()));
    };
    let claim_uid = uid(claim);
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let allocated = kit::allocation(claim);

    // Per driver and request: the host file's bytes, and the group-1 ids of
    // its devices.
    let mut files = BTreeMap::new();
    let mut groups: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (kind, request) in [(DriverKind::Neuron, "neurons"), (DriverKind::Efa, "efas")] {
        let driver = kind.driver_name();
        let expected: Vec<&Allocated> = allocated
            .iter()
            .filter(|a| a.driver == driver && a.request == request)
            .collect();
        ensure!(
            expected.len() == 4,
            "claim {claim_name}: {} devices of {driver} for {request}, expected 4: {allocated:?}",
            expected.len()
        );
        let name = format!("{driver}-{claim_uid}-{request}.json");
        let bytes = tb
            .node_dir_file(NODE, NodeDir::DeviceAttributes, &name)?
            .ok_or_else(|| {
                anyhow!(
                    "no attributes file {name} on {NODE} while {POD} runs; {}",
                    tb.logs_hint()
                )
            })?;
        let devices = check_stream(&bytes, &name, ns, &claim_name, &claim_uid, request)?;
        let mut listed = BTreeSet::new();
        for d in &devices {
            let (pool, device) = (str_of(d, "pool"), str_of(d, "name"));
            ensure!(str_of(d, "driver") == driver, "{name}: {d}");
            let a = expected
                .iter()
                .find(|a| a.pool == pool && a.device == device)
                .ok_or_else(|| {
                    anyhow!("{name} lists {pool}/{device}, not allocated for {request}")
                })?;
            let published = serde_json::to_value(kit::published(tb, a).await?.attributes)?;
            ensure!(
                d["attributes"] == published,
                "{name}: the attributes of {device} differ from its ResourceSlice's\n \
                 file: {}\n slice: {published}",
                d["attributes"]
            );
            let group = published[GROUP1]["string"]
                .as_str()
                .ok_or_else(|| anyhow!("{driver} {device} publishes no {GROUP1}"))?;
            groups.entry(request).or_default().insert(group.to_owned());
            listed.insert(device);
        }
        ensure!(
            listed.len() == expected.len() && devices.len() == expected.len(),
            "{name} lists {listed:?}, allocated {expected:?}"
        );
        check_cdi_mount(tb, kind, &claim_uid, request, &name)?;
        let in_container = format!(
            "{CONTAINER_DIR}/resourceclaimtemplates/{POD_CLAIM}/{request}/{driver}-metadata.json"
        );
        files.insert(in_container, digest(&bytes));
    }
    // The files alone pair every chip with one of the claim's EFAs.
    ensure!(
        groups.get("neurons") == groups.get("efas"),
        "the chips' {GROUP1} values {:?} are not the EFAs' {:?}",
        groups.get("neurons"),
        groups.get("efas")
    );

    let seen = container_files(tb, ns).await?;
    ensure!(
        seen == files,
        "the container of {POD} sees {seen:?} under {CONTAINER_DIR}, the node holds {files:?}"
    );

    kit::delete_pods(tb, ns, &[POD], GONE).await?;
    for kind in [DriverKind::Neuron, DriverKind::Efa] {
        wait_unprepared(tb, NODE, kind, &claim_uid).await?;
    }
    let left: Vec<String> = tb
        .node_dir_files(NODE, NodeDir::DeviceAttributes)?
        .into_iter()
        .filter(|f| f.contains(&claim_uid))
        .collect();
    ensure!(
        left.is_empty(),
        "attributes files of claim {claim_uid} left after unprepare: {left:?}"
    );
    Ok(())
}

/// Checks the `DeviceMetadata` stream of a file: one object per version,
/// newest first, the same apart from `apiVersion`, naming the claim, the
/// pod's claim name and `request`; returns its devices.
fn check_stream(
    bytes: &[u8],
    name: &str,
    ns: &str,
    claim: &str,
    claim_uid: &str,
    request: &str,
) -> Result<Vec<Value>> {
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(bytes)
        .into_iter()
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {name}"))?;
    let versions: Vec<&str> = docs.iter().map(|d| str_of(d, "apiVersion")).collect();
    ensure!(versions == VERSIONS, "{name}: versions {versions:?}");
    let strip = |d: &Value| {
        let mut d = d.clone();
        d.as_object_mut().map(|o| o.remove("apiVersion"));
        d
    };
    ensure!(
        strip(&docs[0]) == strip(&docs[1]),
        "{name}: the versions differ"
    );
    let doc = &docs[0];
    let meta = &doc["metadata"];
    ensure!(
        str_of(doc, "kind") == "DeviceMetadata"
            && str_of(meta, "name") == claim
            && str_of(meta, "namespace") == ns
            && str_of(meta, "uid") == claim_uid
            && str_of(doc, "podClaimName") == POD_CLAIM,
        "{name}: names another claim: {doc}"
    );
    let requests = doc["requests"].as_array().cloned().unwrap_or_default();
    let [only] = requests.as_slice() else {
        return Err(anyhow!("{name}: {} requests, expected 1", requests.len()));
    };
    ensure!(str_of(only, "name") == request, "{name}: request {only}");
    Ok(only["devices"].as_array().cloned().unwrap_or_default())
}

/// Checks that the claim's CDI spec of `kind` on the node mounts file
/// `name` read-only at the in-container path of `request`, as device
/// `<claimUID>_<request>`.
fn check_cdi_mount(
    tb: &impl Testbed,
    kind: DriverKind,
    claim_uid: &str,
    request: &str,
    name: &str,
) -> Result<()> {
    let driver = kind.driver_name();
    let prefix = format!("k8s.{driver}-");
    let spec_name = tb
        .node_dir_files(NODE, NodeDir::Cdi)?
        .into_iter()
        .find(|f| f.starts_with(&prefix) && f.contains(claim_uid))
        .ok_or_else(|| anyhow!("no CDI spec of {driver} for claim {claim_uid} on {NODE}"))?;
    let bytes = tb
        .node_dir_file(NODE, NodeDir::Cdi, &spec_name)?
        .ok_or_else(|| anyhow!("CDI spec {spec_name} vanished"))?;
    let spec: Value =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {spec_name}"))?;
    let device = format!("{claim_uid}_{request}");
    let mounts = spec["devices"]
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["name"] == device.as_str()))
        .map(|d| d["containerEdits"]["mounts"].clone())
        .ok_or_else(|| anyhow!("{spec_name} has no device {device}: {spec}"))?;
    let container_path = format!(
        "{CONTAINER_DIR}/resourceclaimtemplates/{POD_CLAIM}/{request}/{driver}-metadata.json"
    );
    let mounted = mounts.as_array().into_iter().flatten().any(|m| {
        str_of(m, "hostPath").ends_with(&format!("/dra-device-attributes/{name}"))
            && str_of(m, "containerPath") == container_path
            && m["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == "ro"))
    });
    ensure!(
        mounted,
        "{spec_name}: device {device} does not mount {name} read-only at {container_path}: {mounts}"
    );
    Ok(())
}

/// `path → (size, SHA-256)` of the files the probe found under the
/// attributes directory of its container.
async fn container_files(tb: &impl Testbed, ns: &str) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    kit::wait_for(
        tb,
        &format!("probe report of {ns}/{POD}"),
        Duration::from_secs(60),
        || async {
            let log = pods.logs(POD, &LogParams::default()).await?;
            if !log.contains("probe-end") {
                return Ok(None);
            }
            Ok(Some(
                log.lines()
                    .filter_map(|l| l.strip_prefix("file "))
                    .filter_map(|l| {
                        let mut parts = l.split(' ');
                        let path = parts.next()?;
                        let size = parts.next()?;
                        let sha = parts.next()?;
                        Some((path.to_owned(), format!("{size} {sha}")))
                    })
                    .collect(),
            ))
        },
    )
    .await
}

/// `<size> <sha256 hex>`, as the probe prints a file.
fn digest(bytes: &[u8]) -> String {
    format!("{} {}", bytes.len(), hex::encode(Sha256::digest(bytes)))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}
