//! The assertions on one rendering of a driver chart, made on typed
//! k8s-openapi objects (a [`Rendering`]): every object in the release
//! namespace, the service account, the metrics Service and ServiceMonitor,
//! and the DeviceClasses. The DaemonSet's checks are in
//! [`crate::charts::daemonset`], RBAC and the admission policy in
//! [`crate::charts::access`].

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use crate::charts::access::{check_rbac, check_vap};
use crate::charts::daemonset::check_daemonset;
use crate::charts::expect::Expect;
use crate::charts::rendering::{Rendering, check_namespace, id, json, name, one};
use crate::charts::specs::ChartSpec;

/// Asserts everything `expect` says about a rendering of `spec`.
pub fn check_rendered(spec: &ChartSpec, expect: &Expect, objs: &[Value]) -> Result<()> {
    let r = Rendering::from_objects(objs)?;
    check_namespace(&r.daemon_sets)?;
    check_namespace(&r.service_accounts)?;
    check_namespace(&r.services)?;
    check_namespace(&r.service_monitors)?;

    let ds = one(&r.daemon_sets, Some(&expect.fullname))?;
    check_daemonset(spec, expect, ds).with_context(|| id(ds))?;

    ensure!(
        r.service_accounts.len() == usize::from(expect.rbac),
        "ServiceAccount rendered: {}, want {}",
        r.service_accounts.len(),
        usize::from(expect.rbac)
    );
    if expect.rbac {
        one(&r.service_accounts, Some(&expect.service_account))?;
        check_rbac(spec, expect, &r)?;
    } else {
        ensure!(
            r.cluster_roles.is_empty() && r.roles.is_empty(),
            "rbac.create=false still renders a ClusterRole or Role"
        );
    }
    if expect.vap {
        check_vap(spec, expect, &r)?;
    } else {
        ensure!(
            r.policies.is_empty(),
            "validatingAdmissionPolicy.enabled=false still renders the policy"
        );
    }
    check_metrics(expect, &r)?;
    check_network_policy(expect, ds, &r)?;
    check_device_classes(spec, expect, &r)
}

/// The NetworkPolicy, when enabled: selects exactly the driver pods, is
/// ingress-only, and admits TCP on the metrics port alone (from the peers
/// of `networkPolicy.metricsFrom`, or anyone).
fn check_network_policy(
    expect: &Expect,
    ds: &k8s_openapi::api::apps::v1::DaemonSet,
    r: &Rendering,
) -> Result<()> {
    check_namespace(&r.network_policies)?;
    if !expect.network_policy {
        ensure!(
            r.network_policies.is_empty(),
            "networkPolicy.enabled=false still renders a NetworkPolicy"
        );
        return Ok(());
    }
    let np = one(&r.network_policies, Some(&expect.fullname))?;
    let s = np.spec.as_ref().context("NetworkPolicy without spec")?;
    let pods = ds
        .spec
        .as_ref()
        .and_then(|d| d.selector.match_labels.as_ref());
    ensure!(
        s.pod_selector
            .as_ref()
            .and_then(|p| p.match_labels.as_ref())
            == pods,
        "{}: podSelector {} must be the DaemonSet's selector {}",
        id(np),
        json(&s.pod_selector),
        json(&pods)
    );
    ensure!(
        s.policy_types.as_deref() == Some(&["Ingress".to_owned()][..]),
        "{}: policyTypes must be [Ingress] (egress to the API server stays open): {:?}",
        id(np),
        s.policy_types
    );
    let rules = s.ingress.as_deref().unwrap_or_default();
    ensure!(
        rules.len() == 1,
        "{}: one ingress rule expected: {}",
        id(np),
        json(&rules)
    );
    let ports = rules[0].ports.as_deref().unwrap_or_default();
    ensure!(
        ports.len() == 1
            && ports[0].port == Some(IntOrString::String("metrics".into()))
            && ports[0].protocol.as_deref() == Some("TCP"),
        "{}: the only admitted port must be TCP metrics: {}",
        id(np),
        json(&ports)
    );
    let from = rules[0].from.as_ref().map_or(0, Vec::len);
    ensure!(
        from == expect.metrics_from,
        "{}: {from} peers may scrape, want {}",
        id(np),
        expect.metrics_from
    );
    Ok(())
}

