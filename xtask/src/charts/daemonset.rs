//! The assertions on a chart's DaemonSet, read as a typed `apps/v1`
//! DaemonSet: seamless rolling update, scheduling (priority, affinity,
//! tolerations, host network), the driver container's command, flags, env,
//! probe, security context, and every host directory mounted at its own path.
//!
//! Each failure names the field and what was found; the caller adds the
//! chart, the values and the object.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::charts::expect::Expect;
use crate::charts::rendering::json;
use crate::charts::specs::ChartSpec;

/// The well-known label of a node's EC2 instance type.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The label EKS sets to `auto`, `fargate` or `hybrid` on nodes of those
/// compute types (absent on managed node groups, Karpenter and self-managed
/// nodes).
pub const COMPUTE_TYPE_LABEL: &str = "eks.amazonaws.com/compute-type";

pub fn check_daemonset(spec: &ChartSpec, expect: &Expect, ds: &DaemonSet) -> Result<()> {
    let ds_spec = ds.spec.as_ref().context("DaemonSet without spec")?;
    let strategy = ds_spec.update_strategy.as_ref();
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    ensure!(
        strategy.and_then(|s| s.type_.as_deref()) == Some("RollingUpdate")
            && rolling.and_then(|r| r.max_surge.as_ref()) == Some(&IntOrString::Int(1))
            && rolling.and_then(|r| r.max_unavailable.as_ref()) == Some(&IntOrString::Int(0)),
        "updateStrategy must be RollingUpdate maxSurge 1 maxUnavailable 0 (seamless upgrade), got {}",
        json(&strategy)
    );
    let pod = ds_spec
        .template
        .spec
        .as_ref()
        .context("DaemonSet without a pod spec")?;
    check_scheduling(expect, pod)?;
    ensure!(
        pod.service_account_name.as_deref() == Some(expect.service_account.as_str()),
        "serviceAccountName {:?}, want {}",
        pod.service_account_name,
        expect.service_account
    );
    let pod_seccomp = pod
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref());
    ensure!(
        pod_seccomp.map(|p| p.type_.as_str()) == Some("RuntimeDefault"),
        "pod seccompProfile must be RuntimeDefault: {}",
        json(&pod_seccomp)
    );
    let groups = pod
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default();
    ensure!(
        groups == expect.supplemental_groups,
        "pod supplementalGroups {groups:?}, want {:?} (podSecurityContext in values)",
        expect.supplemental_groups
    );
    ensure!(
        pod.containers.len() == 1,
        "one container expected, found {}",
        pod.containers.len()
    );
    let c = &pod.containers[0];
    check_command(spec, expect, c)?;
    check_env(expect, c)?;
    check_ports_and_resources(expect, c)?;
    check_security_context(expect, c)?;
    check_host_mounts(spec, expect, pod, c)
}

/// Priority, node affinity, host network and tolerations.
fn check_scheduling(expect: &Expect, pod: &PodSpec) -> Result<()> {
    ensure!(
        pod.priority_class_name.as_deref() == expect.priority_class.as_deref(),
        "priorityClassName {:?}, want {:?}",
        pod.priority_class_name,
        expect.priority_class
    );
    check_affinity(expect, pod)?;
    if expect.host_network {
        ensure!(
            pod.host_network == Some(true)
                && pod.dns_policy.as_deref() == Some("ClusterFirstWithHostNet"),
            "hostNetwork: true must render with dnsPolicy ClusterFirstWithHostNet: {:?} {:?}",
            pod.host_network,
            pod.dns_policy
        );
    } else {
        ensure!(
            pod.host_network.is_none() && pod.dns_policy.is_none(),
            "hostNetwork must be off by default: {:?} {:?}",
            pod.host_network,
            pod.dns_policy
        );
    }
    let tolerated: Vec<&str> = pod
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.as_deref())
        .collect();
    if expect.priority_class.is_some() {
        for key in [
            "nvidia.com/gpu",
            "aws.amazon.com/neuron",
            "aws.amazon.com/efa",
            "CriticalAddonsOnly",
        ] {
            ensure!(
                tolerated.contains(&key),
                "no toleration for {key}: {tolerated:?}"
            );
        }
    }
    Ok(())
}

