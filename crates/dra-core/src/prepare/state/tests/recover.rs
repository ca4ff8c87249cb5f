//! A truncated checkpoint at start: what was prepared is rebuilt from the
//! CDI specs and attributes files on disk, nothing of a claim that may run
//! is removed, its devices are not handed to another claim; the API server
//! then confirms it (completed), refutes it (unprepared), or does not
//! answer (kept as recovered).

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::prepare::claims::{ClaimSource, ClaimSourceError};
use crate::prepare::state::recover::CONFIRM_MAX_RETRY;

const UID_A: &str = "0a1b2c3d-0000-4000-8000-00000000000a";

/// Claim `a` with a UID in the API server's shape (attributes files are
/// matched by it), allocated `dev-1` of pool `node`, shares one of it.
fn claim_a(claims: &InMemoryClaimSource) -> ClaimRef {
    let (mut object, mut r) = claim("a", "dev-1");
    object.metadata.uid = Some(UID_A.into());
    r.uid = UID_A.into();
    claims.insert(object);
    r
}

/// The plugin restarted on the same directories: a new pipeline whose
/// start-up work has run.
async fn restarted(
    dir: &Path,
    driver: &ExclusiveDriver,
    claims: Arc<dyn ClaimSource>,
) -> Arc<ClaimPipeline<ExclusiveDriver>> {
    let registry = prometheus::Registry::new();
    let p = pipeline_from(
        dir,
        driver,
        claims,
        Duration::ZERO,
        &registry,
        Default::default(),
    );
    let p = Arc::new(p);
    let stopped = CancellationToken::new();
    stopped.cancel();
    p.clone().run_in_background(stopped).await;
    // One round of confirmation done, whatever the background task did.
    p.confirm_recovered().await;
    p
}

/// Every file of ours on the node, with its bytes.
fn node_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in ["cdi", "dra-device-attributes"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = e.unwrap().path();
            out.insert(path.display().to_string(), std::fs::read(&path).unwrap());
        }
    }
    out
}

/// A prepared claim `a`, then the checkpoint cut in half (as a full disk
/// or a bad edit leaves it), and the driver restarted.
async fn prepared_then_truncated(
    dir: &Path,
    driver: &ExclusiveDriver,
    claims: &InMemoryClaimSource,
) -> (ClaimRef, PreparedClaim, BTreeMap<String, Vec<u8>>) {
    let p = pipeline(dir, driver, claims, Duration::ZERO);
    let a = claim_a(claims);
    prepare(&p, &a).await.unwrap();
    let recorded = p.checkpoint.load().unwrap().claims[UID_A].clone();
    let files = node_files(dir);
    assert_eq!(files.len(), 2, "{:?}", files.keys());
    let bytes = std::fs::read(p.checkpoint.path()).unwrap();
    std::fs::write(p.checkpoint.path(), &bytes[..bytes.len() / 2]).unwrap();
    (a, recorded, files)
}

