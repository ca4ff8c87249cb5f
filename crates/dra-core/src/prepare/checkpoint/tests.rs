//! The store: round trips, reboots, an unreadable boot id, corrupt files
//! (moved aside only under the lock), a newer version's file (refused,
//! read as far as it goes, never changed) and the committed file of every
//! format version (`testdata/`), with fields of a later build kept.

use super::*;
use crate::prepare::lock::DataDirLock;

mod versions;

/// The data-dir lock of `s`'s directory, held.
fn held(s: &CheckpointStore) -> crate::prepare::lock::DataDirGuard {
    let dir = s.path().parent().unwrap();
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(DataDirLock::new(dir).lock())
        .unwrap()
}

/// The store's read under the data-dir lock, as the pipeline makes it.
fn read_locked(s: &CheckpointStore) -> Read {
    s.read(&held(s)).unwrap()
}

fn read_current(s: &CheckpointStore) -> Checkpoint {
    match read_locked(s) {
        Read::Current(c) => c,
        Read::Newer(n) => panic!("newer: {}", n.refusal),
        Read::Damaged(_) => panic!("damaged"),
    }
}

fn store(dir: &Path, boot: &str) -> (CheckpointStore, prometheus::Registry) {
    let boot_path = dir.join("boot_id");
    std::fs::write(&boot_path, format!("{boot}\n")).unwrap();
    let registry = prometheus::Registry::new();
    let metrics = PluginMetrics::register(&registry).unwrap();
    (
        CheckpointStore::new(dir, boot_path, dir.join("cdi"), metrics),
        registry,
    )
}

fn sample(spec: PathBuf) -> PreparedClaim {
    PreparedClaim {
        namespace: "ns".into(),
        name: "c".into(),
        devices: vec![PreparedDevice {
            request_names: vec!["req".into()],
            pool: "node".into(),
            device: "dev-0".into(),
            admin_access: false,
            share_ids: vec![],
            cdi_device_ids: vec!["k8s.x/y=uid-dev-0".into()],
        }],
        cdi_spec_path: spec,
    }
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    let mut c = s.load().unwrap();
    assert!(c.claims.is_empty());
    c.claims
        .insert("uid".into(), sample(dir.path().join("spec.json")));
    s.save(&c).unwrap();
    assert_eq!(s.load().unwrap(), c);
}

/// The prepared gauges follow every save, and a fresh store (a driver
/// restart) reads them back from the file; a reboot zeroes them.
#[test]
fn prepared_gauges_follow_the_checkpoint() {
    let gauges = |registry: &prometheus::Registry| {
        let text = crate::prepare::metrics::tests::render(registry);
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse::<i64>().ok())
        };
        (
            value("aws_dra_checkpoint_claims"),
            value("aws_dra_checkpoint_devices"),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let (s, registry) = store(dir.path(), "boot-a");
    let mut c = s.load().unwrap();
    assert_eq!(gauges(&registry), (Some(0), Some(0)));
    let mut two = sample(dir.path().join("cdi/a.json"));
    two.devices.push(two.devices[0].clone());
    two.devices[1].device = "dev-1".into();
    c.claims.insert("a".into(), two);
    c.claims
        .insert("b".into(), sample(dir.path().join("cdi/b.json")));
    s.save(&c).unwrap();
    assert_eq!(gauges(&registry), (Some(2), Some(3)));
    c.claims.remove("a");
    s.save(&c).unwrap();
    assert_eq!(gauges(&registry), (Some(1), Some(1)));

    let (restarted, registry) = store(dir.path(), "boot-a");
    assert_eq!(gauges(&registry), (Some(0), Some(0)));
    restarted.load().unwrap();
    assert_eq!(gauges(&registry), (Some(1), Some(1)));

    let (rebooted, registry) = store(dir.path(), "boot-b");
    rebooted.load().unwrap();
    assert_eq!(gauges(&registry), (Some(0), Some(0)));
}

