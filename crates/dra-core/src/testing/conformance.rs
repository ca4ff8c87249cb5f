//! The driver conformance suite: what every driver built on `dra-core` must
//! do with bad input, through the real kubelet plugin (gRPC
//! `NodePrepareResources` on its socket, the driver on its fixture, the claim
//! as the API server would hold it).
//!
//! [`run`] checks, each on a fresh node: a good claim prepares; a bad opaque
//! config of this driver (not an object, an unknown field, over the size
//! limit, another driver's `apiVersion`) is refused; another driver's config
//! is not this driver's to check; devices of another driver or another pool
//! are refused; a claim gone from the API server is refused. After every
//! refusal nothing is left behind (no CDI spec, no checkpoint entry) and the
//! good device is still free for the next claim.
//!
//! A driver's own cases (its device names, its config's fields) use the same
//! [`Node`]: [`Node::refused`] does the leave-nothing-behind checks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::kubelet::plugin::{KubeletPlugin, PluginOptions, RunningPlugin};
use crate::kubelet::proto::dra_v1;
use crate::kubelet::self_check::unix_channel;
use crate::prepare::claims::InMemoryClaimSource;
use crate::prepare::driver::Driver;
use crate::prepare::metrics::PluginMetrics;

/// The node's pool.
pub const POOL: &str = "node-a";
/// The uid of the claim each case refuses.
pub const BAD_UID: &str = "0bad0000-0000-4000-8000-000000000bad";
/// The claim's namespace.
pub const NAMESPACE: &str = "ml";

/// A driver under test, as it runs on one node.
pub struct Subject<D> {
    /// The driver, on its fixture.
    pub driver: D,
    /// Its DRA driver name.
    pub driver_name: &'static str,
    /// Its CDI class (`k8s.<driver>/<class>`).
    pub cdi_class: &'static str,
    /// The claim's name and its request's name (`efa`, `chips`).
    pub claim_name: &'static str,
    /// Two devices of this node that prepare with no config.
    pub devices: [String; 2],
    /// An opaque config of this driver that prepares.
    pub good_config: Value,
}

