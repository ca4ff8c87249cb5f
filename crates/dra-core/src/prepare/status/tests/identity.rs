//! A claim deleted and recreated under its name on the same node: against a
//! fake API server that checks the apply's `metadata.uid` as the real one
//! does (another UID under the name: refused; no object: 404), the old
//! claim's late writes never reach the new claim, and the new claim's
//! entries are exactly its own.

use std::collections::HashMap;

use kube::core::Status;

use super::super::api::classify_status;
use super::*;

/// Claims by name: their UID and our entries; answers from a script first
/// (a transient failure holds a write back for a retry).
#[derive(Default)]
struct Server {
    objects: Mutex<HashMap<String, (String, Vec<Value>)>>,
    script: Mutex<VecDeque<ApplyError>>,
    calls: Mutex<Vec<(String, Value)>>,
}

impl Server {
    /// Creates (or deletes and recreates) claim `name` with `uid`, no entries.
    fn create(&self, name: &str, uid: &str) {
        self.objects
            .lock()
            .unwrap()
            .insert(name.into(), (uid.into(), Vec::new()));
    }

    /// The UID of claim `name` and the devices of our entries.
    fn held(&self, name: &str) -> (String, Vec<String>) {
        let objects = self.objects.lock().unwrap();
        let (uid, entries) = &objects[name];
        let devices = entries
            .iter()
            .map(|e| e["device"].as_str().unwrap().to_owned())
            .collect();
        (uid.clone(), devices)
    }

    fn fail_next(&self) {
        self.script
            .lock()
            .unwrap()
            .push_back(ApplyError::Transient("503".into()));
    }

    /// The UID each apply named, in order.
    fn uids(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b["metadata"]["uid"].as_str().unwrap_or("").to_owned())
            .collect()
    }
}

impl StatusApi for Server {
    fn apply<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
        body: &'a Value,
    ) -> BoxFuture<'a, Result<(), ApplyError>> {
        self.calls
            .lock()
            .unwrap()
            .push((name.to_owned(), body.clone()));
        let answer = match self.script.lock().unwrap().pop_front() {
            Some(error) => Err(error),
            None => match self.objects.lock().unwrap().get_mut(name) {
                None => Err(ApplyError::Gone),
                Some((uid, _)) if body["metadata"]["uid"].as_str() != Some(uid.as_str()) => {
                    Err(ApplyError::Stale)
                }
                Some((_, held)) => {
                    *held = entries(body);
                    Ok(())
                }
            },
        };
        Box::pin(async move { answer })
    }
}

fn tracker_on(api: Arc<Server>) -> (Tracker<Reporting>, StatusMetrics) {
    let metrics = StatusMetrics::register(&Registry::new()).unwrap();
    let t = Tracker::new(Arc::new(Reporting), DRIVER.into(), api, metrics.clone());
    (t, metrics)
}

/// Claim `name` as prepared under `uid`.
fn prepared_as(name: &str, uid: &str, devices: &[&str], generation: i64) -> Event<NoConfig> {
    let (mut claim, mut object) = claim(name, devices, generation);
    claim.uid = uid.into();
    object.metadata.uid = Some(uid.into());
    prepared_event(DRIVER, "node", claim, &object)
}

fn unprepared_as(name: &str, uid: &str) -> Event<NoConfig> {
    let mut claim = claim(name, &[], 1).0;
    claim.uid = uid.into();
    Event::Unprepared { claim }
}

#[tokio::test(start_paused = true)]
async fn the_old_claims_late_clear_does_not_remove_the_new_claims_entries() {
    let api = Arc::new(Server::default());
    api.create("a", "uid-old");
    let (mut t, metrics) = tracker_on(api.clone());
    t.on_event(prepared_as("a", "uid-old", &["dev-1"], 1));
    settle().await;
    assert_eq!(api.held("a"), ("uid-old".into(), vec!["dev-1".into()]));

    // Released; its clear fails once and waits to be retried. Meanwhile the
    // claim is deleted, recreated under its name, allocated the same device
    // and prepared here.
    api.fail_next();
    t.on_event(unprepared_as("a", "uid-old"));
    settle().await;
    api.create("a", "uid-new");
    t.on_event(prepared_as("a", "uid-new", &["dev-1"], 1));
    tokio::time::sleep(Duration::from_secs(60)).await;

    assert_eq!(
        api.held("a"),
        ("uid-new".into(), vec!["dev-1".into()]),
        "the new claim keeps exactly its entries"
    );
    assert_eq!(
        api.uids(),
        ["uid-old", "uid-old", "uid-old", "uid-new"],
        "set, failed clear, its retry (refused), then the new claim's set"
    );
    assert_eq!((metrics.count("stale"), metrics.count("applied")), (1, 2));
    assert_eq!(metrics.count("failed"), 0);
}