/// The chart's node requirements (instance types, excluded EKS compute
/// types) in every required node selector term, after the keys of the
/// user's own term; the user's preferred terms kept.
fn check_affinity(expect: &Expect, pod: &PodSpec) -> Result<()> {
    let mut chart_keys = Vec::new();
    if expect.instance_type_affinity {
        chart_keys.push(INSTANCE_TYPE_LABEL);
    }
    if !expect.exclude_compute_types.is_empty() {
        chart_keys.push(COMPUTE_TYPE_LABEL);
    }
    let node = pod.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
    let preferred = node
        .and_then(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map_or(0, Vec::len);
    ensure!(
        preferred == expect.preferred_node_terms,
        "{preferred} preferred node terms, want {}: {}",
        expect.preferred_node_terms,
        json(&node)
    );
    let terms = node
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    if chart_keys.is_empty() && expect.user_node_terms.is_empty() {
        ensure!(
            terms.is_empty(),
            "no node requirement asked for, yet: {}",
            json(&terms)
        );
        return Ok(());
    }
    let user_terms = if expect.user_node_terms.is_empty() {
        vec![vec![]]
    } else {
        expect.user_node_terms.clone()
    };
    ensure!(
        terms.len() == user_terms.len(),
        "{} required node selector terms, want {}: {}",
        terms.len(),
        user_terms.len(),
        json(&terms)
    );
    for (term, user_keys) in terms.iter().zip(&user_terms) {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let keys: Vec<&str> = exprs.iter().map(|e| e.key.as_str()).collect();
        let want: Vec<&str> = user_keys
            .iter()
            .map(String::as_str)
            .chain(chart_keys.iter().copied())
            .collect();
        ensure!(
            keys == want,
            "a required node selector term has keys {keys:?}, want {want:?} (Kubernetes ORs the terms: each needs the chart's requirements)"
        );
        for e in exprs {
            if e.key == INSTANCE_TYPE_LABEL {
                ensure!(
                    e.operator == "In" && e.values.as_ref().is_some_and(|v| !v.is_empty()),
                    "node affinity on instance types must be In a non-empty list: {}",
                    json(e)
                );
            } else if e.key == COMPUTE_TYPE_LABEL {
                ensure!(
                    e.operator == "NotIn"
                        && e.values.as_deref() == Some(expect.exclude_compute_types.as_slice()),
                    "compute types must be excluded (NotIn {:?}): {}",
                    expect.exclude_compute_types,
                    json(e)
                );
            }
        }
    }
    Ok(())
}

/// The binary, `run` first, the driver's flags, coexistence off unless asked.
fn check_command(spec: &ChartSpec, expect: &Expect, c: &Container) -> Result<()> {
    let command = c.command.as_deref().unwrap_or_default();
    ensure!(
        command == [format!("/usr/local/bin/{}", spec.binary)],
        "command {command:?}"
    );
    let args: Vec<&str> = c.args.iter().flatten().map(String::as_str).collect();
    let mut want_args = vec![
        "run".to_owned(),
        format!("--driver-name={}", spec.driver),
        format!("--sysfs-root={}", expect.sysfs_root),
        format!("--dev-root={}", expect.dev_root),
    ];
    want_args.extend(expect.extra_args.iter().cloned());
    for a in &want_args {
        ensure!(args.contains(&a.as_str()), "missing arg {a}: {args:?}");
    }
    ensure!(
        args.first() == Some(&"run"),
        "`run` must be the first argument: {args:?}"
    );
    if !want_args
        .iter()
        .any(|a| a == "--allow-device-plugin-coexistence")
    {
        ensure!(
            !args.contains(&"--allow-device-plugin-coexistence"),
            "device plugin coexistence must be off by default"
        );
    }
    Ok(())
}

/// The downward-API env, the kubelet and CDI paths, the metrics address,
/// `extraEnv`, and nothing else.
fn check_env(expect: &Expect, c: &Container) -> Result<()> {
    let env = c.env.as_deref().unwrap_or_default();
    let find = |name: &str| env.iter().find(|e| e.name == name);
    for (name, field) in [("NODE_NAME", "spec.nodeName"), ("POD_UID", "metadata.uid")] {
        let e = find(name).with_context(|| format!("env {name} missing"))?;
        let path = e
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        ensure!(
            path == Some(field),
            "{name} must come from the downward API field {field}: {}",
            json(e)
        );
    }
    for (name, want) in [
        (
            "KUBELET_REGISTRAR_DIRECTORY_PATH",
            expect.registrar_dir.clone(),
        ),
        ("KUBELET_PLUGINS_DIRECTORY_PATH", expect.plugins_dir.clone()),
        ("CDI_ROOT", expect.cdi_root.clone()),
        (
            "DEVICE_ATTRIBUTES_FILES",
            expect.device_attributes_files.to_string(),
        ),
        ("DEVICE_ATTRIBUTES_ROOT", device_attributes_root(expect)),
        (
            "METRICS_ADDRESS",
            format!("0.0.0.0:{}", expect.metrics_port),
        ),
    ] {
        let e = find(name).with_context(|| format!("env {name} missing"))?;
        ensure!(
            e.value.as_deref() == Some(want.as_str()),
            "env {name} = {:?}, want {want}",
            e.value
        );
    }
    for (name, want) in &expect.extra_env {
        let e = find(name).with_context(|| format!("extraEnv {name} missing"))?;
        ensure!(
            e.value.as_deref() == Some(want.as_str()),
            "extraEnv {name} = {:?}, want {want}",
            e.value
        );
    }
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    ensure!(
        names.len() == 9 + expect.extra_env.len(),
        "unexpected env entries: {names:?}"
    );
    Ok(())
}

/// The metrics port, the liveness and readiness probes on it, the memory
/// request and limit.
fn check_ports_and_resources(expect: &Expect, c: &Container) -> Result<()> {
    let port = c.ports.as_ref().and_then(|p| p.first());
    ensure!(
        port.is_some_and(|p| p.name.as_deref() == Some("metrics")
            && i64::from(p.container_port) == i64::from(expect.metrics_port)),
        "metrics port must be named metrics on {}: {}",
        expect.metrics_port,
        json(&c.ports)
    );
    let probe = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref());
    ensure!(
        probe.is_some_and(|g| g.path.as_deref() == Some("/healthz")
            && g.port == IntOrString::String("metrics".into())),
        "liveness probe must GET /healthz on the metrics port: {}",
        json(&probe)
    );
    let ready = c.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref());
    ensure!(
        ready.is_some_and(|g| g.path.as_deref() == Some("/readyz")
            && g.port == IntOrString::String("metrics".into())),
        "readiness probe must GET /readyz on the metrics port (the rolling update waits for it): {}",
        json(&ready)
    );
    // The driver's /healthz gives up after PROBE_TIMEOUT and says why; a
    // probe that times out first only records a bare timeout.
    let driver_timeout = i64::try_from(dra_core::PROBE_TIMEOUT.as_secs())?;
    for (name, probe) in [
        ("liveness", c.liveness_probe.as_ref()),
        ("readiness", c.readiness_probe.as_ref()),
    ] {
        let timeout = probe.and_then(|p| p.timeout_seconds).unwrap_or(1);
        ensure!(
            i64::from(timeout) > driver_timeout,
            "{name} probe timeoutSeconds {timeout} must exceed the driver's own {driver_timeout} s"
        );
    }
    let has =
        |m: Option<&BTreeMap<String, Quantity>>, key: &str| m.is_some_and(|m| m.contains_key(key));
    let resources = c.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    ensure!(
        has(requests, "memory")
            && has(limits, "memory")
            && has(requests, "cpu")
            && has(limits, "cpu"),
        "CPU and memory requests and limits must be set: {}",
        json(&resources)
    );
    if let Some(image) = &expect.image {
        ensure!(
            c.image.as_deref() == Some(image.as_str()),
            "image {:?}, want {image}",
            c.image
        );
    }
    Ok(())
}

