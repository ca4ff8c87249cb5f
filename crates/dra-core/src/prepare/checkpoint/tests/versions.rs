//! The committed file of every format version (`testdata/`): this build
//! writes version 1 byte for byte as committed and reads it back, keeps the
//! fields of a later build of the same version, and reads of a version 2
//! file (a field changed type) only what unprepare needs, changing nothing.

use serde_json::Value;

use super::*;

const V1: &str = include_str!("../testdata/v1.json");
const V1_LATER_FIELDS: &str = include_str!("../testdata/v1-later-fields.json");
const V2_CHANGED_TYPE: &str = include_str!("../testdata/v2-changed-type.json");

/// The claims of `testdata/v1.json`.
fn v1_sample() -> Checkpoint {
    let device = |requests: &[&str], device: &str, admin: bool, ids: &[&str], shares: &[&str]| {
        PreparedDevice {
            request_names: requests.iter().map(|s| s.to_string()).collect(),
            pool: "node-1".into(),
            device: device.into(),
            admin_access: admin,
            cdi_device_ids: ids.iter().map(|s| s.to_string()).collect(),
            share_ids: shares.iter().map(|s| s.to_string()).collect(),
        }
    };
    let claim = |name: &str, device: PreparedDevice| PreparedClaim {
        namespace: "ns".into(),
        name: name.into(),
        devices: vec![device],
        cdi_spec_path: format!("/var/run/cdi/k8s.test.example.com-dev_uid-{name}.json").into(),
    };
    let a = device(
        &["gpu"],
        "dev-0",
        false,
        &[
            "k8s.test.example.com/dev=uid-a-dev-0",
            "k8s.test.example.com/dev=uid-a_gpu",
        ],
        &[],
    );
    let b = device(
        &["nic", "monitor"],
        "dev-1",
        true,
        &["k8s.test.example.com/dev=uid-b-dev-1"],
        &["share-1", "share-2"],
    );
    Checkpoint {
        version: 1,
        boot_id: "boot-a".into(),
        claims: BTreeMap::from([
            ("uid-a".to_string(), claim("a", a)),
            ("uid-b".to_string(), claim("b", b)),
        ]),
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

/// Every version up to this build's has its committed file, and this build
/// writes its own byte for byte as committed: a change to what it writes
/// fails here. A new field an older build may ignore keeps the version
/// (regenerate `v1.json`); a change an older build would misread (a type,
/// a meaning, a field it needs gone) bumps `CHECKPOINT_VERSION` and commits
/// `v<new>.json` beside this one (module doc).
#[test]
fn this_build_writes_version_1_as_committed_and_reads_it() {
    assert_eq!(
        CHECKPOINT_VERSION, 1,
        "a new version needs its fixture here"
    );
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    s.save(&v1_sample()).unwrap();
    let written = std::fs::read_to_string(s.path()).unwrap();
    assert_eq!(
        written,
        V1.strip_suffix('\n').unwrap_or(V1),
        "the checkpoint format changed (see this test's doc)"
    );
    std::fs::write(s.path(), V1).unwrap();
    assert_eq!(s.load().unwrap(), v1_sample());
    assert_eq!(read_current(&s), v1_sample());

    // Written in this build's version whatever the value says (an empty
    // `Checkpoint::default()` is an empty checkpoint, not a corrupt one).
    let mut unstamped = v1_sample();
    unstamped.version = 0;
    s.save(&unstamped).unwrap();
    assert_eq!(std::fs::read_to_string(s.path()).unwrap(), written);
    s.save(&Checkpoint::default()).unwrap();
    assert!(s.load().unwrap().claims.is_empty());
}

/// A later build's additive fields (top level, claim, device) are written
/// back as read while this build leaves their claim alone; a claim it
/// changed is written in its own format.
#[test]
fn fields_of_a_later_build_survive_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    std::fs::write(s.path(), V1_LATER_FIELDS).unwrap();
    let mut loaded = read_current(&s);
    assert_eq!(loaded, v1_sample(), "the known fields read as usual");

    s.save(&loaded).unwrap();
    let written = json(&std::fs::read_to_string(s.path()).unwrap());
    assert_eq!(written, json(V1_LATER_FIELDS));

    // Another instance of this build (its own store) reads and rewrites it.
    let (other, _) = store(dir.path(), "boot-a");
    let mut c = other.load().unwrap();
    c.claims.remove("uid-b");
    other.save(&c).unwrap();
    let mut want = json(V1_LATER_FIELDS);
    want["claims"].as_object_mut().unwrap().remove("uid-b");
    assert_eq!(json(&std::fs::read_to_string(s.path()).unwrap()), want);

    // A claim this build changes loses what the entry it replaced had.
    read_current(&s);
    loaded.claims.remove("uid-b");
    loaded.claims.get_mut("uid-a").unwrap().devices[0].device = "dev-9".into();
    s.save(&loaded).unwrap();
    let written = json(&std::fs::read_to_string(s.path()).unwrap());
    assert_eq!(written["nodeState"], json(r#"{"fabric":"ready"}"#));
    let a = &written["claims"]["uid-a"];
    assert!(a.get("preparedAt").is_none(), "{a}");
    assert!(a["devices"][0].get("healthCheck").is_none(), "{a}");
    assert_eq!(a["devices"][0]["device"], "dev-9");
}

/// Version 2 with a field of another type: refused, never rewritten nor
/// moved, and read as far as unprepare needs (a spec path that does not
/// read is left empty; a claim whose devices do not read says why).
#[test]
fn version_2_with_a_changed_type_is_read_for_unprepare_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (s, registry) = store(dir.path(), "boot-a");
    std::fs::write(s.path(), V2_CHANGED_TYPE).unwrap();
    let e = s.load().unwrap_err();
    assert!(
        matches!(e, CheckpointError::Newer { version: 2, .. }),
        "{e}"
    );
    let Read::Newer(newer) = read_locked(&s) else {
        panic!("version 2 read as this build's");
    };
    assert_eq!(newer.version, 2);
    assert!(
        newer
            .refusal
            .contains("version 2, newer than this build's 1"),
        "{}",
        newer.refusal
    );
    let claims = newer.claims.unwrap();
    let a = claims["uid-a"].as_ref().unwrap();
    assert_eq!((a.namespace.as_str(), a.name.as_str()), ("ns", "a"));
    assert_eq!(a.devices[0].device, "dev-1");
    assert_eq!(a.cdi_spec_path, PathBuf::new());
    let b = claims["uid-b"].as_ref().unwrap_err();
    assert!(b.contains("its devices"), "{b}");
    assert_eq!(std::fs::read_to_string(s.path()).unwrap(), V2_CHANGED_TYPE);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains("corrupt")), "{names:?}");
    let text = crate::prepare::metrics::tests::render(&registry);
    assert!(
        text.contains("aws_dra_checkpoint_errors_total{reason=\"newer\"} 2"),
        "{text}"
    );
    assert!(!text.contains("reason=\"corrupt\""), "{text}");

    // Claims that are not a map at all: nothing reads, nothing changes.
    let no_map = r#"{"version":3,"claims":[{"uid":"uid-a"}]}"#;
    std::fs::write(s.path(), no_map).unwrap();
    let Read::Newer(newer) = read_locked(&s) else {
        panic!("version 3 read as this build's");
    };
    assert!(newer.claims.is_err());
    assert_eq!(std::fs::read_to_string(s.path()).unwrap(), no_map);
}

/// The readiness follows the file read: the refusal while it is a newer
/// version's, nothing once it is this build's again.
#[test]
fn the_newer_signal_follows_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = store(dir.path(), "boot-a");
    let newer = s.newer();
    assert_eq!(*newer.borrow(), None);
    std::fs::write(s.path(), V2_CHANGED_TYPE).unwrap();
    read_locked(&s);
    assert!(
        newer
            .borrow()
            .as_deref()
            .is_some_and(|r| r.contains("version 2"))
    );
    std::fs::write(s.path(), V1).unwrap();
    read_locked(&s);
    assert_eq!(*newer.borrow(), None);
}
