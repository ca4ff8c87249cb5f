//! Proof that the local cluster is real: two kubelets on their own
//! containerds register as Nodes, the scheduler places a probe pod on each,
//! the probe runs in a container and its log (read through the apiserver →
//! kubelet path) shows what it saw; teardown leaves no process behind.
//!
//! Needs root and the binaries from `cargo xtask k8s build`.

use std::time::{Duration, Instant};

use e2e::{ClusterConfig, LocalCluster, PROBE_IMAGE};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{LogParams, PostParams};

fn probe_pod(node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("probe-{node}")},
        "spec": {
            "hostNetwork": true,
            "nodeSelector": {"kubernetes.io/hostname": node},
            // Nodes without a CNI network stay NotReady (and tainted); hostNetwork pods still run.
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "probe",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "Never",
                "env": [{"name": "PROBE_NODE", "value": node}],
            }],
        },
    }))
    .unwrap()
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_run_probe_pods_and_teardown_is_clean() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let cluster = LocalCluster::start(ClusterConfig::with_nodes(&["p5", "trn2"]))
        .await
        .expect("cluster starts");
    let client = cluster.client().unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["p5", "trn2"] {
        let node = nodes.get(name).await.unwrap();
        let info = node.status.unwrap().node_info.unwrap();
        assert_eq!(
            info.kubelet_version,
            local_cluster::cluster::selected_kubernetes_version().to_string(),
            "real version via ldflags"
        );
        assert!(info.container_runtime_version.starts_with("containerd://"));
    }

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["p5", "trn2"] {
        pods.create(&PostParams::default(), &probe_pod(name))
            .await
            .unwrap();
    }
    for name in ["p5", "trn2"] {
        let pod_name = format!("probe-{name}");
        let pod = wait_for(
            &format!("{pod_name} Running"),
            Duration::from_secs(180),
            async || {
                let pod = pods.get(&pod_name).await.ok()?;
                let phase = pod.status.as_ref()?.phase.clone()?;
                assert_ne!(phase, "Failed", "{pod_name} failed: {:?}", pod.status);
                (phase == "Running").then_some(pod)
            },
        )
        .await;
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(name));

        let log = wait_for(
            &format!("{pod_name} log"),
            Duration::from_secs(60),
            async || {
                let log = pods.logs(&pod_name, &LogParams::default()).await.ok()?;
                log.contains("probe-end").then_some(log)
            },
        )
        .await;
        assert!(log.starts_with("probe-begin\n"), "{log}");
        assert!(log.contains("dev /dev/null char 1:3\n"), "{log}");
        assert!(log.contains(&format!("env PROBE_NODE={name}\n")), "{log}");
    }

    let live = cluster.live_pids();
    // 4 control-plane processes, 2 × (containerd + kubelet), shims, pause and probe processes.
    assert!(
        live.len() >= 12,
        "expected the whole cluster alive, got {live:?}"
    );
    let report = cluster.shutdown();
    assert!(report.is_clean(), "{report:?}");
    let survivors: Vec<i32> = live
        .into_iter()
        .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    !s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(false)
        })
        .collect();
    assert!(
        survivors.is_empty(),
        "processes left after teardown: {survivors:?}"
    );
}
