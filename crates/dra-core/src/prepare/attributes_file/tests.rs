use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceAttribute, DeviceRequestAllocationResult,
    ResourceClaim, ResourceClaimStatus,
};

use super::*;
use crate::prepare::atomic::commit;
use crate::prepare::cdi::CdiWriter;
use crate::prepare::claims::InMemoryClaimSource;
use crate::prepare::config::InvalidValue;
use crate::prepare::driver::{
    AllocatedDevice, ContainerEdits, DeviceEdits, DeviceNode, Driver, DriverError,
};
use crate::prepare::metrics::PluginMetrics;
use crate::prepare::state::{ClaimPipeline, PipelineConfig};

const DRIVER: &str = "neuron.aws.com";
const UID: &str = "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c11";

fn files(dir: &Path) -> AttributeFiles {
    AttributeFiles {
        host_dir: Some(dir.to_path_buf()),
        source: Some(AttributeSource::new(|device| {
            let index: i64 = device.strip_prefix("neurondevice")?.parse().ok()?;
            Some(BTreeMap::from([
                (
                    "deviceId".to_string(),
                    DeviceAttribute {
                        int: Some(index),
                        ..Default::default()
                    },
                ),
                (
                    "resource.aws.com/devicegroup4_id".to_string(),
                    DeviceAttribute {
                        string: Some(format!("g{}", index / 4)),
                        ..Default::default()
                    },
                ),
            ]))
        })),
        ..Default::default()
    }
    .for_driver(DRIVER, Path::new("/var/run/cdi"))
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "train-0-chips-x7k2p".into(),
        uid: uid.into(),
    }
}

fn prepared(device: &str, requests: &[&str]) -> PreparedDevice {
    PreparedDevice {
        request_names: requests.iter().map(|r| r.to_string()).collect(),
        pool: "node-a".into(),
        device: device.into(),
        admin_access: false,
        cdi_device_ids: vec![format!("k8s.{DRIVER}/neuron={UID}-{device}")],
        share_ids: Vec::new(),
    }
}

