//! The pipeline's device-reuse wait, driven directly (no sockets): a claim
//! whose device is still prepared for another claim waits for that claim's
//! unprepare, without the lock, up to the bound; the device is never
//! prepared for two claims at once.
//! The group commits that serve them are tested in `group_commit`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};

use super::*;
use crate::prepare::claims::InMemoryClaimSource;
use crate::prepare::config::InvalidValue;
use crate::prepare::driver::{ContainerEdits, DeviceNode, DriverError};

mod group_commit;
mod newer;
mod recover;
mod status;

const DRIVER: &str = "test.example.com";

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct NoConfig {}

impl crate::prepare::config::DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "NoConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// Tracks which claim each device is prepared for, as the hardware would
/// see it, and records every time a device was prepared while another
/// claim still had it.
#[derive(Clone, Default)]
struct ExclusiveDriver {
    holders: Arc<Mutex<BTreeMap<String, String>>>,
    violations: Arc<Mutex<Vec<String>>>,
    prepares: Arc<Mutex<Vec<String>>>,
    /// How long each prepare takes (as hardware set-up would).
    delay: Duration,
}

impl Driver for ExclusiveDriver {
    type Config = NoConfig;

    async fn prepare(
        &self,
        claim: &ClaimRef,
        devices: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.prepares.lock().unwrap().push(claim.uid.clone());
        let mut holders = self.holders.lock().unwrap();
        for d in devices {
            if let Some(other) = holders.insert(d.device.clone(), claim.uid.clone())
                && other != claim.uid
            {
                self.violations.lock().unwrap().push(format!(
                    "{} prepared for {} while {other} held it",
                    d.device, claim.uid
                ));
            }
        }
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

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        devices: &[PreparedDevice],
    ) -> Result<(), DriverError> {
        let mut holders = self.holders.lock().unwrap();
        for d in devices {
            if holders.get(&d.device) == Some(&claim.uid) {
                holders.remove(&d.device);
            }
        }
        Ok(())
    }
}

fn pipeline(
    dir: &Path,
    driver: &ExclusiveDriver,
    claims: &InMemoryClaimSource,
    release_wait: Duration,
) -> Arc<ClaimPipeline<ExclusiveDriver>> {
    pipeline_with_metrics(
        dir,
        driver,
        claims,
        release_wait,
        &prometheus::Registry::new(),
    )
}

fn pipeline_with_metrics(
    dir: &Path,
    driver: &ExclusiveDriver,
    claims: &InMemoryClaimSource,
    release_wait: Duration,
    registry: &prometheus::Registry,
) -> Arc<ClaimPipeline<ExclusiveDriver>> {
    let claims = Arc::new(claims.clone());
    Arc::new(pipeline_from(
        dir,
        driver,
        claims,
        release_wait,
        registry,
        Default::default(),
    ))
}

/// The pipeline of `driver` on `dir` (boot `boot-1`, CDI specs in
/// `dir/cdi`), reading claims from `claims`, handing status to `status`.
fn pipeline_from(
    dir: &Path,
    driver: &ExclusiveDriver,
    claims: Arc<dyn crate::prepare::claims::ClaimSource>,
    release_wait: Duration,
    registry: &prometheus::Registry,
    status: ClaimStatus<NoConfig>,
) -> ClaimPipeline<ExclusiveDriver> {
    let boot_id = dir.join("boot_id");
    std::fs::write(&boot_id, "boot-1\n").unwrap();
    let metrics = PluginMetrics::register(registry).unwrap();
    ClaimPipeline::new(
        Arc::new(driver.clone()),
        claims,
        PipelineConfig {
            driver_name: DRIVER,
            pool: None,
            data_dir: dir,
            cdi_root: &dir.join("cdi"),
            cdi_class: "dev",
            boot_id_path: boot_id,
            device_attributes: &AttributeFiles::default(),
            release_wait,
        },
        metrics,
        status,
    )
}

/// Claim `name` (UID `uid-<name>`) allocated `device` of pool `node`.
fn claim(name: &str, device: &str) -> (ResourceClaim, ClaimRef) {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "r".into(),
                    driver: DRIVER.into(),
                    pool: "node".into(),
                    device: device.into(),
                    ..Default::default()
                }]),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let r = ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    };
    (c, r)
}

fn add(claims: &InMemoryClaimSource, name: &str, device: &str) -> ClaimRef {
    let (object, r) = claim(name, device);
    claims.insert(object);
    r
}

