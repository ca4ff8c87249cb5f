//! Group commits: concurrent calls share one checkpoint write, a device
//! freed and taken in one group is never held twice, and a kill at each
//! step of a group leaves a checkpoint of what was answered.

use super::*;

/// `(groups, calls)` of the group-commit histogram.
fn commit_groups(registry: &prometheus::Registry) -> (u64, f64) {
    let family = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "aws_dra_plugin_commit_group_calls")
        .expect("the group-commit histogram is registered");
    let h = family.get_metric()[0].get_histogram();
    (h.get_sample_count(), h.get_sample_sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_share_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    let claims = InMemoryClaimSource::new();
    let driver = ExclusiveDriver {
        delay: Duration::from_millis(20),
        ..ExclusiveDriver::default()
    };
    let registry = prometheus::Registry::new();
    let p = pipeline_with_metrics(dir.path(), &driver, &claims, Duration::ZERO, &registry);
    let refs: Vec<ClaimRef> = (0..8)
        .map(|i| add(&claims, &format!("c{i}"), &format!("dev-{i}")))
        .collect();
    let calls = refs.iter().map(|c| {
        let (p, c) = (p.clone(), c.clone());
        tokio::spawn(async move { prepare(&p, &c).await })
    });
    for answer in futures::future::join_all(calls).await {
        answer.unwrap().unwrap();
    }
    let mut recorded = in_checkpoint(&p);
    recorded.sort();
    let mut want: Vec<String> = refs.iter().map(|c| c.uid.clone()).collect();
    want.sort();
    assert_eq!(recorded, want);
    for c in &refs {
        let spec = p.checkpoint.load().unwrap().claims[&c.uid]
            .cdi_spec_path
            .clone();
        assert!(spec.exists(), "{} has no CDI spec", c.uid);
    }
    // Eight calls, each 20 ms of driver work under the lock: the seven
    // that queue behind the first are served together, not one by one.
    let (groups, served) = commit_groups(&registry);
    assert_eq!(served, 8.0);
    assert!(groups < 8, "8 calls took {groups} commits");

    let calls = refs.iter().map(|c| {
        let (p, c) = (p.clone(), c.clone());
        tokio::spawn(async move { p.unprepare(vec![c.clone()]).await.unwrap().remove(&c.uid) })
    });
    for answer in futures::future::join_all(calls).await {
        answer.unwrap().unwrap().unwrap();
    }
    assert!(in_checkpoint(&p).is_empty());
    assert!(driver.holders.lock().unwrap().is_empty());
    assert!(driver.violations.lock().unwrap().is_empty());
    let (_, served) = commit_groups(&registry);
    assert_eq!(served, 16.0);
}

#[tokio::test]
async fn a_device_freed_and_taken_in_one_group_is_never_held_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(dir.path(), &driver, &claims, Duration::from_secs(5));
    let old = add(&claims, "old", "dev-1");
    let new = add(&claims, "new", "dev-1");
    prepare(&p, &old).await.unwrap();
    // The new claim's prepare queues first, the old claim's unprepare
    // after it, both behind the lock: one group serves both, in order.
    let guard = p.lock.lock().await.unwrap();
    let (p1, p2, n, o) = (p.clone(), p.clone(), new.clone(), old.clone());
    let prep = tokio::spawn(async move { prepare(&p1, &n).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let unprep = tokio::spawn(async move { p2.unprepare(vec![o]).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(guard);
    unprep.await.unwrap().unwrap();
    prep.await.unwrap().unwrap();
    assert_eq!(in_checkpoint(&p), vec!["uid-new".to_string()]);
    assert!(driver.violations.lock().unwrap().is_empty());
}

/// The crash points of a group commit, in order, and whether the group's
/// claims are in the checkpoint after a kill there.
const CRASH_POINTS: [(&str, bool); 5] = [
    ("group:served", false),
    ("commit:staged", false),
    ("commit:renamed-first", false),
    ("commit:renamed", true),
    ("group:committed", true),
];

#[test]
fn a_kill_at_each_step_of_a_group_commit_leaves_a_checkpoint_of_what_was_answered() {
    let exe = std::env::current_exe().unwrap();
    for (point, group_recorded) in CRASH_POINTS {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(&exe)
            .args([
                "--exact",
                // The test's name as libtest knows it: its module path
                // without the crate, so that a move of the module keeps it.
                &format!(
                    "{}::crash_child",
                    module_path!().split_once("::").unwrap().1
                ),
                "--ignored",
                "--test-threads=1",
            ])
            .env("DRA_CORE_CRASH_AT", point)
            .env("DRA_CORE_CRASH_DIR", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(
            !status.success(),
            "{point}: the child was not killed there ({status})"
        );
        let answered: Vec<String> = std::fs::read_to_string(dir.path().join("answered"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(answered, ["uid-a", "uid-b"], "{point}");
        // The restart: a new pipeline on the same directory.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
            let refs: Vec<ClaimRef> = ["a", "b", "d", "e"]
                .iter()
                .map(|n| add(&claims, n, &format!("dev-{n}")))
                .collect();
            let p = pipeline(dir.path(), &driver, &claims, Duration::ZERO);
            let checkpoint = p.checkpoint.load().unwrap();
            let mut want = answered.clone();
            if group_recorded {
                want.extend(["uid-d".to_string(), "uid-e".to_string()]);
            }
            let recorded: Vec<String> = checkpoint.claims.keys().cloned().collect();
            assert_eq!(recorded, want, "{point}: the checkpoint after the kill");
            for (uid, c) in &checkpoint.claims {
                assert!(
                    c.cdi_spec_path.exists(),
                    "{point}: {uid} recorded without its spec"
                );
            }
            // Kubelet calls again for what it got no answer for: every
            // claim is prepared, each device for one claim.
            for c in &refs[2..] {
                prepare(&p, c)
                    .await
                    .unwrap_or_else(|e| panic!("{point}: {e}"));
            }
            assert_eq!(in_checkpoint(&p).len(), 4, "{point}");
            assert!(driver.violations.lock().unwrap().is_empty(), "{point}");
        });
    }
}

/// The child of the crash test: claims a and b prepared one by one (and
/// noted as answered), then d and e queued behind the lock so that one
/// group serves both; the process aborts at `DRA_CORE_CRASH_AT` in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_kill_at_each_step_of_a_group_commit_leaves_a_checkpoint_of_what_was_answered"]
async fn crash_child() {
    use std::io::Write;
    let dir = std::path::PathBuf::from(std::env::var("DRA_CORE_CRASH_DIR").unwrap());
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let p = pipeline(&dir, &driver, &claims, Duration::ZERO);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("answered"))
        .unwrap();
    let mut note = |uid: &str| {
        writeln!(log, "{uid}").unwrap();
        log.sync_all().unwrap();
    };
    for n in ["a", "b"] {
        let c = add(&claims, n, &format!("dev-{n}"));
        prepare(&p, &c).await.unwrap();
        note(&c.uid);
    }
    let group: Vec<ClaimRef> = ["d", "e"]
        .iter()
        .map(|n| add(&claims, n, &format!("dev-{n}")))
        .collect();
    let guard = p.lock.lock().await.unwrap();
    let calls: Vec<_> = group
        .iter()
        .map(|c| {
            let (p, c) = (p.clone(), c.clone());
            tokio::spawn(async move { prepare(&p, &c).await.map(|()| c.uid) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(guard);
    for call in calls {
        note(&call.await.unwrap().unwrap());
    }
}