fn check_metrics(expect: &Expect, r: &Rendering) -> Result<()> {
    ensure!(
        r.services.len() == usize::from(expect.service),
        "metrics Service rendered: {}, want {}",
        r.services.len(),
        usize::from(expect.service)
    );
    if expect.service {
        let svc = one(&r.services, None)?;
        let s = svc.spec.as_ref().context("Service without spec")?;
        ensure!(
            s.cluster_ip.as_deref() == Some("None"),
            "{}: metrics Service should be headless, clusterIP {:?}",
            id(svc),
            s.cluster_ip
        );
        let port = s.ports.as_ref().and_then(|p| p.first());
        ensure!(
            port.is_some_and(|p| i64::from(p.port) == i64::from(expect.metrics_port)),
            "{}: metrics Service port, want {}: {}",
            id(svc),
            expect.metrics_port,
            json(&s.ports)
        );
        ensure!(
            port.and_then(|p| p.target_port.as_ref())
                == Some(&IntOrString::String("metrics".into())),
            "{}: metrics Service targetPort must be the named port metrics: {}",
            id(svc),
            json(&s.ports)
        );
    }
    ensure!(
        r.service_monitors.len() == usize::from(expect.service_monitor),
        "ServiceMonitor rendered: {}, want {}",
        r.service_monitors.len(),
        usize::from(expect.service_monitor)
    );
    if expect.service_monitor {
        let sm = one(&r.service_monitors, None)?;
        let endpoint = sm.spec.endpoints.first();
        ensure!(
            endpoint.is_some_and(|e| e.port.as_deref() == Some("metrics")),
            "{}: ServiceMonitor port must be metrics: {}",
            id(sm),
            json(&sm.spec.endpoints)
        );
        ensure!(
            endpoint.is_some_and(|e| e.path.as_deref() == Some("/metrics")),
            "{}: ServiceMonitor path must be /metrics: {}",
            id(sm),
            json(&sm.spec.endpoints)
        );
    }
    Ok(())
}