/// Read-only root, RuntimeDefault seccomp, and either privileged (no
/// allowPrivilegeEscalation) or unprivileged with every capability dropped.
fn check_security_context(expect: &Expect, c: &Container) -> Result<()> {
    let sc = c
        .security_context
        .as_ref()
        .context("container without securityContext")?;
    ensure!(
        sc.read_only_root_filesystem == Some(true),
        "readOnlyRootFilesystem must be true: {:?}",
        sc.read_only_root_filesystem
    );
    ensure!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()) == Some("RuntimeDefault"),
        "container seccompProfile must be RuntimeDefault: {}",
        json(&sc.seccomp_profile)
    );
    let se_linux = sc
        .se_linux_options
        .as_ref()
        .and_then(|o| o.type_.as_deref());
    ensure!(
        se_linux == expect.se_linux_type.as_deref(),
        "seLinuxOptions.type {se_linux:?}, want {:?} (securityContext in values)",
        expect.se_linux_type
    );
    if expect.privileged {
        ensure!(sc.privileged == Some(true), "privileged=true not applied");
        // The API server rejects privileged with allowPrivilegeEscalation=false.
        ensure!(
            sc.allow_privilege_escalation.is_none(),
            "privileged containers must not set allowPrivilegeEscalation"
        );
    } else {
        ensure!(
            sc.privileged == Some(false),
            "privileged must be false: {:?}",
            sc.privileged
        );
        ensure!(
            sc.allow_privilege_escalation == Some(false),
            "allowPrivilegeEscalation must be false: {:?}",
            sc.allow_privilege_escalation
        );
        let caps = sc.capabilities.as_ref();
        ensure!(
            caps.and_then(|c| c.drop.as_deref()) == Some(&["ALL".to_owned()][..])
                && caps.is_some_and(|c| c.add.is_none()),
            "capabilities must drop ALL and add none: {}",
            json(&caps)
        );
    }
    Ok(())
}