/// A claim with `results` (`(request, device)`) of our driver, made from a
/// template when `pod_claim` is given.
fn claim_object(pod_claim: Option<&str>, results: &[(&str, &str)]) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.name = Some("train-0-chips-x7k2p".into());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(UID.into());
    if let Some(name) = pod_claim {
        c.metadata.annotations = Some(BTreeMap::from([(
            "resource.kubernetes.io/pod-claim-name".to_string(),
            name.to_string(),
        )]));
    }
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(|(request, device)| DeviceRequestAllocationResult {
                            request: request.to_string(),
                            driver: DRIVER.into(),
                            pool: "node-a".into(),
                            device: device.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

/// Every JSON object of a file's stream.
fn stream(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::Deserializer::from_str(&text)
        .into_iter::<serde_json::Value>()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn paths_follow_the_device_metadata_layout() {
    let f = files(Path::new("/var/run/dra-device-attributes"));
    assert_eq!(
        f.host_path(UID, "chips"),
        Path::new(&format!(
            "/var/run/dra-device-attributes/neuron.aws.com-{UID}-chips.json"
        ))
    );
    let cases = [
        (
            None,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared/chips/neuron.aws.com-metadata.json",
        ),
        (
            Some(""),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared/chips/neuron.aws.com-metadata.json",
        ),
        (
            Some("accel"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/accel/chips/neuron.aws.com-metadata.json",
        ),
    ];
    for (pod_claim, want) in cases {
        assert_eq!(
            f.container_path("shared", pod_claim, "chips"),
            want,
            "{pod_claim:?}"
        );
    }
}

#[test]
fn one_file_per_request_with_every_version_and_the_published_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let devices = [
        prepared("neurondevice4", &["chips"]),
        prepared("neurondevice5", &["chips"]),
        prepared("efa-0000-10-1c-0", &["nic"]),
    ];
    let object = claim_object(
        Some("accel"),
        &[
            ("chips/trn2", "neurondevice4"),
            ("chips/trn2", "neurondevice5"),
            ("nic", "efa-0000-10-1c-0"),
        ],
    );
    let staged = f.stage(&claim_ref(UID), Some(&object), &devices).unwrap();
    let (mounts, staged): (Vec<_>, Vec<_>) = staged.into_iter().unzip();
    assert_eq!(
        mounts
            .iter()
            .map(|m| m.request.as_str())
            .collect::<Vec<_>>(),
        ["chips", "nic"]
    );
    assert!(!mounts[0].host_path.exists(), "in place before the commit");
    commit(staged).unwrap();

    let objects = stream(&mounts[0].host_path);
    let versions: Vec<&str> = objects
        .iter()
        .map(|o| o["apiVersion"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1"
        ]
    );
    let want = serde_json::json!({
        "kind": "DeviceMetadata",
        "apiVersion": "metadata.resource.k8s.io/v1beta1",
        "metadata": {"name": "train-0-chips-x7k2p", "namespace": "ns", "uid": UID, "generation": 1},
        "podClaimName": "accel",
        "requests": [{
            "name": "chips/trn2",
            "devices": [
                {"driver": DRIVER, "pool": "node-a", "name": "neurondevice4",
                 "attributes": {"deviceId": {"int": 4}, "resource.aws.com/devicegroup4_id": {"string": "g1"}}},
                {"driver": DRIVER, "pool": "node-a", "name": "neurondevice5",
                 "attributes": {"deviceId": {"int": 5}, "resource.aws.com/devicegroup4_id": {"string": "g1"}}},
            ],
        }],
    });
    assert_eq!(objects[0], want);
    let mut older = want.clone();
    older["apiVersion"] = "metadata.resource.k8s.io/v1alpha1".into();
    assert_eq!(objects[1], older);

    // A device the pool no longer lists has no attributes; no subrequest.
    let nic = &stream(&mounts[1].host_path)[0];
    assert_eq!(nic["requests"][0]["name"], "nic");
    assert_eq!(
        nic["requests"][0]["devices"][0],
        serde_json::json!({"driver": DRIVER, "pool": "node-a", "name": "efa-0000-10-1c-0"})
    );
    assert_eq!(
        mounts[1].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/accel/nic/neuron.aws.com-metadata.json"
    );
}

#[test]
fn off_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = files(dir.path());
    f.enabled = false;
    let staged = f
        .stage(&claim_ref(UID), None, &[prepared("neurondevice0", &["r"])])
        .unwrap();
    assert!(staged.is_empty());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Writes an (empty) file named as a claim's file would be.
fn touch(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, "{}").unwrap();
    path
}

const UID_A: &str = "0b7c6a58-2f3e-4f7e-9d55-00000000000a";
const UID_B: &str = "0b7c6a58-2f3e-4f7e-9d55-00000000000b";
const UID_C: &str = "0b7c6a58-2f3e-4f7e-9d55-00000000000c";

#[test]
fn unprepare_and_the_start_sweep_remove_only_what_is_no_longer_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let (a, b, c) = (UID_A, UID_B, UID_C);
    let a1 = touch(dir.path(), &format!("{DRIVER}-{a}-r1.json"));
    let a2 = touch(dir.path(), &format!("{DRIVER}-{a}-r2.json"));
    let b1 = touch(dir.path(), &format!("{DRIVER}-{b}-r1.json"));
    let c1 = touch(dir.path(), &format!("{DRIVER}-{c}-r1.json"));
    // Another driver's file of the same claim, and names that only start
    // like ours: not a UID, a UID followed by more, not a request name.
    let other = touch(dir.path(), &format!("efa.networking.k8s.aws-{a}-r1.json"));
    let not_ours = [
        touch(dir.path(), &format!("{DRIVER}-uid-a-r1.json")),
        touch(dir.path(), &format!("{DRIVER}-{a}x-r1.json")),
        touch(dir.path(), &format!("{DRIVER}-{a}-R1.json")),
        touch(dir.path(), &format!("{DRIVER}-{a}-.json")),
        touch(dir.path(), &format!("{DRIVER}-{a}-r1.json.bak")),
    ];

    f.remove_claim(a).unwrap();
    assert!(!a1.exists() && !a2.exists());
    assert!(b1.exists() && other.exists());
    f.remove_claim(a).unwrap();

    let held = BTreeMap::from([(
        b.to_string(),
        PreparedClaim {
            namespace: "ns".into(),
            name: "b".into(),
            devices: Vec::new(),
            cdi_spec_path: PathBuf::new(),
        },
    )]);
    assert_eq!(f.remove_stale(&held).unwrap(), std::slice::from_ref(&c1));
    assert!(b1.exists() && other.exists() && !c1.exists());
    for path in &not_ours {
        assert!(path.exists(), "{} is not ours to remove", path.display());
    }

    let missing = files(&dir.path().join("never-made"));
    assert!(missing.remove_stale(&held).unwrap().is_empty());
    missing.remove_claim(a).unwrap();
}

/// Two instances under driver names `d` and `d-canary` (the chart documents
/// renaming one) sharing the directory: each one's unprepare, start sweep
/// and temp-file sweep leave the other's files.
#[test]
fn a_driver_named_ours_plus_a_suffix_keeps_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = files(dir.path());
    let canary = AttributeFiles {
        host_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    }
    .for_driver(&format!("{DRIVER}-canary"), Path::new("/var/run/cdi"));
    // The same claim has devices of both; each has one claim of its own.
    let d_files = [
        touch(dir.path(), &format!("{DRIVER}-{UID_A}-r.json")),
        touch(dir.path(), &format!("{DRIVER}-{UID_B}-r.json")),
    ];
    let canary_files = [
        touch(dir.path(), &format!("{DRIVER}-canary-{UID_A}-r.json")),
        touch(dir.path(), &format!("{DRIVER}-canary-{UID_C}-r.json")),
    ];
    // Temp files of both, as a killed writer leaves them, an hour old.
    let abandoned = |name: &str| {
        let path = touch(dir.path(), &format!(".{name}.tmp-41-0"));
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        path
    };
    let d_temp = abandoned(&format!("{DRIVER}-{UID_B}-r.json"));
    let canary_temp = abandoned(&format!("{DRIVER}-canary-{UID_C}-r.json"));

    d.remove_claim(UID_A).unwrap();
    assert!(!d_files[0].exists());
    assert!(
        canary_files[0].exists(),
        "the canary's file of the same claim"
    );
    assert_eq!(
        d.remove_stale(&BTreeMap::new()).unwrap(),
        [d_files[1].clone()]
    );
    assert_eq!(d.remove_abandoned().unwrap(), [d_temp]);
    assert!(canary_files.iter().all(|p| p.exists()) && canary_temp.exists());

    let d_again = touch(dir.path(), &format!("{DRIVER}-{UID_C}-r.json"));
    canary.remove_claim(UID_C).unwrap();
    assert!(!canary_files[1].exists() && d_again.exists());
    assert_eq!(
        canary.remove_stale(&BTreeMap::new()).unwrap(),
        [canary_files[0].clone()]
    );
    assert_eq!(canary.remove_abandoned().unwrap(), [canary_temp]);
    assert!(d_again.exists(), "the canary's sweep left d's file");
}

