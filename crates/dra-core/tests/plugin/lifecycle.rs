//! Registration, both DRA API versions end to end, socket names (and who
//! removes them when two instances share them) and the health service.

use super::*;

#[tokio::test]
async fn register_prepare_unprepare_v1() {
    let h = start().await;
    let info =
        dra_core::testing::self_check(&h.running.sockets.registration, &h.running.sockets.plugin)
            .await
            .unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(
        info.endpoint,
        h.root
            .join("plugins")
            .join(DRIVER)
            .join("dra.sock")
            .to_string_lossy()
    );
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(
        h.running.sockets.registration,
        h.root.join("registry").join(format!("{DRIVER}-reg.sock"))
    );

    let uid = "1a2b3c4d-0000-4000-8000-000000000001";
    h.claims
        .insert(claim(uid, "c1", &[("req/sub", "dev-0", false)], vec![]));
    let first = prepare_v1(&h, vec![v1_claim(uid, "c1")]).await;
    let entry = &first.claims[uid];
    assert_eq!(entry.error, "");
    assert_eq!(entry.devices.len(), 1, "only our driver's results");
    let d = &entry.devices[0];
    assert_eq!(d.request_names, ["req"]);
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        ("node", "dev-0")
    );
    // The device's own CDI device, then the one that mounts its request's
    // device attributes file: kubelet hands the runtime only the ids in the
    // answer, so a mount not named here would never reach the container.
    assert_eq!(
        d.cdi_device_ids,
        [
            format!("k8s.{DRIVER}/dev={uid}-dev-0"),
            format!("k8s.{DRIVER}/dev={uid}_req"),
        ]
    );
    assert_eq!(d.share_id, None);
    let spec = h
        .root
        .join("cdi")
        .join(format!("k8s.{DRIVER}-dev_{uid}.json"));
    let parsed = container_device_interface::spec::read_spec(&spec, 0).unwrap();
    assert!(parsed.get_device(&format!("{uid}-dev-0")).is_some());
    assert!(parsed.get_device(&format!("{uid}_req")).is_some());
    let attributes = h
        .root
        .join("dra-device-attributes")
        .join(format!("{DRIVER}-{uid}-req.json"));
    assert!(attributes.exists(), "{}", attributes.display());

    // Idempotent: same answer, driver not called again.
    let again = prepare_v1(&h, vec![v1_claim(uid, "c1")]).await;
    assert_eq!(again, first);
    assert_eq!(h.driver.prepares.lock().unwrap().len(), 1);

    let mut client = v1_client(&h).await;
    for _ in 0..2 {
        let un = client
            .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![v1_claim(uid, "c1")],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(un.claims[uid].error, "");
    }
    assert!(!spec.exists());
    assert!(
        !attributes.exists(),
        "the attributes file goes with the claim"
    );
    assert_eq!(
        h.driver.unprepares.lock().unwrap().len(),
        1,
        "second unprepare is a no-op"
    );
    let text = metrics_text(&h);
    assert!(
        text.contains("aws_dra_plugin_claims_total{operation=\"prepare\",result=\"success\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("aws_dra_plugin_claims_total{operation=\"unprepare\",result=\"success\"} 2"),
        "{text}"
    );
    stop(h).await;
}

#[tokio::test]
async fn register_prepare_unprepare_v1beta1_and_registration_failure() {
    let h = start().await;
    let uid = "2a2b3c4d-0000-4000-8000-000000000002";
    h.claims
        .insert(claim(uid, "c2", &[("req", "dev-1", false)], vec![]));
    let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let claim = dra_v1beta1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: "c2".into(),
    };
    let resp = client
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims[uid].error, "");
    assert_eq!(
        resp.claims[uid].devices[0].cdi_device_ids,
        [
            format!("k8s.{DRIVER}/dev={uid}-dev-1"),
            format!("k8s.{DRIVER}/dev={uid}_req"),
        ]
    );
    let un = client
        .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![claim],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[uid].error, "");

    let mut reg_client = reg::registration_client::RegistrationClient::new(
        unix_channel(&h.running.sockets.registration).await.unwrap(),
    );
    // The lifecycle signal the readiness gate waits on follows kubelet's
    // word: unset until registered, set by it, unset by a rejection.
    assert!(!*h.running.registered.borrow());
    reg_client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert!(*h.running.registered.borrow());
    reg_client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "boom".into(),
        })
        .await
        .unwrap();
    assert!(!*h.running.registered.borrow());
    let text = metrics_text(&h);
    assert!(
        text.contains("aws_dra_plugin_registration_failures_total 1"),
        "{text}"
    );
    assert!(text.contains("aws_dra_plugin_registered 0"), "{text}");
    stop(h).await;
}

