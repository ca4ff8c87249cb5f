use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use prometheus::Registry;
use serde_json::{Value, json};

use super::api::{ApplyError, classify};
use super::entry::{MAX_DATA_BYTES, Slot, apply_body};
use super::writer::{ATTEMPTS, Tracker};
use super::*;
use crate::prepare::config::{DriverConfig, InvalidValue};
use crate::prepare::driver::{
    AllocatedDevice, DeviceEdits, DeviceStatus, DriverError, NetworkData,
};

const DRIVER: &str = "test.example.com";

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoConfig {}

impl DriverConfig for NoConfig {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "NoConfig";
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// Reports `data.index` for every device and `networkData` for `nic-*`.
struct Reporting;

impl Driver for Reporting {
    type Config = NoConfig;

    async fn prepare(
        &self,
        _: &ClaimRef,
        _: &[AllocatedDevice<NoConfig>],
    ) -> Result<Vec<DeviceEdits>, DriverError> {
        unreachable!("the status task never prepares")
    }

    fn device_status(
        &self,
        _: &ClaimRef,
        devices: &[AllocatedDevice<NoConfig>],
    ) -> Vec<DeviceStatus> {
        devices
            .iter()
            .map(|d| DeviceStatus {
                device: d.device.clone(),
                data: json!({"index": d.device.trim_start_matches(|c: char| !c.is_ascii_digit())})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                network: d.device.starts_with("nic-").then(|| NetworkData {
                    interface_name: "eth1".into(),
                    hardware_address: "0a:00:00:00:00:01".into(),
                    ips: vec![],
                }),
            })
            .collect()
    }
}

/// Records every apply; answers from a script (then `Ok`).
#[derive(Default)]
struct Recorder {
    applied: Mutex<Vec<(String, Value)>>,
    script: Mutex<VecDeque<Result<(), ApplyError>>>,
}

impl Recorder {
    fn bodies(&self) -> Vec<(String, Value)> {
        self.applied.lock().unwrap().clone()
    }
}

impl StatusApi for Recorder {
    fn apply<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, Result<(), ApplyError>> {
        self.applied
            .lock()
            .unwrap()
            .push((name.to_owned(), body.clone()));
        let answer = self.script.lock().unwrap().pop_front().unwrap_or(Ok(()));
        Box::pin(async move { answer })
    }
}

fn claim(name: &str, devices: &[&str], generation: i64) -> (ClaimRef, ResourceClaim) {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some(name.into());
    c.metadata.uid = Some(format!("uid-{name}"));
    c.metadata.generation = Some(generation);
    let results = devices
        .iter()
        .map(|d| DeviceRequestAllocationResult {
            request: "r".into(),
            driver: DRIVER.into(),
            pool: "node".into(),
            device: (*d).into(),
            ..Default::default()
        })
        // Another driver's device of the same claim is not ours to report.
        .chain(std::iter::once(DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: "gpu.example.com".into(),
            pool: "node".into(),
            device: "gpu-0".into(),
            ..Default::default()
        }))
        .collect();
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
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
    (r, c)
}

fn tracker(api: Arc<Recorder>) -> (Tracker<Reporting>, StatusMetrics) {
    let metrics = StatusMetrics::register(&Registry::new()).unwrap();
    let t = Tracker::new(Arc::new(Reporting), DRIVER.into(), api, metrics.clone());
    (t, metrics)
}

/// What the pipeline hands the task for `claim` as `object` allocates it:
/// the devices of `driver` in `pool`, resolved.
fn prepared_event(
    driver: &str,
    pool: &str,
    claim: ClaimRef,
    object: &ResourceClaim,
) -> Event<NoConfig> {
    let own = |device: &str| vec![device.to_owned()];
    let devices = crate::prepare::resolve::resolve_claim_with::<NoConfig>(
        driver,
        Some(pool),
        &claim,
        Some(object),
        &BTreeMap::new(),
        &own,
    )
    .unwrap();
    Event::Prepared(Prepared {
        claim,
        generation: object.metadata.generation,
        devices,
    })
}

