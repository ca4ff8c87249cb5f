//! The test GPU driver's DaemonSet, in the shape of the charts' own.

use serde_json::{Value, json};

use super::host::{Deployment, HostPaths, POD_DRIVER_LABEL, run_label};
use crate::charts;
use crate::testbed::DriverKind;

/// The test GPU driver's DaemonSet: the shape of the charts' (same env,
/// mounts, label-driven scheduling), written here because NVIDIA's chart is
/// not ours to run.
pub fn gpu_test_daemonset(
    deployment: &Deployment,
    name: &str,
    pin: Option<&str>,
    paths: &HostPaths,
    metrics_port: u16,
) -> Value {
    let mut selector = serde_json::Map::new();
    selector.insert(run_label(DriverKind::GpuTest), json!("run"));
    if let Some(node) = pin {
        selector.insert("kubernetes.io/hostname".into(), json!(node));
    }
    let registrar = format!("{}/plugins_registry", paths.kubelet_root);
    let plugin_dir = format!(
        "{}/plugins/{}",
        paths.kubelet_root,
        DriverKind::GpuTest.driver_name()
    );
    // The device attributes files go beside the CDI root, as the drivers'
    // default and the charts' have it; the container's root is read-only.
    let attributes_root = std::path::Path::new(&paths.cdi_root)
        .parent()
        .unwrap_or(std::path::Path::new("/"))
        .join("dra-device-attributes")
        .display()
        .to_string();
    let mut env = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}),
        json!({"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": registrar}),
        json!({"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": format!("{}/plugins", paths.kubelet_root)}),
        json!({"name": "CDI_ROOT", "value": paths.cdi_root}),
        json!({"name": "DEVICE_ATTRIBUTES_ROOT", "value": attributes_root}),
        json!({"name": "METRICS_ADDRESS", "value": format!("0.0.0.0:{metrics_port}")}),
        json!({"name": "LOG_LEVEL", "value": "info,dra_core=debug"}),
    ];
    env.extend(
        deployment
            .extra_env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v})),
    );
    let mut spec = json!({
        "serviceAccountName": crate::testbed::GPU_TEST_SERVICE_ACCOUNT,
        "nodeSelector": selector,
        "terminationGracePeriodSeconds": 10,
        "containers": [{
            "name": "driver",
            "image": deployment.gpu_test_image,
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/gpu-test-driver"],
            "args": ["run", format!("--sysfs-root={}", paths.sysfs_root),
                     format!("--dev-root={}", paths.dev_root), "--log-format=text"],
            "env": env,
            "ports": [{"name": "metrics", "containerPort": metrics_port}],
            "securityContext": {"readOnlyRootFilesystem": true},
            "terminationMessagePath": "/tmp/termination-log",
            "volumeMounts": [
                {"name": "registry", "mountPath": registrar},
                {"name": "plugin", "mountPath": plugin_dir},
                {"name": "cdi", "mountPath": paths.cdi_root},
                {"name": "attributes", "mountPath": attributes_root},
                {"name": "sys", "mountPath": paths.sysfs_root, "readOnly": true},
                {"name": "dev", "mountPath": paths.dev_root, "readOnly": true},
            ],
        }],
        "volumes": [
            {"name": "registry", "hostPath": {"path": registrar, "type": "DirectoryOrCreate"}},
            {"name": "plugin", "hostPath": {"path": plugin_dir, "type": "DirectoryOrCreate"}},
            {"name": "cdi", "hostPath": {"path": paths.cdi_root, "type": "DirectoryOrCreate"}},
            {"name": "attributes", "hostPath": {"path": attributes_root, "type": "DirectoryOrCreate"}},
            {"name": "sys", "hostPath": {"path": paths.sysfs_root, "type": "Directory"}},
            {"name": "dev", "hostPath": {"path": paths.dev_root, "type": "Directory"}},
        ],
    });
    if deployment.host_network {
        spec["hostNetwork"] = json!(true);
        spec["dnsPolicy"] = json!("ClusterFirstWithHostNet");
    }
    spec["tolerations"] = deployment
        .tolerations
        .clone()
        .unwrap_or_else(|| json!([{"operator": "Exists"}]));
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": charts::NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "template": {
                "metadata": {"labels": {
                    "app.kubernetes.io/instance": name,
                    POD_DRIVER_LABEL: DriverKind::GpuTest.binary(),
                }},
                "spec": spec,
            },
        },
    })
}
