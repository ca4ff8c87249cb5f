//! The pipeline against a checkpoint written by a newer driver (the
//! committed version 2 file, in which a field changed type): the claims it
//! records are unprepared from it (the driver gets their devices, the CDI
//! spec goes), one whose devices do not read is refused, a recorded claim
//! is answered while its spec is in place, a new claim is refused naming
//! both versions, and the file is byte for byte what the newer driver wrote;
//! the claims unprepared meanwhile are dropped by the next build that reads
//! the file as its own.

use super::*;

const V2: &str = include_str!("../../checkpoint/testdata/v2-changed-type.json");

#[tokio::test]
async fn a_newer_checkpoint_serves_unprepare_refuses_prepare_and_stays_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let registry = prometheus::Registry::new();
    let p = pipeline_with_metrics(dir.path(), &driver, &claims, Duration::ZERO, &registry);
    // Claim a, prepared by this build; then a newer driver took over and
    // recorded it (and b) in its version 2.
    let a = add(&claims, "a", "dev-1");
    prepare(&p, &a).await.unwrap();
    let spec = p.cdi.spec_path(&a.uid);
    assert!(spec.exists());
    std::fs::write(p.checkpoint.path(), V2).unwrap();

    // kubelet asks again for a (its restart): answered from the record.
    let answers = p.prepare(vec![a.clone()]).await.unwrap();
    let devices = answers[&a.uid].as_ref().unwrap();
    assert_eq!(
        devices[0].cdi_device_ids,
        ["k8s.test.example.com/dev=uid-a-dev-1"]
    );

    // A new claim: refused, both versions named; the driver never called.
    let c = add(&claims, "c", "dev-3");
    let refused = prepare(&p, &c).await.unwrap_err();
    assert!(
        refused.starts_with("ResourceClaim ns/c: not prepared: checkpoint ")
            && refused.contains("has version 2, newer than this build's 1"),
        "{refused}"
    );
    assert_eq!(*driver.prepares.lock().unwrap(), ["uid-a"]);

    // a unprepared from the record (devices from the file, its spec by its
    // UID: the recorded path is an object now); b's devices do not read.
    let b = ClaimRef {
        namespace: "ns".into(),
        name: "b".into(),
        uid: "uid-b".into(),
    };
    let answers = p.unprepare(vec![a.clone(), b.clone()]).await.unwrap();
    assert_eq!(answers[&a.uid], Ok(()));
    assert!(!spec.exists());
    assert!(driver.holders.lock().unwrap().is_empty(), "dev-1 released");
    let refused = answers[&b.uid].as_ref().unwrap_err();
    assert!(
        refused.contains("records it in a form this build (version 1) cannot read")
            && refused.contains("a driver that reads version 2"),
        "{refused}"
    );

    // a again: its spec is gone, so it is not answered from the record.
    assert!(prepare(&p, &a).await.is_err());

    assert_eq!(std::fs::read_to_string(p.checkpoint.path()).unwrap(), V2);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(
            !name.to_string_lossy().contains("checkpoint.json."),
            "{name:?}"
        );
    }
    let list = dir.path().join("checkpoint.released.json");
    let listed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&list).unwrap()).unwrap();
    assert_eq!(listed, serde_json::json!({"claims": ["uid-a"]}));

    // The driver rolled forward reads the file as its own (here: this
    // build, with a file of its version that still records a): a is
    // dropped, the list goes.
    let recorded = |uid: &str, device: &str| PreparedClaim {
        namespace: "ns".into(),
        name: uid.trim_start_matches("uid-").into(),
        devices: vec![PreparedDevice {
            request_names: vec!["r".into()],
            pool: "node".into(),
            device: device.into(),
            admin_access: false,
            cdi_device_ids: vec![],
            share_ids: vec![],
        }],
        cdi_spec_path: p.cdi.spec_path(uid),
    };
    let mut own = Checkpoint {
        version: crate::prepare::checkpoint::CHECKPOINT_VERSION,
        boot_id: "boot-1".into(),
        claims: BTreeMap::new(),
    };
    own.claims
        .insert("uid-a".into(), recorded("uid-a", "dev-1"));
    own.claims
        .insert("uid-z".into(), recorded("uid-z", "dev-5"));
    p.checkpoint.save(&own).unwrap();
    let (_, r) = claim("nobody", "dev-9");
    assert_eq!(p.unprepare(vec![r]).await.unwrap().len(), 1);
    assert_eq!(in_checkpoint(&p), ["uid-z"]);
    assert!(!list.exists());

    let text = crate::prepare::metrics::tests::render(&registry);
    assert!(!text.contains("reason=\"corrupt\""), "{text}");
    assert!(
        text.contains("aws_dra_checkpoint_errors_total{reason=\"newer\"} 4"),
        "{text}"
    );
}
