use super::*;

#[test]
fn the_committed_wrapper_module_pins_lws() {
    let dir = local_cluster::paths::repo_root().join(MODULE_DIR);
    let text = std::fs::read_to_string(dir.join("go.mod")).unwrap();
    let v = crate::autoscale::tools::required_version(&text, MODULE).unwrap_or_default();
    assert!(v.starts_with('v'), "{MODULE_DIR}/go.mod: {MODULE} at {v:?}");
    assert!(
        text.lines().any(|l| l.trim() == format!("tool {PACKAGE}")),
        "{MODULE_DIR}/go.mod has no `tool {PACKAGE}`"
    );
}

#[test]
fn a_replace_operation_replaces_the_element_it_names() {
    let mut config = json!({"webhooks": [{"name": "a"}, {"name": "b"}]});
    let op = json!({"op": "replace", "path": "/webhooks/1", "value": {"name": "c"}});
    apply_replace(&mut config, &op).unwrap();
    assert_eq!(config["webhooks"][1]["name"], "c");
    assert_eq!(config["webhooks"][0]["name"], "a");
    let missing = json!({"op": "replace", "path": "/webhooks/5", "value": {}});
    assert!(apply_replace(&mut config, &missing).is_err());
    let add = json!({"op": "add", "path": "/webhooks/0", "value": {}});
    assert!(apply_replace(&mut config, &add).is_err());
}

#[test]
fn webhooks_are_sent_to_the_local_address_with_our_ca() {
    let mut config = json!({
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [{"name": "mpod.kb.io", "clientConfig": {"service":
            {"name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}}}],
    });
    let addr: SocketAddr = "127.0.0.1:10443".parse().unwrap();
    let ca = serde_json::to_value(k8s_openapi::ByteString(b"PEM".to_vec())).unwrap();
    point_at(&mut config, addr, &ca).unwrap();
    assert_eq!(
        config["metadata"]["name"],
        "lws-mutating-webhook-configuration"
    );
    let client = &config["webhooks"][0]["clientConfig"];
    assert_eq!(client["url"], "https://127.0.0.1:10443/mutate--v1-pod");
    assert_eq!(client["caBundle"], "UEVN");
    assert!(client.get("service").is_none());
}

#[test]
fn the_configuration_turns_off_what_needs_a_pod() {
    let c = configuration(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        10443,
        Path::new("/tmp/certs"),
    );
    assert_eq!(c["internalCertManagement"]["enable"], false);
    assert_eq!(c["leaderElection"]["leaderElect"], false);
    assert_eq!(c["webhook"]["host"], "127.0.0.1");
    assert_eq!(c["webhook"]["port"], 10443);
    assert_eq!(c["webhook"]["certDir"], "/tmp/certs");
    assert_eq!(c["metrics"]["bindAddress"], "0");
}