/// One node: the kubelet plugin serving `driver` on a temporary directory,
/// claims read from memory.
pub struct Node {
    /// Where the test puts the claims the plugin reads.
    pub claims: InMemoryClaimSource,
    /// The CDI spec directory.
    pub cdi_root: PathBuf,
    /// The checkpoint file.
    pub checkpoint: PathBuf,
    driver_name: &'static str,
    cdi_class: &'static str,
    claim_name: &'static str,
    devices: [String; 2],
    good_config: Value,
    token: CancellationToken,
    running: RunningPlugin,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// An opaque config entry of a claim, for `driver`.
pub fn config(driver: &str, parameters: Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: "FromClaim".into(),
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

impl Node {
    /// Starts the plugin for `subject` under `dir` (boot id, sockets, CDI
    /// root and checkpoint all inside it).
    pub async fn start<D: Driver>(subject: Subject<D>, dir: &Path) -> Node {
        std::fs::write(dir.join("boot_id"), "boot-1\n").unwrap();
        let mut options = PluginOptions::new(subject.driver_name, subject.cdi_class);
        options.registrar_dir = dir.join("registry");
        options.plugins_dir = dir.join("plugins");
        options.cdi_root = dir.join("cdi");
        options.boot_id_path = dir.join("boot_id");
        options.pool = Some(POOL.into());
        let checkpoint = options.sockets().data_dir.join("checkpoint.json");
        let claims = InMemoryClaimSource::new();
        let metrics = PluginMetrics::register(&prometheus::Registry::new()).unwrap();
        let token = CancellationToken::new();
        let running = KubeletPlugin::new(
            subject.driver,
            Arc::new(claims.clone()),
            options.clone(),
            metrics,
        )
        .start(token.clone())
        .await
        .unwrap();
        Node {
            claims,
            cdi_root: options.cdi_root,
            checkpoint,
            driver_name: subject.driver_name,
            cdi_class: subject.cdi_class,
            claim_name: subject.claim_name,
            devices: subject.devices,
            good_config: subject.good_config,
            token,
            running,
        }
    }

    /// The claim `uid` as the API server holds it once allocated: `results`
    /// are (driver, pool, device), all for the request named like the claim.
    pub fn claim(
        &self,
        uid: &str,
        results: &[(&str, &str, &str)],
        configs: Vec<DeviceAllocationConfiguration>,
    ) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.namespace = Some(NAMESPACE.into());
        c.metadata.name = Some(self.claim_name.into());
        c.metadata.uid = Some(uid.into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                                request: self.claim_name.into(),
                                driver: driver.to_string(),
                                pool: pool.to_string(),
                                device: device.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: Some(configs),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    }

    /// A claim of this driver's device `device` in this node's pool.
    pub fn claim_of(
        &self,
        uid: &str,
        device: &str,
        configs: Vec<DeviceAllocationConfiguration>,
    ) -> ResourceClaim {
        self.claim(uid, &[(self.driver_name, POOL, device)], configs)
    }

    /// Kubelet's call for one claim: its devices' CDI ids, or its error.
    pub async fn prepare(&self, uid: &str) -> Result<Vec<String>, String> {
        let socket = &self.running.sockets.plugin;
        let mut client =
            dra_v1::dra_plugin_client::DraPluginClient::new(unix_channel(socket).await.unwrap());
        let response = tokio::time::timeout(
            Duration::from_secs(30),
            client.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: NAMESPACE.into(),
                    uid: uid.into(),
                    name: self.claim_name.into(),
                }],
            }),
        )
        .await
        .expect("prepare answered within 30 s")
        .expect("prepare call succeeded")
        .into_inner();
        let answer = response
            .claims
            .get(uid)
            .cloned()
            .expect("an answer for the claim");
        if answer.error.is_empty() {
            Ok(answer
                .devices
                .iter()
                .flat_map(|d| d.cdi_device_ids.clone())
                .collect())
        } else {
            Err(answer.error)
        }
    }

    /// Nothing of `uid` on the node: no CDI spec names it, the checkpoint
    /// (if any) has no entry for it.
    pub fn assert_nothing_left(&self, uid: &str) {
        let specs: Vec<String> = std::fs::read_dir(&self.cdi_root)
            .map(|dir| {
                dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|name| name.contains(uid))
                    .collect()
            })
            .unwrap_or_default();
        assert!(specs.is_empty(), "CDI specs left for {uid}: {specs:?}");
        if let Ok(text) = std::fs::read_to_string(&self.checkpoint) {
            let checkpoint: Value = serde_json::from_str(&text).unwrap();
            assert!(
                checkpoint["claims"].get(uid).is_none(),
                "checkpoint entry left for {uid}: {text}"
            );
        }
    }

    /// Prepares `bad` (uid [`BAD_UID`]) and returns its error, after
    /// checking that nothing was left behind and that the first good device
    /// is still free for a claim with the good config.
    pub async fn refused(&self, bad: ResourceClaim) -> String {
        self.claims.insert(bad);
        let error = match self.prepare(BAD_UID).await {
            Err(e) => e,
            Ok(ids) => panic!("the bad claim prepared: {ids:?}"),
        };
        self.assert_nothing_left(BAD_UID);
        let good = &self.devices[0];
        let uid = format!("600d0000-0000-4000-8000-{:012}", self.claims.get_count());
        self.claims.insert(self.claim_of(
            &uid,
            good,
            vec![config(self.driver_name, self.good_config.clone())],
        ));
        let ids = self.prepare(&uid).await.expect("the good claim prepares");
        assert_eq!(ids, self.cdi_ids(&uid, good));
        error
    }

    /// What a prepare of one device answers: the device's CDI id, then the
    /// one that mounts its request's device attributes file.
    pub fn cdi_ids(&self, uid: &str, device: &str) -> Vec<String> {
        let kind = format!("k8s.{}/{}", self.driver_name, self.cdi_class);
        vec![
            format!("{kind}={uid}-{device}"),
            format!("{kind}={uid}_{}", self.claim_name),
        ]
    }

    /// A claim of the first good device with one opaque config of this
    /// driver, refused: its error.
    pub async fn refused_config(&self, parameters: Value) -> String {
        let bad = self.claim_of(
            BAD_UID,
            &self.devices[0],
            vec![config(self.driver_name, parameters)],
        );
        self.refused(bad).await
    }

    /// The prefix of an opaque config error of the claim's first config.
    pub fn config_error_prefix(&self) -> String {
        format!(
            "ResourceClaim {NAMESPACE}/{}: opaque config #0 (from ResourceClaim): ",
            self.claim_name
        )
    }
}

/// The good config with one more field, or with its fields replaced.
fn with_field(good: &Value, key: &str, value: Value) -> Value {
    let mut v = good.clone();
    v[key] = value;
    v
}