fn check_device_classes(spec: &ChartSpec, expect: &Expect, r: &Rendering) -> Result<()> {
    if expect.device_classes.is_empty() {
        bail!("a rendering without any DeviceClass is never expected here");
    }
    let names: Vec<&str> = r.device_classes.iter().map(name).collect();
    ensure!(
        names == expect.device_classes,
        "DeviceClasses {names:?}, want {:?}",
        expect.device_classes
    );
    let own = format!("device.driver == \"{}\"", spec.driver);
    let expressions = |class: &DeviceClass| -> Vec<String> {
        class
            .spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect()
    };
    for class in &r.device_classes {
        let exprs = expressions(class);
        ensure!(
            exprs.first() == Some(&own),
            "{}: first selector must be `{own}`: {exprs:?}",
            id(class)
        );
    }
    for (class, needle) in &expect.cel {
        let c = one(&r.device_classes, Some(class))?;
        let exprs = expressions(c);
        ensure!(
            exprs.iter().any(|e| e.contains(needle.as_str())),
            "{}: no selector containing {needle}: {exprs:?}",
            id(c)
        );
    }
    for class in &r.device_classes {
        let want = expect
            .extended
            .iter()
            .find(|(c, _)| c == name(class))
            .map(|(_, r)| r.as_str());
        ensure!(
            class.spec.extended_resource_name.as_deref() == want,
            "{}: extendedResourceName {:?}, want {want:?}",
            id(class),
            class.spec.extended_resource_name
        );
    }
    for (class, kind) in &expect.class_config {
        let c = one(&r.device_classes, Some(class))?;
        let opaque = c
            .spec
            .config
            .as_ref()
            .and_then(|c| c.first())
            .and_then(|c| c.opaque.as_ref());
        ensure!(
            opaque.is_some_and(|o| o.driver == spec.driver
                && o.parameters.0["kind"] == kind.as_str()),
            "{}: config must be opaque {kind} for {}: {}",
            id(c),
            spec.driver,
            json(&opaque)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::charts::specs::EFA;
    use crate::manifest_checks;

    /// A rendering of the EFA chart as the templates produce it, by hand, so
    /// that the assertions can be shown to pass on it and fail on each flaw.
    fn good_rendering() -> Vec<Value> {
        let yaml = include_str!("testdata/efa-rendered-defaults.yaml");
        manifest_checks::parse(yaml).unwrap()
    }

    /// The first rendered object of `kind`.
    fn first_of<'a>(objs: &'a mut [Value], kind: &str) -> &'a mut Value {
        objs.iter_mut().find(|o| o["kind"] == kind).unwrap()
    }

    fn ds_container(objs: &mut [Value]) -> &mut Value {
        &mut first_of(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    }

    #[test]
    fn a_correct_rendering_passes() {
        check_rendered(&EFA, &Expect::defaults(&EFA), &good_rendering()).unwrap();
    }

    #[test]
    fn each_flaw_is_caught() {
        type Mutation = fn(&mut Vec<Value>);
        let table: [(&str, &str, Mutation); 23] = [
            ("added capability", "capabilities must drop ALL", |o| {
                ds_container(o)["securityContext"]["capabilities"]["add"] =
                    serde_json::json!(["SYS_ADMIN"])
            }),
            (
                "writable root fs",
                "readOnlyRootFilesystem must be true",
                |o| ds_container(o)["securityContext"]["readOnlyRootFilesystem"] = false.into(),
            ),
            ("sysfs writable", "volume sys: readOnly false", |o| {
                let mounts = ds_container(o)["volumeMounts"].as_array_mut().unwrap();
                let sys = mounts.iter_mut().find(|m| m["name"] == "sys").unwrap();
                sys["readOnly"] = false.into()
            }),
            (
                "mount path differs from host path",
                "must be the same path",
                |o| ds_container(o)["volumeMounts"][0]["mountPath"] = "/registry".into(),
            ),
            (
                "POD_UID not from the downward API",
                "env POD_UID missing",
                |o| {
                    let env = ds_container(o)["env"].as_array_mut().unwrap();
                    env.retain(|e| e["name"] != "POD_UID");
                },
            ),
            ("maxUnavailable 1", "maxUnavailable 0", |o| {
                let ds = first_of(o, "DaemonSet");
                ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = 1.into();
            }),
            (
                "VAP without the DELETE case",
                "'DELETE' ? oldObject : object",
                |o| {
                    let p = first_of(o, "ValidatingAdmissionPolicy");
                    p["spec"]["variables"][1]["expression"] = "object".into();
                },
            ),
            ("VAP fails open", "must fail closed", |o| {
                let p = first_of(o, "ValidatingAdmissionPolicy");
                p["spec"]["failurePolicy"] = "Ignore".into();
            }),
            (
                "VAP not matching deletes",
                "CREATE/UPDATE/DELETE of resourceslices",
                |o| {
                    let p = first_of(o, "ValidatingAdmissionPolicy");
                    p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] =
                        serde_json::json!(["CREATE", "UPDATE"]);
                },
            ),
            (
                "token mounted into every container",
                "automountServiceAccountToken must be false",
                |o| {
                    let ds = first_of(o, "DaemonSet");
                    ds["spec"]["template"]["spec"]["automountServiceAccountToken"] = true.into();
                },
            ),
            ("list on claims", "not least-privilege", |o| {
                let r = first_of(o, "ClusterRole");
                r["rules"][0]["verbs"] = serde_json::json!(["get", "list"]);
            }),
            ("patch on slices", "not least-privilege", |o| {
                let r = first_of(o, "ClusterRole");
                for rule in r["rules"].as_array_mut().unwrap() {
                    if rule["resources"] == serde_json::json!(["resourceslices"]) {
                        rule["verbs"].as_array_mut().unwrap().push("patch".into());
                    }
                }
            }),
            (
                "events read back",
                "grants more than creating events",
                |o| {
                    let r = first_of(o, "Role");
                    r["rules"][0]["verbs"] = serde_json::json!(["create", "list"]);
                },
            ),
            ("misspelt field", ".containers[0].livenessProbes", |o| {
                ds_container(o)["livenessProbes"] = serde_json::json!({})
            }),
            (
                "no readiness probe",
                "readiness probe must GET /readyz",
                |o| {
                    if let Some(c) = ds_container(o).as_object_mut() {
                        c.remove("readinessProbe");
                    }
                },
            ),
            (
                "a second subject bound to the role",
                "does not bind exactly",
                |o| {
                    let b = first_of(o, "ClusterRoleBinding");
                    let extra =
                        serde_json::json!({"kind": "Group", "name": "system:authenticated"});
                    b["subjects"].as_array_mut().unwrap().push(extra);
                },
            ),
            (
                "service account in another namespace",
                "not in the release namespace",
                |o| {
                    let sa = first_of(o, "ServiceAccount");
                    sa["metadata"]["namespace"] = "default".into();
                },
            ),
            (
                "an object the checks do not know",
                "do not know: [\"Namespace/aws-dra\"]",
                |o| {
                    o.push(serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "aws-dra"}}));
                },
            ),
            (
                "DeviceClass selecting another driver first",
                "first selector must be",
                |o| {
                    let c = first_of(o, "DeviceClass");
                    c["spec"]["selectors"][0]["cel"]["expression"] =
                        "device.driver == \"other.example.com\"".into();
                },
            ),
            (
                "Fargate and Auto Mode nodes not excluded",
                "a required node selector term has keys",
                |o| {
                    let ds = first_of(o, "DaemonSet");
                    let exprs = &mut ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                        ["nodeSelectorTerms"][0]["matchExpressions"];
                    exprs.as_array_mut().unwrap().truncate(1);
                },
            ),
            (
                "liveness probe shorter than the driver's own timeout",
                "must exceed the driver's own 10 s",
                |o| ds_container(o)["livenessProbe"]["timeoutSeconds"] = 5.into(),
            ),
            ("no CPU limit", "CPU and memory requests and limits", |o| {
                ds_container(o)["resources"]["limits"]
                    .as_object_mut()
                    .unwrap()
                    .remove("cpu");
            }),
            (
                "NetworkPolicy admitting a second port",
                "the only admitted port must be TCP metrics",
                |o| {
                    let np = first_of(o, "NetworkPolicy");
                    np["spec"]["ingress"][0]["ports"]
                        .as_array_mut()
                        .unwrap()
                        .push(serde_json::json!({"port": 22, "protocol": "TCP"}));
                },
            ),
        ];
        for (flaw, message, mutate) in table {
            let mut objs = good_rendering();
            mutate(&mut objs);
            match check_rendered(&EFA, &Expect::defaults(&EFA), &objs) {
                Ok(()) => panic!("not caught: {flaw}"),
                Err(e) => {
                    let e = format!("{e:#}");
                    assert!(
                        e.contains(message),
                        "{flaw}: caught for another reason: {e}"
                    );
                }
            }
        }
    }
}
