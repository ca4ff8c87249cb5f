//! The checkpoint across restarts: unprepare without the API, a corrupt
//! file moved aside.

use super::*;

#[tokio::test]
async fn restart_unprepares_from_checkpoint_without_api() {
    let h = start().await;
    let uid = "6a000000-0000-4000-8000-000000000001";
    h.claims.insert(claim(
        uid,
        "c",
        &[("r", "dev-0", false), ("r2", "dev-1", false)],
        vec![],
    ));
    assert_eq!(
        prepare_v1(&h, vec![v1_claim(uid, "c")]).await.claims[uid].error,
        ""
    );
    let spec = h
        .root
        .join("cdi")
        .join(format!("k8s.{DRIVER}-dev_{uid}.json"));
    assert!(spec.exists());
    let (dir, _) = stop(h).await;

    // A new instance over the same directories, with an empty claim source.
    let h = start_at(dir, TestDriver::default(), false).await;
    let un = v1_client(&h)
        .await
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim(uid, "c")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[uid].error, "");
    assert_eq!(h.claims.get_count(), 0, "unprepare never reads the API");
    let calls = h.driver.unprepares.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]
            .1
            .iter()
            .map(|d| d.device.as_str())
            .collect::<Vec<_>>(),
        ["dev-0", "dev-1"]
    );
    assert!(!spec.exists());
    stop(h).await;
}

#[tokio::test]
async fn corrupt_checkpoint_is_moved_aside_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("plugins").join(DRIVER);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("checkpoint.json"),
        b"{\"version\": 1, \"claims\": [",
    )
    .unwrap();
    let h = start_at(dir, TestDriver::default(), false).await;
    let uid = "7a000000-0000-4000-8000-000000000001";
    h.claims
        .insert(claim(uid, "c", &[("r", "dev-0", false)], vec![]));
    assert_eq!(
        prepare_v1(&h, vec![v1_claim(uid, "c")]).await.claims[uid].error,
        ""
    );
    let names: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("checkpoint.json.corrupt-")),
        "{names:?}"
    );
    assert!(metrics_text(&h).contains("aws_dra_checkpoint_errors_total{reason=\"corrupt\"} 1"));
    stop(h).await;
}
