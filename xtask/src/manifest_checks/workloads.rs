//! The workload scheduling fields of `examples/` that our k8s-openapi types
//! (v1_34) predate: a `scheduling.k8s.io/v1beta1` PodGroup, and a pod's
//! `spec.schedulingGroup`. Checked field by field against `k8s.io/api`
//! v0.37.2's `scheduling/v1beta1/types.go` and `core/v1/types.go`, for
//! the subset the examples use; anything else is refused by name, so a
//! misspelt field fails here as it does for the typed objects.

use anyhow::{Result, bail, ensure};
use serde_json::{Map, Value};

/// The keys of `obj` (an object at `path`) must be among `known`.
pub(super) fn only(obj: &Value, path: &str, known: &[&str]) -> Result<Map<String, Value>> {
    let Some(map) = obj.as_object() else {
        bail!("{path}: not an object");
    };
    for key in map.keys() {
        ensure!(
            known.contains(&key.as_str()),
            "{path}.{key}: not a field this check knows (known: {})",
            known.join(", ")
        );
    }
    Ok(map.clone())
}

fn string(v: &Value, path: &str) -> Result<()> {
    ensure!(
        v.as_str().is_some_and(|s| !s.is_empty()),
        "{path}: not a non-empty string"
    );
    Ok(())
}

/// A PodGroup's fields (its metadata is checked by the caller): a gang or
/// basic scheduling policy, at most one topology key, an optional workload
/// reference and priority class.
pub(super) fn check_pod_group(obj: &Value) -> Result<()> {
    only(obj, "", &["apiVersion", "kind", "metadata", "spec"])?;
    let spec = only(
        &obj["spec"],
        ".spec",
        &[
            "schedulingPolicy",
            "schedulingConstraints",
            "workloadRef",
            "priorityClassName",
        ],
    )?;
    let policy = only(
        &obj["spec"]["schedulingPolicy"],
        ".spec.schedulingPolicy",
        &["basic", "gang"],
    )?;
    ensure!(
        policy.len() == 1,
        ".spec.schedulingPolicy: exactly one of basic, gang"
    );
    if let Some(gang) = policy.get("gang") {
        only(gang, ".spec.schedulingPolicy.gang", &["minCount"])?;
        ensure!(
            gang["minCount"].as_i64().is_some_and(|n| n >= 1),
            ".spec.schedulingPolicy.gang.minCount: an integer of at least 1"
        );
    }
    if let Some(basic) = policy.get("basic") {
        only(basic, ".spec.schedulingPolicy.basic", &[])?;
    }
    if let Some(constraints) = spec.get("schedulingConstraints") {
        only(constraints, ".spec.schedulingConstraints", &["topology"])?;
        let topology = constraints["topology"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        ensure!(
            topology.len() <= 1,
            ".spec.schedulingConstraints.topology: at most one entry"
        );
        for (i, t) in topology.iter().enumerate() {
            let path = format!(".spec.schedulingConstraints.topology[{i}]");
            only(t, &path, &["key"])?;
            string(&t["key"], &format!("{path}.key"))?;
        }
    }
    if let Some(workload) = spec.get("workloadRef") {
        only(
            workload,
            ".spec.workloadRef",
            &["workloadName", "templateName"],
        )?;
        string(&workload["workloadName"], ".spec.workloadRef.workloadName")?;
        string(&workload["templateName"], ".spec.workloadRef.templateName")?;
    }
    if let Some(class) = spec.get("priorityClassName") {
        string(class, ".spec.priorityClassName")?;
    }
    Ok(())
}

/// `pod` without `spec.schedulingGroup`, once that is `{podGroupName}`,
/// for the typed check of the rest; `None` when it has none.
pub(super) fn without_scheduling_group(pod: &Value) -> Result<Option<Value>> {
    let Some(group) = pod["spec"].get("schedulingGroup") else {
        return Ok(None);
    };
    only(group, ".spec.schedulingGroup", &["podGroupName"])?;
    string(&group["podGroupName"], ".spec.schedulingGroup.podGroupName")?;
    let mut rest = pod.clone();
    if let Some(spec) = rest["spec"].as_object_mut() {
        spec.remove("schedulingGroup");
    }
    Ok(Some(rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn group() -> Value {
        json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "g"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 4}},
                "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]}}})
    }

    #[test]
    fn a_gang_passes_and_each_mistake_is_named() {
        check_pod_group(&group()).unwrap();
        type Break = fn(&mut Value);
        let cases: [(&str, Break); 5] = [
            ("minCount", |g| {
                g["spec"]["schedulingPolicy"]["gang"]["minCount"] = json!(0)
            }),
            ("exactly one", |g| {
                g["spec"]["schedulingPolicy"]["basic"] = json!({})
            }),
            ("minCounts", |g| {
                g["spec"]["schedulingPolicy"]["gang"]["minCounts"] = json!(2)
            }),
            ("at most one", |g| {
                g["spec"]["schedulingConstraints"]["topology"] = json!([{"key": "a"}, {"key": "b"}])
            }),
            ("topologyKey", |g| {
                g["spec"]["schedulingConstraints"]["topology"] = json!([{"topologyKey": "a"}])
            }),
        ];
        for (want, break_it) in cases {
            let mut g = group();
            break_it(&mut g);
            let err = check_pod_group(&g).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn the_scheduling_group_is_checked_then_set_aside() {
        let pod = json!({"spec": {"schedulingGroup": {"podGroupName": "g"}, "containers": []}});
        let rest = without_scheduling_group(&pod).unwrap().unwrap();
        assert_eq!(rest, json!({"spec": {"containers": []}}));
        assert_eq!(without_scheduling_group(&rest).unwrap(), None);
        let bad = json!({"spec": {"schedulingGroup": {"podGroup": "g"}}});
        assert!(without_scheduling_group(&bad).is_err());
    }
}