#[test]
fn boot_id_change_removes_only_the_claims_own_specs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    std::fs::create_dir_all(dir.path().join("cdi/sub")).unwrap();
    // Outside the root, escaping it, another claim's spec in the root,
    // another program's file in the root, and a spec of the right name
    // one level down: each recorded as the spec of claim uid-<i>.
    let victims = [
        dir.path().join("elsewhere_uid-0.json"),
        dir.path().join("cdi/../escaped_uid-1.json"),
        dir.path().join("cdi/k8s.x-y_someone-else.json"),
        dir.path().join("cdi/nvidia.yaml"),
        dir.path().join("cdi/sub/k8s.x-y_uid-4.json"),
    ];
    let on_disk = |v: &Path| -> PathBuf {
        let parent = v.parent().unwrap();
        if parent.ends_with("..") {
            dir.path().join(v.file_name().unwrap())
        } else {
            v.to_path_buf()
        }
    };
    let mut c = s.load().unwrap();
    for (i, v) in victims.iter().enumerate() {
        std::fs::write(on_disk(v), "keep").unwrap();
        c.claims.insert(format!("uid-{i}"), sample(v.clone()));
    }
    s.save(&c).unwrap();
    let (s2, _) = store(dir.path(), "boot-b");
    // `load` changes nothing; the locked read forgets.
    assert!(s2.load().unwrap().claims.is_empty());
    let on_file: Checkpoint = serde_json::from_slice(&std::fs::read(s.path()).unwrap()).unwrap();
    assert_eq!(on_file.claims.len(), victims.len());
    assert!(read_current(&s2).claims.is_empty());
    for v in &victims {
        assert_eq!(
            std::fs::read_to_string(on_disk(v)).unwrap(),
            "keep",
            "{}",
            v.display()
        );
    }
}

#[test]
fn boot_id_change_forgets_claims_and_their_specs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    let spec = dir.path().join("cdi/k8s.x-y_uid.json");
    std::fs::write(&spec, "{}").unwrap();
    let mut c = s.load().unwrap();
    c.claims.insert("uid".into(), sample(spec.clone()));
    s.save(&c).unwrap();
    let (s2, _) = store(dir.path(), "boot-b");
    assert!(s2.load().unwrap().claims.is_empty());
    assert!(spec.exists(), "load changes nothing");
    let loaded = read_current(&s2);
    assert!(loaded.claims.is_empty());
    assert_eq!(loaded.boot_id, "boot-b");
    assert!(!spec.exists());
    assert_eq!(s2.load().unwrap().boot_id, "boot-b", "rewritten");
}

/// A boot id that cannot be read forgets nothing: the claims and their
/// specs stay, and the next boot id read is adopted, not taken for a
/// reboot (that used to delete every spec, twice).
#[test]
fn unreadable_boot_id_forgets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("cdi")).unwrap();
    let spec = dir.path().join("cdi/a.json");
    std::fs::write(&spec, "{}").unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    let mut c = s.load().unwrap();
    c.claims.insert("a".into(), sample(spec.clone()));
    s.save(&c).unwrap();

    for unreadable in ["missing", "empty"] {
        let boot = dir.path().join("boot_id");
        match unreadable {
            "missing" => std::fs::remove_file(&boot).unwrap(),
            _ => std::fs::write(&boot, "\n").unwrap(),
        }
        let loaded = s.load().unwrap();
        assert_eq!(loaded.claims.len(), 1, "{unreadable}");
        assert_eq!(loaded.boot_id, "boot-a", "{unreadable}");
        assert!(spec.exists(), "{unreadable}");
        // A save while unreadable keeps the recorded boot id.
        s.save(&loaded).unwrap();
        std::fs::write(&boot, "boot-a\n").unwrap();
    }

    // A checkpoint written with no boot id at all (an older build wrote
    // "" when the read failed) adopts the next one read.
    let mut no_id = s.load().unwrap();
    no_id.boot_id.clear();
    s.save(&no_id).unwrap();
    let (later, _) = store(dir.path(), "boot-b");
    let loaded = later.load().unwrap();
    assert_eq!(loaded.claims.len(), 1);
    assert_eq!(loaded.boot_id, "boot-b");
    assert!(spec.exists());
}