#[tokio::test]
async fn pod_uid_socket_names_and_stale_socket_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let o = options(dir.path(), Some("pod-123"));
    let s = o.sockets();
    assert_eq!(
        s.registration,
        dir.path()
            .join("registry")
            .join(format!("{DRIVER}-pod-123-reg.sock"))
    );
    assert_eq!(
        s.plugin,
        dir.path()
            .join("plugins")
            .join(DRIVER)
            .join("dra-pod-123.sock")
    );
    // A stale socket file from a crashed instance.
    std::fs::create_dir_all(s.registration.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&s.registration).unwrap());
    std::fs::write(dir.path().join("boot_id"), "b").unwrap();
    let token = CancellationToken::new();
    let running = KubeletPlugin::new(
        TestDriver::default(),
        Arc::new(InMemoryClaimSource::new()),
        o,
        PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
    )
    .start(token.clone())
    .await
    .unwrap();
    dra_core::testing::self_check(&running.sockets.registration, &running.sockets.plugin)
        .await
        .unwrap();
    token.cancel();
    running.wait().await.unwrap();
    assert!(!s.registration.exists() && !s.plugin.exists());
}

/// Without a pod UID a surge replacement binds the same socket names. The
/// old instance's shutdown must leave the new one's sockets: a registration
/// socket removed is how kubelet learns a driver is gone.
#[tokio::test]
async fn an_old_instance_shutting_down_leaves_the_sockets_of_its_replacement() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let start_one = |token: CancellationToken| {
        KubeletPlugin::new(
            TestDriver::default(),
            Arc::new(InMemoryClaimSource::new()),
            options(dir.path(), None),
            PluginMetrics::register(&prometheus::Registry::new()).unwrap(),
        )
        .start(token)
    };
    let identity = |path: &Path| {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.dev(), meta.ino())
    };
    let (old_token, new_token) = (CancellationToken::new(), CancellationToken::new());
    let old = start_one(old_token.clone()).await.unwrap();
    let s = old.sockets.clone();
    let old_ids = (identity(&s.registration), identity(&s.plugin));
    let new = start_one(new_token.clone()).await.unwrap();
    assert_eq!(new.sockets, s, "the same names without a pod UID");
    let new_ids = (identity(&s.registration), identity(&s.plugin));
    assert!(
        new_ids.0 != old_ids.0 && new_ids.1 != old_ids.1,
        "the replacement bound sockets of its own"
    );

    old_token.cancel();
    tokio::time::timeout(Duration::from_secs(10), old.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (identity(&s.registration), identity(&s.plugin)),
        new_ids,
        "the old instance's shutdown left the replacement's sockets in place"
    );
    // And the replacement still answers on them, as kubelet would call it.
    let info = dra_core::testing::self_check(&s.registration, &s.plugin)
        .await
        .unwrap();
    assert_eq!(info.name, DRIVER);

    new_token.cancel();
    tokio::time::timeout(Duration::from_secs(10), new.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!s.registration.exists() && !s.plugin.exists());
}

#[tokio::test]
async fn health_service_is_advertised_and_streams() {
    let h = start_at(tempfile::tempdir().unwrap(), TestDriver::default(), true).await;
    let info =
        dra_core::testing::self_check(&h.running.sockets.registration, &h.running.sockets.plugin)
            .await
            .unwrap();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    // kubelet 1.37 opens the v1 stream; older kubelets the v1alpha1 one.
    let mut v1 = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let first_v1 = v1
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first_v1.devices.len(), 1);
    assert_eq!(
        first_v1.devices[0].health,
        health_v1::HealthStatus::Healthy as i32
    );
    assert_eq!(first_v1.devices[0].health_check_timeout_seconds, 45);
    let mut client = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        unix_channel(&h.running.sockets.plugin).await.unwrap(),
    );
    let mut stream = client
        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 1);
    assert_eq!(
        first.devices[0].health,
        health_v1alpha1::HealthStatus::Healthy as i32
    );
    assert_eq!(first.devices[0].last_updated_time, 1000);
    assert_eq!(first.devices[0].health_check_timeout_seconds, 45);
    drop(stream);
    stop(h).await;
}