/// `resource.kubernetes.io/pod-claim-name` can be set by whoever writes the
/// claim: only a DNS label (what a pod's claim names are) becomes a path
/// component; anything else falls back to `resourceclaims/<claim name>`.
#[test]
fn a_pod_claim_name_that_is_not_a_dns_label_is_not_a_path() {
    let f = files(Path::new("/var/run/dra-device-attributes"));
    let by_claim = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared/chips/neuron.aws.com-metadata.json";
    let long = "a".repeat(64);
    for bad in [
        "../x",
        "a/b",
        long.as_str(),
        "Accel",
        "-a",
        "a-",
        ".",
        "a.b",
        "a b",
    ] {
        assert_eq!(
            f.container_path("shared", Some(bad), "chips"),
            by_claim,
            "{bad:?}"
        );
    }
    let longest = "a".repeat(63);
    for good in ["accel", "a", "0-a-9", longest.as_str()] {
        assert_eq!(
            f.container_path("shared", Some(good), "chips"),
            format!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/{good}/chips/neuron.aws.com-metadata.json"
            ),
        );
    }

    // Staged: the file's mount and its content leave the value out.
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    let object = claim_object(Some("../../etc"), &[("chips", "neurondevice0")]);
    let (mounts, staged): (Vec<_>, Vec<_>) = f
        .stage(
            &claim_ref(UID),
            Some(&object),
            &[prepared("neurondevice0", &["chips"])],
        )
        .unwrap()
        .into_iter()
        .unzip();
    commit(staged).unwrap();
    assert_eq!(
        mounts[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-0-chips-x7k2p/chips/neuron.aws.com-metadata.json"
    );
    assert!(
        stream(&mounts[0].host_path)[0]
            .get("podClaimName")
            .is_none()
    );
}

#[test]
fn the_cdi_spec_mounts_each_file_read_only_for_its_request() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(&dir.path().join("attributes"));
    let cdi = CdiWriter::new(&dir.path().join("cdi"), DRIVER, "neuron");
    let mut devices = vec![
        prepared("neurondevice0", &["chips"]),
        prepared("neurondevice1", &["chips"]),
    ];
    let (mounts, staged): (Vec<_>, Vec<_>) = f
        .stage(&claim_ref(UID), None, &devices)
        .unwrap()
        .into_iter()
        .unzip();
    commit(staged).unwrap();
    cdi.set_device_ids(UID, &mut devices, mounts.iter().map(|m| m.request.as_str()));
    let mount_id = format!("k8s.{DRIVER}/neuron={UID}_chips");
    assert_eq!(devices[0].cdi_device_ids[1], mount_id);
    assert_eq!(devices[1].cdi_device_ids.len(), 1, "once per request");

    let edits: Vec<DeviceEdits> = devices
        .iter()
        .map(|d| DeviceEdits {
            device: d.device.clone(),
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: format!("/dev/{}", d.device),
                    host_path: None,
                }],
                env: BTreeMap::new(),
            },
        })
        .collect();
    let (path, staged) = cdi.stage_with(UID, &edits, &mounts).unwrap();
    commit(vec![staged]).unwrap();
    let spec = container_device_interface::spec::read_spec(&path, 0)
        .unwrap_or_else(|e| panic!("CDI crate rejected {}: {e:#}", path.display()));
    let device = spec
        .get_device(&format!("{UID}_chips"))
        .expect("mount device present");
    assert_eq!(device.get_qualified_name(), mount_id);
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        raw["devices"][2]["containerEdits"]["mounts"],
        serde_json::json!([{
            "hostPath": mounts[0].host_path,
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train-0-chips-x7k2p/chips/neuron.aws.com-metadata.json",
            "options": ["ro", "bind"],
        }])
    );
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct NoConfig {}