/// A newer build's checkpoint is refused by name and left exactly as
/// it was (a rollback must not forget what the newer driver prepared).
#[test]
fn newer_version_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (s, registry) = store(dir.path(), "boot-a");
    let newer = r#"{"version":2,"bootId":"boot-a","claims":{},"more":1}"#;
    std::fs::write(s.path(), newer).unwrap();
    let e = s.load().unwrap_err();
    assert!(
        matches!(e, CheckpointError::Newer { version: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("newer than this build's 1"), "{e}");
    assert!(matches!(read_locked(&s), Read::Newer(_)));
    assert_eq!(std::fs::read_to_string(s.path()).unwrap(), newer);
    let text = crate::prepare::metrics::tests::render(&registry);
    assert!(
        text.contains("aws_dra_checkpoint_errors_total{reason=\"newer\"} 2"),
        "{text}"
    );
}

/// A corrupt file is moved aside only by the read under the data-dir lock
/// (a surge pod may be serving from it); `load` reports it and leaves it.
#[test]
fn corrupt_file_is_moved_aside_under_the_lock_and_counted() {
    for garbage in [
        "{not json",
        r#"{"version":0,"bootId":"boot-a","claims":{}}"#,
        r#"{"bootId":"boot-a","claims":{}}"#,
        r#"{"version":"1","bootId":"boot-a","claims":{}}"#,
        r#"{"version":1,"bootId":"boot-a","claims":[]}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (s, registry) = store(dir.path(), "boot-a");
        std::fs::write(s.path(), garbage).unwrap();
        let e = s.load().unwrap_err();
        assert!(
            matches!(e, CheckpointError::Corrupt { .. }),
            "{garbage}: {e}"
        );
        assert_eq!(std::fs::read_to_string(s.path()).unwrap(), garbage);

        let Read::Damaged(empty) = read_locked(&s) else {
            panic!("{garbage}: not reported as damaged");
        };
        assert!(empty.claims.is_empty());
        assert!(!s.path().exists());
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("corrupt"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(std::fs::read_to_string(aside[0].path()).unwrap(), garbage);
        let text = crate::prepare::metrics::tests::render(&registry);
        assert!(
            text.contains("aws_dra_checkpoint_errors_total{reason=\"corrupt\"} 1"),
            "{text}"
        );
    }
}

/// Claims unprepared while the checkpoint was a newer version's are listed
/// beside it; the next read of the checkpoint as this build's own (under
/// the lock) drops them from it and removes the list, as does a read that
/// finds no checkpoint (the list was for a file that is gone).
#[test]
fn released_claims_are_dropped_by_the_next_build_that_owns_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    let list = dir.path().join("checkpoint.released.json");
    let newer =
        r#"{"version":2,"bootId":"boot-a","claims":{"a":{"devices":[]},"b":{"devices":[]}}}"#;
    std::fs::write(s.path(), newer).unwrap();
    s.record_released(&held(&s), &["a".into()]).unwrap();
    let Read::Newer(n) = read_locked(&s) else {
        panic!("version 2 read as this build's")
    };
    assert_eq!(
        n.claims.unwrap().into_keys().collect::<Vec<_>>(),
        ["b"],
        "a is unprepared"
    );
    assert_eq!(std::fs::read_to_string(s.path()).unwrap(), newer);

    // The file becomes this version's (the newer driver rolled forward).
    let mut own = Checkpoint {
        version: CHECKPOINT_VERSION,
        boot_id: "boot-a".into(),
        claims: BTreeMap::new(),
    };
    for uid in ["a", "b"] {
        own.claims.insert(
            uid.into(),
            sample(dir.path().join(format!("cdi/x_{uid}.json"))),
        );
    }
    s.save(&own).unwrap();
    assert_eq!(s.load().unwrap().claims.len(), 1, "the view drops it");
    assert!(list.exists(), "load changes nothing");
    assert_eq!(
        read_current(&s).claims.into_keys().collect::<Vec<_>>(),
        ["b"]
    );
    assert!(!list.exists());
    assert_eq!(s.load().unwrap().claims.len(), 1, "dropped on disk");

    s.record_released(&held(&s), &["b".into()]).unwrap();
    std::fs::remove_file(s.path()).unwrap();
    assert!(read_current(&s).claims.is_empty());
    assert!(!list.exists(), "no checkpoint, no list");
}
