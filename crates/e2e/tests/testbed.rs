//! The testbed on its own, with only the test GPU driver: the charts'
//! objects apply server-side, a token bound to a placeholder pod carries the
//! node name, a driver built on `dra-core` registers with the real kubelet,
//! publishes, and prepares a pod's claim. This is what every scenario stands
//! on; it needs none of the real drivers.
//!
//! Needs root, `cargo xtask k8s build`, helm and `gpu-test-driver`
//! (`cargo build -p e2e --bins`).

use std::time::Duration;

use e2e::scenarios::kit;
use e2e::{DriverKind, LocalOptions, LocalTestbed, Testbed};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_test_driver_publishes_and_prepares_with_a_node_bound_token() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let tb = LocalTestbed::start(LocalOptions {
        nodes: vec![(
            "p5".into(),
            "p5.48xlarge".into(),
            vec![DriverKind::GpuTest],
        )],
        keep_state_dir: false,
    })
    .await
    .expect("testbed starts");
    let node = tb.nodes().pop().unwrap();

    // Published from the fixture with topology's attributes.
    let devices = kit::devices(&tb, "p5", DriverKind::GpuTest).await.unwrap();
    assert_eq!(devices.len(), node.fixture.gpus.len());
    for gpu in &node.fixture.gpus {
        let d = &devices[&format!("gpu-{}", gpu.index)];
        assert_eq!(
            kit::attr_str(d, "resource.kubernetes.io/pcieRoot").as_deref(),
            Some(gpu.pcie_root.as_str())
        );
        assert_eq!(
            kit::attr_str(d, "resource.kubernetes.io/pciBusID").as_deref(),
            Some(gpu.bdf.as_str())
        );
        assert_eq!(
            kit::attr_int(d, "resource.kubernetes.io/numaNode"),
            gpu.numa_node.map(i64::from)
        );
    }

    // The driver's token is bound to a pod on p5.
    let client = e2e::client_from_kubeconfig(&tb.driver_kubeconfig("p5", DriverKind::GpuTest).unwrap())
        .await
        .unwrap();
    let review: SelfSubjectReview =
        serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}))
            .unwrap();
    let me = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let extra = me.status.unwrap().user_info.unwrap().extra.unwrap();
    assert_eq!(extra["authentication.kubernetes.io/node-name"], vec!["p5".to_string()]);

    // A pod with one GPU runs and sees exactly it.
    let ns = "testbed";
    kit::namespace(&tb, ns).await.unwrap();
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
        ]}}},
    });
    let pod = kit::pod_with_claim(&tb, "one-gpu", Some("one-gpu"), None, None);
    kit::apply_all(&tb, ns, &[template, pod]).await.unwrap();
    kit::running(&tb, ns, "one-gpu", Duration::from_secs(120))
        .await
        .unwrap();
    let devs = kit::pod_devices(&tb, ns, "one-gpu").await.unwrap();
    assert_eq!(devs.len(), 1, "{devs:?}");
    let index = devs[0].device.trim_start_matches("gpu-").to_string();
    let report = kit::probe(&tb, ns, "one-gpu").await.unwrap();
    assert_eq!(
        report.devices.get(&format!("/dev/nvidia{index}")).map(String::as_str),
        Some(format!("char {}:{index}", sysfs_fixtures::NVIDIA_MAJOR).as_str()),
        "{report:?}"
    );
    assert_eq!(report.devices_with_prefix("/dev/nvidia").len(), 2, "nvidiaN + nvidiactl: {report:?}");
    assert_eq!(report.env.get("NVIDIA_VISIBLE_DEVICES"), Some(&index));
    let claim_uid = kit::pod_claims(&tb, ns, "one-gpu").await.unwrap()[0]
        .metadata
        .uid
        .clone()
        .unwrap();
    assert!(tb.cdi_spec_files("p5").unwrap().iter().any(|f| f.contains(&claim_uid)));

    kit::delete_pods(&tb, ns, &["one-gpu"], Duration::from_secs(90))
        .await
        .unwrap();
    kit::wait_for(&tb, "GPU claim unprepared", Duration::from_secs(60), || async {
        let gone = !tb.cdi_spec_files("p5")?.iter().any(|f| f.contains(&claim_uid))
            && !tb
                .checkpoint("p5", DriverKind::GpuTest)?
                .is_some_and(|c| c.claims.contains_key(&claim_uid));
        Ok(gone.then_some(()))
    })
    .await
    .unwrap();

    let report = tb.shutdown();
    assert!(report.is_clean(), "{report:?}");
}
