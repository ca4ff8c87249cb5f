//! What prepare does with claims: actionable per-claim errors, double
//! allocation and admin access, many prepares at once.

use super::*;

#[tokio::test]
async fn per_claim_errors_are_actionable() {
    let h = start().await;
    let bad_cfg = "3a000000-0000-4000-8000-000000000001";
    let unknown_field = "3a000000-0000-4000-8000-000000000002";
    let wrong_kind = "3a000000-0000-4000-8000-000000000003";
    let replaced = "3a000000-0000-4000-8000-000000000004";
    let missing = "3a000000-0000-4000-8000-000000000005";
    let good = "3a000000-0000-4000-8000-000000000006";
    let unallocated = "3a000000-0000-4000-8000-000000000007";
    let cfg = |v: serde_json::Value| {
        vec![
            lanes_config(
                "FromClass",
                serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 2}),
            ),
            lanes_config("FromClaim", v),
        ]
    };
    h.claims.insert(claim(bad_cfg, "bad-cfg", &[("r", "dev-0", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 9}))));
    h.claims.insert(claim(unknown_field, "unknown-field", &[("r", "dev-1", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lane": 2}))));
    h.claims.insert(claim(
        wrong_kind,
        "wrong-kind",
        &[("r", "dev-2", false)],
        cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "OtherConfig"})),
    ));
    h.claims.insert(claim(
        "someone-else",
        "replaced",
        &[("r", "dev-3", false)],
        vec![],
    ));
    h.claims.insert(claim(good, "good", &[("r", "dev-4", false)], cfg(serde_json::json!({"apiVersion": "test.example.com/v1", "kind": "TestConfig", "lanes": 3}))));
    let mut c = claim(unallocated, "unallocated", &[], vec![]);
    c.status = None;
    h.claims.insert(c);
    let resp = prepare_v1(
        &h,
        vec![
            v1_claim(bad_cfg, "bad-cfg"),
            v1_claim(unknown_field, "unknown-field"),
            v1_claim(wrong_kind, "wrong-kind"),
            v1_claim(replaced, "replaced"),
            v1_claim(missing, "missing"),
            v1_claim(good, "good"),
            v1_claim(unallocated, "unallocated"),
        ],
    )
    .await;
    assert_eq!(resp.claims.len(), 7, "every claim gets an entry");
    let err = |uid: &str| resp.claims[uid].error.clone();
    assert_eq!(
        err(bad_cfg),
        "ResourceClaim ns/bad-cfg: opaque config #1 (from ResourceClaim): field `lanes`: value 9 is out of range; accepted values: 1 to 4"
    );
    assert_eq!(
        err(unknown_field),
        "ResourceClaim ns/unknown-field: opaque config #1 (from ResourceClaim): field `lane`: unknown field; accepted fields: apiVersion, kind, lanes"
    );
    assert_eq!(
        err(wrong_kind),
        "ResourceClaim ns/wrong-kind: opaque config #1 (from ResourceClaim): field `kind`: unsupported value \"OtherConfig\"; accepted values: \"TestConfig\""
    );
    assert_eq!(
        err(replaced),
        format!(
            "ResourceClaim ns/replaced has UID \"someone-else\" but kubelet asked for \"{replaced}\": the claim was deleted and recreated; delete the pod so that it is scheduled with the new claim"
        )
    );
    assert_eq!(
        err(missing),
        "ResourceClaim ns/missing not found; it may have been deleted"
    );
    assert_eq!(
        err(unallocated),
        "ResourceClaim ns/unallocated is not allocated (status.allocation is empty); wait for the scheduler to allocate it"
    );
    assert_eq!(err(good), "");
    // Claim config (lanes 3) wins over class config (lanes 2).
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            h.root
                .join("cdi")
                .join(format!("k8s.{DRIVER}-dev_{good}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"][0],
        "TEST_LANES=3"
    );
    stop(h).await;
}