async fn prepare(p: &ClaimPipeline<ExclusiveDriver>, c: &ClaimRef) -> Result<(), String> {
    let mut answers = p.prepare(vec![c.clone()]).await.unwrap();
    answers.remove(&c.uid).unwrap().map(|_| ())
}

fn in_checkpoint(p: &ClaimPipeline<ExclusiveDriver>) -> Vec<String> {
    p.checkpoint.load().unwrap().claims.into_keys().collect()
}

fn held_message(claim: &str, holder: &str) -> String {
    format!(
        "ResourceClaim ns/{claim}: device node/dev-1 is already prepared for claim ns/{holder} \
         (uid uid-{holder}); refusing to give one device to two claims. Wait until that claim is \
         unprepared (its pods are gone), then retry"
    )
}

#[tokio::test(start_paused = true)]
async fn a_held_device_is_prepared_once_its_holder_is_unprepared() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let registry = prometheus::Registry::new();
    let p = pipeline_with_metrics(
        dir.path(),
        &driver,
        &claims,
        Duration::from_secs(10),
        &registry,
    );
    let old = add(&claims, "old", "dev-1");
    let new = add(&claims, "new", "dev-1");
    prepare(&p, &old).await.unwrap();

    let waiting = tokio::spawn({
        let (p, new) = (p.clone(), new.clone());
        async move {
            let result = prepare(&p, &new).await;
            (result, tokio::time::Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the new claim did not wait");
    assert_eq!(in_checkpoint(&p), ["uid-old"], "prepared beside its holder");

    // The waiting prepare does not hold the lock: unprepare goes through.
    let unprepared = tokio::time::timeout(Duration::from_secs(2), p.unprepare(vec![old]))
        .await
        .expect("unprepare was blocked by the waiting prepare")
        .unwrap();
    let unprepared_at = tokio::time::Instant::now();
    assert!(unprepared["uid-old"].is_ok());
    let (result, done_at) = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the waiting prepare missed the unprepare")
        .unwrap();
    result.unwrap();
    // On the paused clock: woken by the unprepare itself, not by the next
    // periodic re-check.
    let after = done_at.duration_since(unprepared_at);
    assert!(after < RELEASE_POLL, "took {after:?} after the unprepare");
    assert_eq!(in_checkpoint(&p), ["uid-new"]);
    assert!(driver.violations.lock().unwrap().is_empty());
    let text = crate::prepare::metrics::tests::render(&registry);
    assert!(
        text.contains("aws_dra_plugin_device_release_waits_total{result=\"released\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_device_still_held_at_the_bound_is_refused_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let bound = Duration::from_millis(400);
    let registry = prometheus::Registry::new();
    let p = pipeline_with_metrics(dir.path(), &driver, &claims, bound, &registry);
    let old = add(&claims, "old", "dev-1");
    let new = add(&claims, "new", "dev-1");
    prepare(&p, &old).await.unwrap();

    let started = tokio::time::Instant::now();
    let err = prepare(&p, &new).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err, held_message("new", "old"));
    // The paused clock moves only by the pipeline's own timers: refused at
    // the bound, not one re-check later.
    assert!(took >= bound, "refused after {took:?}, before the bound");
    assert!(took < bound + RELEASE_POLL, "took {took:?}");
    assert_eq!(in_checkpoint(&p), ["uid-old"]);
    assert_eq!(*driver.prepares.lock().unwrap(), ["uid-old"]);
    let text = crate::prepare::metrics::tests::render(&registry);
    assert!(
        text.contains("aws_dra_plugin_device_release_waits_total{result=\"timed_out\"} 1"),
        "{text}"
    );

    // A zero bound refuses at once, with the same message.
    let p0 = pipeline(dir.path(), &driver, &claims, Duration::ZERO);
    let started = tokio::time::Instant::now();
    assert_eq!(
        prepare(&p0, &new).await.unwrap_err(),
        held_message("new", "old")
    );
    assert!(started.elapsed() < RELEASE_POLL, "waited for a re-check");
}

/// Two claims of one call on one device: kubelet will not unprepare one of
/// them while the other waits, so the second is refused at once.
#[tokio::test(start_paused = true)]
async fn a_holder_in_the_same_call_is_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::from_secs(10));
    let a = add(&claims, "a", "dev-1");
    let b = add(&claims, "b", "dev-1");
    let started = tokio::time::Instant::now();
    let answers = p.prepare(vec![a, b]).await.unwrap();
    assert!(started.elapsed() < RELEASE_POLL, "waited for a re-check");
    assert!(answers["uid-a"].is_ok());
    assert_eq!(
        answers["uid-b"].as_ref().unwrap_err(),
        &held_message("b", "a")
    );
}

/// Another plugin instance (seamless upgrade) shares the data directory
/// but not this process's wake-up: the periodic re-check sees its unprepare.
#[tokio::test(start_paused = true)]
async fn an_unprepare_by_another_instance_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::from_secs(10));
    let other = pipeline(dir.path(), &driver, &claims, Duration::from_secs(10));
    let old = add(&claims, "old", "dev-1");
    let new = add(&claims, "new", "dev-1");
    prepare(&other, &old).await.unwrap();
    let waiting = tokio::spawn({
        let (p, new) = (p.clone(), new.clone());
        async move { prepare(&p, &new).await }
    });
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!waiting.is_finished());
    other.unprepare(vec![old]).await.unwrap();
    tokio::time::timeout(RELEASE_POLL * 5, waiting)
        .await
        .expect("the re-check did not see the other instance's unprepare")
        .unwrap()
        .unwrap();
    assert_eq!(in_checkpoint(&p), ["uid-new"]);
}