#[tokio::test(start_paused = true)]
async fn the_new_claim_does_not_inherit_the_old_claims_entries() {
    let api = Arc::new(Server::default());
    api.create("a", "uid-old");
    let (mut t, metrics) = tracker_on(api.clone());
    // The old claim's set waits for a retry; the claim is deleted and
    // recreated (the same device allocated) before the retry.
    api.fail_next();
    t.on_event(prepared_as("a", "uid-old", &["dev-1"], 1));
    settle().await;
    api.create("a", "uid-new");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        api.held("a"),
        ("uid-new".into(), vec![]),
        "nothing inherited"
    );
    assert_eq!(api.uids(), ["uid-old", "uid-old"], "refused, not retried");
    assert_eq!((metrics.count("stale"), metrics.count("applied")), (1, 0));

    // Prepared here: its own entries. A health change writes only the new
    // claim's; the old claim's unprepare, late, writes nothing.
    t.on_event(prepared_as("a", "uid-new", &["dev-2"], 1));
    settle().await;
    assert_eq!(api.held("a"), ("uid-new".into(), vec!["dev-2".into()]));
    t.on_readiness(vec![DeviceReadiness {
        pool: "node".into(),
        device: "dev-1".into(),
        healthy: false,
        message: "fatal".into(),
    }]);
    t.on_event(unprepared_as("a", "uid-old"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(api.held("a"), ("uid-new".into(), vec!["dev-2".into()]));
    assert_eq!(api.uids().len(), 3, "{:?}", api.uids());
    assert_eq!((metrics.count("stale"), metrics.count("applied")), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_uid_mismatch_drops_the_write() {
    let api = Arc::new(Server::default());
    api.create("a", "uid-someone-else");
    let (mut t, metrics) = tracker_on(api.clone());
    t.on_event(prepared_as("a", "uid-a", &["dev-1"], 1));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(api.uids(), ["uid-a"], "not retried");
    assert_eq!(api.held("a").1, Vec::<String>::new());
    assert_eq!(metrics.count("stale"), 1);
    assert_eq!((metrics.count("failed"), metrics.count("applied")), (0, 0));
}

/// The API server's answers to an apply that names another UID, as they
/// come over the wire.
#[test]
fn the_api_servers_uid_refusals_read_as_stale() {
    let status = |json: Value| -> Status { serde_json::from_value(json).unwrap() };
    // An existing claim of another UID: metadata.uid is immutable.
    let invalid = status(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "ResourceClaim.resource.k8s.io \"a\" is invalid: metadata.uid: Invalid value: \"uid-a\": field is immutable",
        "reason": "Invalid",
        "details": {"name": "a", "group": "resource.k8s.io", "kind": "ResourceClaim",
                    "causes": [{"reason": "FieldValueInvalid",
                                "message": "Invalid value: \"uid-a\": field is immutable",
                                "field": "metadata.uid"}]},
        "code": 422
    }));
    assert_eq!(classify_status(&invalid), ApplyError::Stale);
    // An apply that could create, with no object of the name.
    let mismatch = status(json!({
        "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "Operation cannot be fulfilled on resourceclaims.resource.k8s.io \"a\": uid mismatch: the provided object specified uid uid-a, and no existing object was found",
    }));
    assert_eq!(classify_status(&mismatch), ApplyError::Stale);
    // Any other invalid entry is a refusal, not a stale claim.
    let other = status(json!({
        "status": "Failure", "reason": "Invalid", "code": 422,
        "message": "ResourceClaim.resource.k8s.io \"a\" is invalid: status.devices[0]: Invalid value: \"dev-1\": must be an allocated device in the claim",
        "details": {"causes": [{"reason": "FieldValueInvalid", "field": "status.devices[0]"}]},
    }));
    assert!(matches!(classify_status(&other), ApplyError::Refused(_)));
    let gone = status(json!({"status": "Failure", "reason": "NotFound", "code": 404}));
    assert_eq!(classify_status(&gone), ApplyError::Gone);
}