impl crate::prepare::config::DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["neuron.aws.com/v1"];
    const KIND: &'static str = "NoConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// Gives each device its node.
struct NodesDriver;

impl Driver for NodesDriver {
    type Config = NoConfig;

    async fn prepare(
        &self,
        _: &ClaimRef,
        devices: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        Ok(devices
            .iter()
            .map(|d| DeviceEdits {
                device: d.device.clone(),
                edits: ContainerEdits {
                    device_nodes: vec![DeviceNode {
                        path: format!("/dev/{}", d.device),
                        host_path: None,
                    }],
                    env: BTreeMap::new(),
                },
            })
            .collect())
    }
}

fn pipeline(dir: &Path, claims: &InMemoryClaimSource) -> ClaimPipeline<NodesDriver> {
    let boot_id = dir.join("boot_id");
    std::fs::write(&boot_id, "boot-1\n").unwrap();
    let metrics = PluginMetrics::register(&prometheus::Registry::new()).unwrap();
    ClaimPipeline::new(
        Arc::new(NodesDriver),
        Arc::new(claims.clone()),
        PipelineConfig {
            driver_name: DRIVER,
            pool: None,
            data_dir: dir,
            cdi_root: &dir.join("cdi"),
            cdi_class: "neuron",
            boot_id_path: boot_id,
            device_attributes: &files(&dir.join("attributes")),
            release_wait: std::time::Duration::ZERO,
        },
        metrics,
        Default::default(),
    )
}

#[tokio::test]
async fn prepare_writes_and_mounts_the_file_unprepare_and_a_restart_remove_it() {
    let dir = tempfile::tempdir().unwrap();
    let claims = InMemoryClaimSource::new();
    claims.insert(claim_object(None, &[("chips", "neurondevice8")]));
    let p = pipeline(dir.path(), &claims);
    let file = p.attribute_files().host_path(UID, "chips");

    let mut answers = p.prepare(vec![claim_ref(UID)]).await.unwrap();
    let devices = answers.remove(UID).unwrap().unwrap();
    assert_eq!(
        devices[0].cdi_device_ids,
        [
            format!("k8s.{DRIVER}/neuron={UID}-neurondevice8"),
            format!("k8s.{DRIVER}/neuron={UID}_chips"),
        ]
    );
    let attrs = &stream(&file)[0]["requests"][0]["devices"][0]["attributes"];
    assert_eq!(attrs["resource.aws.com/devicegroup4_id"]["string"], "g2");
    let spec = std::fs::read_to_string(
        CdiWriter::new(&dir.path().join("cdi"), DRIVER, "neuron").spec_path(UID),
    )
    .unwrap();
    assert!(spec.contains(&*file.to_string_lossy()), "{spec}");

    p.unprepare(vec![claim_ref(UID)]).await.unwrap()[UID]
        .clone()
        .unwrap();
    assert!(!file.exists(), "unprepare left {}", file.display());

    // Prepared again; then the checkpoint forgets the claim (unprepared
    // while no driver ran): the next start's sweep removes the file.
    p.prepare(vec![claim_ref(UID)]).await.unwrap();
    assert!(file.exists());
    let mut forgotten = p.checkpoint().load().unwrap();
    forgotten.claims.clear();
    p.checkpoint().save(&forgotten).unwrap();
    let restarted = pipeline(dir.path(), &claims);
    restarted.sweep_attribute_files().await;
    assert!(!file.exists(), "the start sweep left {}", file.display());
}

#[test]
fn the_default_directory_sits_beside_the_cdi_root() {
    let cases = [
        (None, "/var/run/cdi", "/var/run/dra-device-attributes"),
        (None, "/run/n1/cdi", "/run/n1/dra-device-attributes"),
        (Some("/x/attrs"), "/var/run/cdi", "/x/attrs"),
    ];
    for (host_dir, cdi_root, want) in cases {
        let f = AttributeFiles {
            host_dir: host_dir.map(PathBuf::from),
            ..Default::default()
        }
        .for_driver(DRIVER, Path::new(cdi_root));
        assert_eq!(f.dir(), Path::new(want), "{host_dir:?} {cdi_root}");
    }
}