/// The API token is mounted explicitly and read-only, not by the
/// ServiceAccount admission into every container: automount off, one
/// projected volume with a bound token, the cluster CA and the namespace at
/// the path clients look in.
fn check_api_access(pod: &PodSpec, mounts: &[VolumeMount]) -> Result<()> {
    ensure!(
        pod.automount_service_account_token == Some(false),
        "automountServiceAccountToken must be false (the token is mounted explicitly as api-access)"
    );
    let m = mounts
        .iter()
        .find(|m| m.name == "api-access")
        .context("no volumeMount api-access: the driver needs its token")?;
    ensure!(
        m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount"
            && m.read_only == Some(true),
        "api-access must be mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount, got {} (readOnly {:?})",
        m.mount_path,
        m.read_only
    );
    let sources = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "api-access")
        .and_then(|v| v.projected.as_ref())
        .and_then(|p| p.sources.as_deref())
        .context("volume api-access must be a projected volume")?;
    let token = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref());
    ensure!(
        token.is_some_and(|t| t.path == "token" && t.audience.is_none()),
        "api-access must project the service account token as `token` for the API server's audience"
    );
    ensure!(
        sources.iter().any(|s| s
            .config_map
            .as_ref()
            .is_some_and(|c| c.name == "kube-root-ca.crt")),
        "api-access must project the cluster CA (ConfigMap kube-root-ca.crt)"
    );
    ensure!(
        sources.iter().any(|s| s.downward_api.is_some()),
        "api-access must project the namespace (downward API)"
    );
    Ok(())
}

/// Every host directory at the same path inside the container, read-only
/// where the driver only reads, and no other mount.
fn check_host_mounts(
    spec: &ChartSpec,
    expect: &Expect,
    pod: &PodSpec,
    c: &Container,
) -> Result<()> {
    let volumes = pod.volumes.as_deref().context("no volumes")?;
    let mounts = c.volume_mounts.as_deref().context("no volumeMounts")?;
    let host_path = |name: &str| -> Result<(&str, bool)> {
        let m = mounts
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("no volumeMount {name}"))?;
        let v = volumes
            .iter()
            .find(|v| v.name == name)
            .with_context(|| format!("no volume {name}"))?;
        let path = v
            .host_path
            .as_ref()
            .map(|h| h.path.as_str())
            .with_context(|| format!("volume {name} is not a hostPath"))?;
        ensure!(
            m.mount_path == path,
            "volume {name}: host {path} mounted at {}: must be the same path",
            m.mount_path
        );
        Ok((path, m.read_only == Some(true)))
    };
    let dev_mount = if spec.dev_sub_path.is_empty() {
        expect.dev_root.clone()
    } else {
        format!("{}/{}", expect.dev_root, spec.dev_sub_path)
    };
    for (name, want, read_only) in [
        ("plugins-registry", expect.registrar_dir.clone(), false),
        (
            "plugin-dir",
            format!("{}/{}", expect.plugins_dir, spec.driver),
            false,
        ),
        ("cdi", expect.cdi_root.clone(), false),
        ("device-attributes", device_attributes_root(expect), false),
        ("sys", expect.sysfs_root.clone(), true),
        ("dev", dev_mount.clone(), true),
    ] {
        let (path, ro) = host_path(name)?;
        ensure!(path == want, "volume {name} at {path}, want {want}");
        ensure!(
            ro == read_only,
            "volume {name}: readOnly {ro}, want {read_only}"
        );
    }
    check_api_access(pod, mounts)?;
    ensure!(
        mounts.len() == 7,
        "unexpected extra mounts: {} ({:?})",
        mounts.len(),
        mounts.iter().map(|m| m.name.as_str()).collect::<Vec<_>>()
    );
    if dev_mount == expect.dev_root {
        ensure!(
            c.termination_message_path
                .as_deref()
                .is_some_and(|p| !p.starts_with(&format!("{}/", expect.dev_root))),
            "with the whole device dir mounted read-only, the termination log must live elsewhere: {:?}",
            c.termination_message_path
        );
    }
    Ok(())
}
/// Where the driver writes its device attributes files: `dra-device-attributes`
/// beside the CDI root (no values file sets `hostPaths.deviceAttributesRoot`).
fn device_attributes_root(expect: &Expect) -> String {
    let parent = std::path::Path::new(&expect.cdi_root)
        .parent()
        .unwrap_or(std::path::Path::new("/"));
    parent.join("dra-device-attributes").display().to_string()
}