/// Several claims wait for one device: when its holder goes, exactly one
/// gets it; the others keep waiting and are refused at the bound. At no
/// point is the device prepared for two claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_released_device_goes_to_exactly_one_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::from_millis(1500));
    let old = add(&claims, "old", "dev-1");
    prepare(&p, &old).await.unwrap();
    let waiters: Vec<_> = (0..6)
        .map(|i| {
            let c = add(&claims, &format!("w{i}"), "dev-1");
            let p = p.clone();
            tokio::spawn(async move { prepare(&p, &c).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.unprepare(vec![old]).await.unwrap();
    let mut won = 0;
    for w in waiters {
        match w.await.unwrap() {
            Ok(()) => won += 1,
            Err(e) => assert!(e.contains("is already prepared for claim ns/w"), "{e}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(in_checkpoint(&p).len(), 1);
    assert_eq!(
        driver.prepares.lock().unwrap().len(),
        2,
        "old and one waiter"
    );
    assert!(
        driver.violations.lock().unwrap().is_empty(),
        "{:?}",
        driver.violations.lock().unwrap()
    );
}

/// The CDI spec goes in place with the checkpoint; should a crash leave the
/// checkpoint naming a spec that is not there, the claim is prepared again
/// instead of being answered with CDI ids the runtime cannot resolve.
#[tokio::test]
async fn a_recorded_claim_without_its_spec_is_prepared_again() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::ZERO);
    let c = add(&claims, "c", "dev-1");
    prepare(&p, &c).await.unwrap();
    let spec = p.checkpoint.load().unwrap().claims["uid-c"]
        .cdi_spec_path
        .clone();
    assert!(spec.exists(), "spec written with the checkpoint");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("cdi"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    prepare(&p, &c).await.unwrap();
    assert_eq!(
        driver.prepares.lock().unwrap().len(),
        1,
        "answered from the checkpoint"
    );
    std::fs::remove_file(&spec).unwrap();
    prepare(&p, &c).await.unwrap();
    assert_eq!(driver.prepares.lock().unwrap().len(), 2, "prepared again");
    assert!(spec.exists(), "spec rewritten");
}

/// A checkpoint found corrupt is moved aside and the driver starts empty;
/// the kubelet's later unprepare of a claim prepared before that still
/// removes the claim's CDI spec (named after the claim), so nothing leaks.
#[tokio::test]
async fn unprepare_after_a_lost_checkpoint_removes_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::ZERO);
    let c = add(&claims, "c", "dev-1");
    prepare(&p, &c).await.unwrap();
    let spec = p.checkpoint.load().unwrap().claims["uid-c"]
        .cdi_spec_path
        .clone();
    assert!(spec.exists());
    let checkpoint = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n == "checkpoint.json"))
        .expect("checkpoint.json in the data dir");
    std::fs::write(&checkpoint, b"{not json").unwrap();
    assert!(
        matches!(p.checkpoint.load(), Err(CheckpointError::Corrupt { .. })),
        "corrupt: reported by the view, moved aside by the next call"
    );

    let answers = p.unprepare(vec![c.clone()]).await.unwrap();
    assert_eq!(answers["uid-c"], Ok(()));
    assert!(!spec.exists(), "spec of the forgotten claim left behind");
    assert!(in_checkpoint(&p).is_empty(), "corrupt: starts empty");
    // A claim never prepared here: still a plain success.
    let other = add(&claims, "other", "dev-2");
    assert_eq!(p.unprepare(vec![other]).await.unwrap()["uid-other"], Ok(()));
}