#[tokio::test]
async fn double_allocation_is_refused_unless_admin_access() {
    let h = start().await;
    let a = "4a000000-0000-4000-8000-00000000000a";
    let b = "4a000000-0000-4000-8000-00000000000b";
    let admin = "4a000000-0000-4000-8000-0000000000ad";
    h.claims
        .insert(claim(a, "a", &[("r", "dev-7", false)], vec![]));
    h.claims
        .insert(claim(b, "b", &[("r", "dev-7", false)], vec![]));
    h.claims
        .insert(claim(admin, "admin", &[("r", "dev-7", true)], vec![]));
    let resp = prepare_v1(
        &h,
        vec![v1_claim(a, "a"), v1_claim(b, "b"), v1_claim(admin, "admin")],
    )
    .await;
    assert_eq!(resp.claims[a].error, "");
    assert_eq!(
        resp.claims[b].error,
        format!(
            "ResourceClaim ns/b: device node/dev-7 is already prepared for claim ns/a (uid {a}); refusing to give one device to two claims. Wait until that claim is unprepared (its pods are gone), then retry"
        )
    );
    assert_eq!(resp.claims[admin].error, "");
    stop(h).await;
}

/// An `adminAccess` claim shares the device by design: prepared first, it
/// must not block the regular claim that comes after it (this was refused),
/// and prepared second it is not blocked either. Each order in its own call,
/// as kubelet sends them for two pods.
#[tokio::test]
async fn admin_access_and_a_regular_claim_share_a_device_in_either_order() {
    let admin = "4a000000-0000-4000-8000-0000000000ad";
    let regular = "4a000000-0000-4000-8000-0000000000e1";
    for admin_first in [true, false] {
        let h = start().await;
        h.claims
            .insert(claim(admin, "admin", &[("r", "dev-7", true)], vec![]));
        h.claims
            .insert(claim(regular, "regular", &[("r", "dev-7", false)], vec![]));
        let order = if admin_first {
            [(admin, "admin"), (regular, "regular")]
        } else {
            [(regular, "regular"), (admin, "admin")]
        };
        for (uid, name) in order {
            let resp = prepare_v1(&h, vec![v1_claim(uid, name)]).await;
            assert_eq!(
                resp.claims[uid].error, "",
                "{name} (admin first: {admin_first})"
            );
            assert_eq!(resp.claims[uid].devices.len(), 1, "{name}");
        }
        stop(h).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_prepares() {
    let h = Arc::new(start().await);
    let uids: Vec<String> = (0..200)
        .map(|i| format!("5a000000-0000-4000-8000-{i:012}"))
        .collect();
    for (i, uid) in uids.iter().enumerate() {
        h.claims.insert(claim(
            uid,
            &format!("c{i}"),
            &[("r", &format!("dev-{i}"), false)],
            vec![],
        ));
    }
    let started = std::time::Instant::now();
    let tasks: Vec<_> = uids
        .iter()
        .enumerate()
        .map(|(i, uid)| {
            let h = h.clone();
            let uid = uid.clone();
            tokio::spawn(
                async move { prepare_v1(&h, vec![v1_claim(&uid, &format!("c{i}"))]).await },
            )
        })
        .collect();
    for (t, uid) in tasks.into_iter().zip(&uids) {
        let resp = t.await.unwrap();
        assert_eq!(resp.claims[uid].error, "", "claim {uid}");
    }
    eprintln!("200 concurrent prepares took {:?}", started.elapsed());
    // Repeated concurrent prepares of one shared claim: one driver call, one answer.
    let shared = &uids[0];
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let h = h.clone();
            let uid = shared.clone();
            tokio::spawn(async move { prepare_v1(&h, vec![v1_claim(&uid, "c0")]).await })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(h.driver.prepares.lock().unwrap().len(), 200);
    let checkpoint: serde_json::Value = serde_json::from_slice(
        &std::fs::read(h.root.join("plugins").join(DRIVER).join("checkpoint.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(checkpoint["claims"].as_object().unwrap().len(), 200);
    let h = Arc::try_unwrap(h).ok().unwrap();
    stop(h).await;
}
