//! The Helm values of each chart release the testbed installs (and the kind
//! run renders the same way).

use serde_json::{Value, json};

use super::host::{Deployment, HostPaths, POD_DRIVER_LABEL, run_label};
use crate::testbed::DriverKind;

fn short_name(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::Efa => "efa",
        DriverKind::Neuron => "neuron",
        DriverKind::GpuTest => "gpu-test",
    }
}

/// The release (and DaemonSet) name for `kind`: `efa`, `neuron`, `gpu-test`,
/// with `-<node>` for a per-node release.
pub fn release_name(kind: DriverKind, node: Option<&str>) -> String {
    match node {
        Some(n) => format!("{}-{n}", short_name(kind)),
        None => short_name(kind).to_string(),
    }
}

/// The chart values of one release.
///
/// `pin`: the node a per-node release is for; `primary`: the first release
/// of the chart, which also installs its cluster-wide objects (DeviceClass,
/// ServiceAccount, RBAC, admission policy).
pub fn release_values(
    deployment: &Deployment,
    kind: DriverKind,
    release: &str,
    pin: Option<&str>,
    paths: &HostPaths,
    primary: bool,
    metrics_port: u16,
) -> Value {
    let mut selector = serde_json::Map::new();
    selector.insert(run_label(kind), json!("run"));
    if let Some(node) = pin {
        selector.insert("kubernetes.io/hostname".into(), json!(node));
    }
    let env: Vec<Value> = deployment
        .extra_env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut values = json!({
        "fullnameOverride": release,
        "image": {
            "repository": deployment.image_repository,
            "tag": deployment.image_tag,
            // Loaded into the nodes' containerd, never pulled.
            "pullPolicy": "Never",
        },
        "logFormat": "text",
        "logLevel": "info,dra_core=debug",
        "hostNetwork": deployment.host_network,
        "extraEnv": env,
        "hostPaths": {
            "kubeletRoot": paths.kubelet_root,
            "cdiRoot": paths.cdi_root,
            "sysfsRoot": paths.sysfs_root,
            "devRoot": paths.dev_root,
        },
        "metrics": {"port": metrics_port},
        // The harness reads /metrics through the API server's pod proxy,
        // which the chart's default policy (the `monitoring` namespace
        // only) would stop on a CNI that enforces policies (kindnetd).
        "networkPolicy": {"metricsFrom": []},
        "nodeSelector": selector,
        "podLabels": {POD_DRIVER_LABEL: kind.binary()},
        // One ServiceAccount per chart, whatever the release: the admission
        // policy and the RBAC name it, and s11 checks the token's username.
        "serviceAccount": {"create": primary, "name": kind.service_account().1},
        "rbac": {"create": primary},
        "validatingAdmissionPolicy": {"enabled": primary},
        "deviceClasses": {"default": {"enabled": primary}},
    });
    if let Some(t) = &deployment.tolerations {
        values["tolerations"] = t.clone();
    }
    if kind == DriverKind::Neuron
        && let Some(partitions) = &deployment.neuron_partitions
    {
        values["partitions"] = json!(partitions);
    }
    // The extended-resource DeviceClasses are cluster-wide too: only the
    // first release of a chart owns them.
    let extended: &[&str] = match kind {
        DriverKind::Efa => &["efa"],
        DriverKind::Neuron => &["neuron", "neurondevice", "neuroncore"],
        DriverKind::GpuTest => &[],
    };
    if !primary {
        for key in extended {
            values["deviceClasses"]["extendedResources"][*key] = json!({"enabled": false});
        }
    }
    values
}