/// Runs the suite: each case on a fresh node that `make` builds in the
/// directory it is given (its fixture there too). Panics naming the case
/// that failed.
pub async fn run<D, F>(make: F)
where
    D: Driver,
    F: Fn(&Path) -> Subject<D>,
{
    let mut cases = 0;
    let node = |name: &'static str| {
        let dir = tempfile::tempdir().unwrap();
        let subject = make(dir.path());
        (name, dir, subject)
    };

    // A good claim prepares, and `assert_nothing_left` does see it.
    let (case, dir, subject) = node("a good claim prepares");
    let n = Node::start(subject, dir.path()).await;
    let device = n.devices[1].clone();
    n.claims.insert(n.claim_of(BAD_UID, &device, vec![]));
    let ids = n
        .prepare(BAD_UID)
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(ids, n.cdi_ids(BAD_UID, &device), "{case}");
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        n.assert_nothing_left(BAD_UID)
    }));
    assert!(seen.is_err(), "{case}: a prepared claim must be visible");
    cases += 1;

    // Bad opaque configs of this driver.
    let (case, dir, subject) = node("config parameters not an object");
    let n = Node::start(subject, dir.path()).await;
    let got = n.refused_config(json!(["a", "list"])).await;
    let want = format!(
        "{}parameters must be a JSON object, got an array",
        n.config_error_prefix()
    );
    assert_eq!(got, want, "{case}");
    cases += 1;

    let (case, dir, subject) = node("config with an unknown field");
    let n = Node::start(subject, dir.path()).await;
    let bad = with_field(&n.good_config, "notAField", json!(1));
    let got = n.refused_config(bad).await;
    let want = format!(
        "{}field `notAField`: unknown field",
        n.config_error_prefix()
    );
    assert!(got.starts_with(&want), "{case}: {got}");
    cases += 1;

    let (case, dir, subject) = node("config over the size limit");
    let n = Node::start(subject, dir.path()).await;
    let bad = with_field(&n.good_config, "comment", json!("x".repeat(12 * 1024)));
    let got = n.refused_config(bad).await;
    assert!(
        got.starts_with(&n.config_error_prefix())
            && got.ends_with("bytes of JSON; the limit is 10240 bytes"),
        "{case}: {got}"
    );
    cases += 1;

    let (case, dir, subject) = node("another driver's apiVersion under this driver");
    let n = Node::start(subject, dir.path()).await;
    let bad = json!({"apiVersion": "other.example.com/v1", "kind": "OtherConfig"});
    let got = n.refused_config(bad).await;
    let want = format!(
        "{}field `apiVersion`: \"other.example.com/v1\" is not an apiVersion of this driver",
        n.config_error_prefix()
    );
    assert!(got.starts_with(&want), "{case}: {got}");
    cases += 1;

    // Another driver's config is that driver's to check: the claim prepares.
    let (case, dir, subject) = node("another driver's config is not ours to check");
    let n = Node::start(subject, dir.path()).await;
    let device = n.devices[1].clone();
    n.claims.insert(n.claim_of(
        BAD_UID,
        &device,
        vec![config("other.example.com", json!({"anything": true}))],
    ));
    n.prepare(BAD_UID)
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    cases += 1;

    // Devices that are not this driver's on this node.
    let (case, dir, subject) = node("results only for another driver");
    let n = Node::start(subject, dir.path()).await;
    let bad = n.claim(BAD_UID, &[("gpu.example.com", POOL, "gpu-0")], vec![]);
    let got = n.refused(bad).await;
    let want = format!(
        "ResourceClaim {NAMESPACE}/{} has no device of driver {} in status.allocation (results are for: gpu.example.com); the allocation changed after the pod was scheduled: delete the pod so that it is scheduled again",
        n.claim_name, n.driver_name
    );
    assert_eq!(got, want, "{case}");
    cases += 1;

    let (case, dir, subject) = node("results in another pool");
    let n = Node::start(subject, dir.path()).await;
    let device = n.devices[0].clone();
    let bad = n.claim(BAD_UID, &[(n.driver_name, "node-b", &device)], vec![]);
    let got = n.refused(bad).await;
    let want = format!(
        "ResourceClaim {NAMESPACE}/{}: device {device} of request {} is in pool node-b, but this node's pool is {POOL}: the claim was allocated devices of another node; delete the pod so that it is scheduled where its devices are",
        n.claim_name, n.claim_name
    );
    assert_eq!(got, want, "{case}");
    cases += 1;

    let (case, dir, subject) = node("a device name this node never published");
    let n = Node::start(subject, dir.path()).await;
    let bad = n.claim_of(BAD_UID, "no-such-device-0", vec![]);
    let got = n.refused(bad).await;
    assert!(
        got.starts_with(&format!("ResourceClaim {NAMESPACE}/{}: ", n.claim_name)),
        "{case}: {got}"
    );
    cases += 1;

    // A good device beside one that is not on the node: neither prepared.
    let (case, dir, subject) = node("a good device beside a missing one");
    let n = Node::start(subject, dir.path()).await;
    let kept = n.devices[1].clone();
    let bad = n.claim(
        BAD_UID,
        &[
            (n.driver_name, POOL, &kept),
            (n.driver_name, POOL, "no-such-device-0"),
        ],
        vec![],
    );
    n.refused(bad).await;
    n.claims
        .insert(n.claim_of("4e000000-0000-4000-8000-0000000000e7", &kept, vec![]));
    n.prepare("4e000000-0000-4000-8000-0000000000e7")
        .await
        .unwrap_or_else(|e| panic!("{case}: the good device was left half-prepared: {e}"));
    cases += 1;

    // The claim is gone from the API server by the time kubelet calls.
    let (case, dir, subject) = node("a claim gone from the API server");
    let n = Node::start(subject, dir.path()).await;
    let got = n.prepare(BAD_UID).await.err().unwrap_or_default();
    n.assert_nothing_left(BAD_UID);
    let want = format!(
        "ResourceClaim {NAMESPACE}/{} not found; it may have been deleted",
        n.claim_name
    );
    assert_eq!(got, want, "{case}");
    cases += 1;

    assert_eq!(cases, CASES);
}

/// How many cases [`run`] checks.
pub const CASES: usize = 11;