#[tokio::test]
async fn a_truncated_checkpoint_keeps_a_running_claims_files_and_devices() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let (a, recorded, files) = prepared_then_truncated(dir.path(), &driver, &claims).await;

    let p = restarted(dir.path(), &driver, Arc::new(claims.clone())).await;
    assert!(p.unconfirmed.borrow().is_empty());
    // Every file as it was: the spec still mounts the attributes file.
    assert_eq!(node_files(dir.path()), files);
    // Confirmed by the API server: the record is the one prepare wrote.
    let now = p.checkpoint.load().unwrap();
    assert_eq!(now.claims.keys().collect::<Vec<_>>(), [UID_A]);
    assert_eq!(now.claims[UID_A], recorded);
    // The damaged file is kept aside for a post-mortem.
    let aside = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy()
                .starts_with("checkpoint.json.corrupt-")
        })
        .count();
    assert_eq!(aside, 1);

    // Its device goes to no other claim.
    let b = add(&claims, "b", "dev-1");
    let refused = prepare(&p, &b).await.unwrap_err();
    assert!(
        refused.contains(&format!("already prepared for claim ns/a (uid {UID_A})")),
        "{refused}"
    );
    // kubelet asks again for a (a new pod of a shared claim): answered.
    let answers = p.prepare(vec![a.clone()]).await.unwrap();
    assert_eq!(answers[UID_A].as_ref().unwrap(), &recorded.devices);
    // Its unprepare removes everything, as for any prepared claim.
    p.unprepare(vec![a]).await.unwrap()[UID_A].clone().unwrap();
    assert!(node_files(dir.path()).is_empty());
    assert!(driver.violations.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_recovered_claim_the_api_server_no_longer_has_is_unprepared() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let (a, _, _) = prepared_then_truncated(dir.path(), &driver, &claims).await;
    claims.remove(&a.namespace, &a.name);

    let p = restarted(dir.path(), &driver, Arc::new(claims.clone())).await;
    assert!(p.checkpoint.load().unwrap().claims.is_empty());
    assert!(node_files(dir.path()).is_empty());
    // The driver was told, so its device is free again.
    assert!(driver.holders.lock().unwrap().is_empty());
    let b = add(&claims, "b", "dev-1");
    prepare(&p, &b).await.unwrap();
}

/// The API server that does not answer.
struct Unreachable;

impl ClaimSource for Unreachable {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        Box::pin(async move {
            Err(ClaimSourceError {
                namespace: namespace.into(),
                name: name.into(),
                message: "connection refused".into(),
            })
        })
    }
}

#[tokio::test]
async fn without_the_api_server_a_recovered_claim_is_kept_as_rebuilt_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let (a, recorded, files) = prepared_then_truncated(dir.path(), &driver, &claims).await;

    let p = restarted(dir.path(), &driver, Arc::new(Unreachable)).await;
    assert_eq!(node_files(dir.path()), files);
    // Still to be confirmed, once the API server answers.
    assert!(p.unconfirmed.borrow().contains(UID_A));
    let now = p.checkpoint.load().unwrap();
    // Rebuilt from disk alone: the same claim, devices, CDI ids and spec.
    assert_eq!(now.claims[UID_A], recorded);
    // Unprepare works from the rebuilt record.
    p.unprepare(vec![a]).await.unwrap()[UID_A].clone().unwrap();
    assert!(node_files(dir.path()).is_empty());
}

/// The API server that answers from its `after`th request on (a driver
/// started before the API server is reachable).
struct AnswersLater {
    inner: InMemoryClaimSource,
    after: usize,
    asked: std::sync::atomic::AtomicUsize,
}

impl ClaimSource for AnswersLater {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, ClaimSourceError>> {
        let asked = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if asked + 1 < self.after {
            return Unreachable.get(namespace, name);
        }
        self.inner.get(namespace, name)
    }
}

#[tokio::test]
async fn a_recovered_claim_is_confirmed_once_the_api_server_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let (a, _, _) = prepared_then_truncated(dir.path(), &driver, &claims).await;
    claims.remove(&a.namespace, &a.name);
    let source = AnswersLater {
        inner: claims.clone(),
        after: 3,
        asked: Default::default(),
    };
    let p = restarted(dir.path(), &driver, Arc::new(source)).await;
    assert!(
        p.unconfirmed.borrow().contains(UID_A),
        "no answer yet: kept"
    );
    let running = CancellationToken::new();
    let task = tokio::spawn(p.clone().confirm_in_background(running.clone()));
    let confirmed = tokio::time::timeout(CONFIRM_MAX_RETRY, async {
        while !p.unconfirmed.borrow().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    running.cancel();
    task.await.unwrap();
    assert!(confirmed.is_ok(), "not asked again");
    // The API server's answer: gone, so unprepared.
    assert!(p.checkpoint.load().unwrap().claims.is_empty());
    assert!(node_files(dir.path()).is_empty());
}