fn prepared(name: &str, devices: &[&str], generation: i64) -> Event<NoConfig> {
    let (claim, object) = claim(name, devices, generation);
    prepared_event(DRIVER, "node", claim, &object)
}

/// Lets the spawned writers run, past the quiet time a write waits for
/// (time is paused: sleeps advance it).
async fn settle() {
    tokio::time::sleep(crate::prepare::status::writer::QUIET).await;
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

fn entries(body: &Value) -> Vec<Value> {
    body["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ready(entry: &Value) -> (&str, &str) {
    let c = &entry["conditions"][0];
    assert_eq!(c["type"], "Ready");
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_prepared_claim_gets_one_ready_entry_per_device_once() {
    let api = Arc::new(Recorder::default());
    let (mut t, metrics) = tracker(api.clone());
    t.on_event(prepared("a", &["dev-3", "nic-1"], 2));
    settle().await;
    let bodies = api.bodies();
    assert_eq!(bodies.len(), 1);
    let (name, body) = &bodies[0];
    assert_eq!(name, "a");
    assert_eq!(
        body["metadata"],
        json!({"name": "a", "namespace": "ns", "uid": "uid-a"}),
        "the UID is the apply's precondition"
    );
    let e = entries(body);
    assert_eq!(e.len(), 2, "only this driver's devices: {e:?}");
    assert_eq!(
        (&e[0]["driver"], &e[0]["pool"], &e[0]["device"]),
        (&json!(DRIVER), &json!("node"), &json!("dev-3"))
    );
    assert_eq!(ready(&e[0]), ("True", "Prepared"));
    assert_eq!(e[0]["conditions"][0]["observedGeneration"], 2);
    assert!(e[0]["conditions"][0]["lastTransitionTime"].is_string());
    assert_eq!(e[0]["data"], json!({"index": "3"}));
    assert!(e[0].get("networkData").is_none());
    assert_eq!(
        e[1]["networkData"],
        json!({"interfaceName": "eth1", "hardwareAddress": "0a:00:00:00:00:01"})
    );
    assert_eq!(metrics.count("applied"), 1);

    // The same claim answered again (another pod, kubelet's retry): nothing new.
    t.on_event(prepared("a", &["dev-3", "nic-1"], 2));
    settle().await;
    assert_eq!(api.bodies().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn health_flips_ready_and_unprepare_clears() {
    let api = Arc::new(Recorder::default());
    let (mut t, _) = tracker(api.clone());
    t.on_event(prepared("a", &["dev-3", "dev-4"], 1));
    settle().await;
    let first = entries(&api.bodies()[0].1);
    let readiness = |healthy: bool| {
        vec![
            DeviceReadiness {
                pool: "node".into(),
                device: "dev-3".into(),
                healthy,
                message: if healthy {
                    String::new()
                } else {
                    "sram-ecc-uncorrected=1 (Fatal)".into()
                },
            },
            DeviceReadiness {
                pool: "node".into(),
                device: "dev-4".into(),
                healthy: true,
                message: String::new(),
            },
        ]
    };
    // A report that changes nothing writes nothing.
    t.on_readiness(readiness(true));
    settle().await;
    assert_eq!(api.bodies().len(), 1);

    tokio::time::advance(Duration::from_secs(5)).await;
    t.on_readiness(readiness(false));
    settle().await;
    let bodies = api.bodies();
    assert_eq!(bodies.len(), 2);
    let e = entries(&bodies[1].1);
    assert_eq!(ready(&e[0]), ("False", "Unhealthy"));
    let message = e[0]["conditions"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("sram-ecc-uncorrected=1 (Fatal)"),
        "{message}"
    );
    assert_eq!(ready(&e[1]), ("True", "Prepared"));
    // Only the flipped device's transition time moved.
    assert_eq!(
        e[1]["conditions"][0]["lastTransitionTime"],
        first[1]["conditions"][0]["lastTransitionTime"]
    );
    assert_eq!(e[0]["data"], first[0]["data"], "data kept");

    t.on_event(Event::Unprepared {
        claim: claim("a", &[], 1).0,
    });
    settle().await;
    let bodies = api.bodies();
    assert_eq!(bodies.len(), 3);
    assert!(bodies[2].1.get("status").is_none(), "{}", bodies[2].1);
    // A health change after the release writes nothing.
    t.on_readiness(readiness(true));
    settle().await;
    assert_eq!(api.bodies().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_a_bounded_number_of_times() {
    let api = Arc::new(Recorder::default());
    {
        let mut script = api.script.lock().unwrap();
        script.push_back(Err(ApplyError::Transient("503".into())));
        script.push_back(Err(ApplyError::Transient("timeout".into())));
    }
    let (mut t, metrics) = tracker(api.clone());
    t.on_event(prepared("a", &["dev-1"], 1));
    settle().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(api.bodies().len(), 3, "two failures, then applied");
    assert_eq!(metrics.count("applied"), 1);
    assert_eq!(metrics.count("failed"), 0);

    {
        let mut script = api.script.lock().unwrap();
        for _ in 0..ATTEMPTS + 2 {
            script.push_back(Err(ApplyError::Transient("503".into())));
        }
    }
    t.on_event(prepared("b", &["dev-2"], 1));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        api.bodies().len(),
        3 + ATTEMPTS as usize,
        "gave up after the bound"
    );
    assert_eq!(metrics.count("failed"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_not_retried_and_a_gone_claim_is_no_failure() {
    let api = Arc::new(Recorder::default());
    api.script
        .lock()
        .unwrap()
        .push_back(Err(classify(403, "forbidden".into())));
    let (mut t, metrics) = tracker(api.clone());
    t.on_event(prepared("a", &["dev-1"], 1));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(api.bodies().len(), 1);
    assert_eq!(metrics.count("failed"), 1);

    api.script
        .lock()
        .unwrap()
        .push_back(Err(classify(404, "not found".into())));
    t.on_event(Event::Unprepared {
        claim: claim("a", &[], 1).0,
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(api.bodies().len(), 2);
    assert_eq!((metrics.count("failed"), metrics.count("gone")), (1, 1));
    assert_eq!(
        classify(503, String::new()),
        ApplyError::Transient("503: ".into())
    );
}

#[tokio::test(start_paused = true)]
async fn a_newer_state_replaces_one_waiting_for_a_retry() {
    let api = Arc::new(Recorder::default());
    api.script
        .lock()
        .unwrap()
        .push_back(Err(ApplyError::Transient("503".into())));
    let (mut t, _) = tracker(api.clone());
    t.on_event(prepared("a", &["dev-1"], 1));
    settle().await;
    // Released while its first write waits to be retried.
    t.on_event(Event::Unprepared {
        claim: claim("a", &[], 1).0,
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    let bodies = api.bodies();
    assert_eq!(bodies.len(), 2, "the set is not retried after the clear");
    assert!(bodies[1].1.get("status").is_none());

    // Prepared again at once: the new entries land after the clear.
    api.script
        .lock()
        .unwrap()
        .push_back(Err(ApplyError::Transient("503".into())));
    t.on_event(Event::Unprepared {
        claim: claim("a", &[], 1).0,
    });
    t.on_event(prepared("a", &["dev-1"], 2));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let bodies = api.bodies();
    let last = &bodies.last().unwrap().1;
    assert_eq!(entries(last).len(), 1, "{bodies:?}");
    assert_eq!(entries(last)[0]["conditions"][0]["observedGeneration"], 2);
}

#[tokio::test]
async fn the_pipeline_end_sends_its_claims_and_counts_a_full_queue() {
    let metrics = StatusMetrics::register(&Registry::new()).unwrap();
    let (tx, mut rx) = mpsc::channel(1);
    let status = ClaimStatus {
        events: Some(tx),
        metrics: Some(metrics.clone()),
    };
    let (a, object_a) = claim("a", &["dev-1"], 1);
    let (b, _) = claim("b", &["dev-2"], 1);
    let Event::Prepared(prepared_a) = prepared_event(DRIVER, "node", a.clone(), &object_a) else {
        unreachable!()
    };
    status.prepared(vec![prepared_a]);
    assert!(matches!(rx.try_recv(), Ok(Event::Prepared(p)) if p.claim == a));
    assert!(rx.try_recv().is_err());

    let both: BTreeMap<String, Result<(), String>> =
        [(a.uid.clone(), Ok(())), (b.uid.clone(), Ok(()))]
            .into_iter()
            .collect();
    status.unprepared(&[a.clone(), b.clone()], &both);
    assert!(matches!(rx.try_recv(), Ok(Event::Unprepared { claim }) if claim == a));
    assert_eq!(metrics.count("dropped"), 1, "the second did not fit");
    // The default end writes nothing and never blocks.
    ClaimStatus::<NoConfig>::default().unprepared(&[a], &both);
}

#[test]
fn the_body_leaves_out_what_the_api_would_refuse() {
    let c = claim("a", &[], 1).0;
    let mut big = serde_json::Map::new();
    big.insert("x".into(), json!("y".repeat(MAX_DATA_BYTES)));
    let slot = Slot {
        pool: "node".into(),
        device: "dev-1".into(),
        share_id: Some("0b7e1f5c-2d2a-4c59-9d43-9c1f4a7f8e01".into()),
        report: Some(DeviceStatus {
            device: "dev-1".into(),
            data: big,
            network: Some(NetworkData {
                interface_name: "e".repeat(300),
                ..Default::default()
            }),
        }),
        healthy: true,
        health_message: String::new(),
        since: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    };
    let body = apply_body(DRIVER, &c, None, &[slot]);
    let e = &entries(&body)[0];
    assert_eq!(e["shareID"], "0b7e1f5c-2d2a-4c59-9d43-9c1f4a7f8e01");
    assert!(
        e.get("data").is_none() && e.get("networkData").is_none(),
        "{e}"
    );
    assert_eq!(ready(e), ("True", "Prepared"));
    assert!(e["conditions"][0].get("observedGeneration").is_none());
    assert_eq!(
        e["conditions"][0]["lastTransitionTime"],
        "1970-01-01T00:00:00Z"
    );
}

#[test]
fn the_write_counter_is_named_by_the_rule() {
    let registry = Registry::new();
    let m = StatusMetrics::register(&registry).unwrap();
    m.write("applied");
    let names: Vec<String> = registry
        .gather()
        .iter()
        .map(|f| f.name().to_owned())
        .collect();
    assert_eq!(names, ["aws_dra_plugin_claim_status_writes_total"]);
}

mod identity;
mod shapes;

/// The writes of a burst wait until the node has been quiet for `QUIET`
/// (no claim prepared or unprepared), and never longer than `MAX_HOLD`.
#[tokio::test(start_paused = true)]
async fn writes_wait_for_a_quiet_node_at_most_max_hold() {
    use crate::prepare::status::writer::{MAX_HOLD, QUIET};
    let api = Arc::new(Recorder::default());
    let (mut t, _) = tracker(api.clone());
    let step = QUIET / 2;
    // A burst: a claim prepared every QUIET / 2; nothing written during it.
    let started = tokio::time::Instant::now();
    let mut names = Vec::new();
    while started.elapsed() < MAX_HOLD - step {
        let name = format!("c{}", names.len());
        t.on_event(prepared(&name, &["dev-1"], 1));
        names.push(name);
        tokio::time::sleep(step).await;
        assert!(api.bodies().is_empty(), "written during the burst");
    }
    // Still busy, but the first write has waited MAX_HOLD: it goes.
    t.on_event(prepared("late", &["dev-2"], 1));
    tokio::time::sleep(step + Duration::from_millis(1)).await;
    assert!(!api.bodies().is_empty(), "held beyond MAX_HOLD");
    // Quiet: every claim written, once.
    settle().await;
    let mut written: Vec<String> = api.bodies().into_iter().map(|(n, _)| n).collect();
    written.sort();
    names.push("late".into());
    names.sort();
    assert_eq!(written, names);
}
