//! A `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet, which k8s-openapi has
//! no type for: its own fields checked against LWS v0.7.0's
//! `api/leaderworkerset/v1/leaderworkerset_types.go` (names, and the enums
//! its kubebuilder markers declare), its pod templates as the core v1
//! `PodTemplateSpec` they are.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use super::workloads::only;

/// The spec's fields; each pod template is handed to `template`.
pub(super) fn check_leader_worker_set(
    obj: &Value,
    template: impl Fn(&Value) -> Result<()>,
) -> Result<()> {
    only(obj, "", &["apiVersion", "kind", "metadata", "spec"])?;
    let spec = only(
        &obj["spec"],
        ".spec",
        &[
            "replicas",
            "leaderWorkerTemplate",
            "rolloutStrategy",
            "startupPolicy",
            "networkConfig",
        ],
    )?;
    if let Some(r) = spec.get("replicas") {
        ensure!(r.as_u64().is_some(), ".spec.replicas: not a count");
    }
    if let Some(p) = spec.get("startupPolicy") {
        one_of(p, ".spec.startupPolicy", &["LeaderCreated", "LeaderReady"])?;
    }
    let lwt = only(
        &obj["spec"]["leaderWorkerTemplate"],
        ".spec.leaderWorkerTemplate",
        &[
            "leaderTemplate",
            "workerTemplate",
            "size",
            "restartPolicy",
            "subGroupPolicy",
        ],
    )?;
    if let Some(size) = lwt.get("size") {
        ensure!(
            size.as_u64().is_some_and(|s| s >= 1),
            ".spec.leaderWorkerTemplate.size: not a count of at least 1"
        );
    }
    if let Some(p) = lwt.get("restartPolicy") {
        one_of(
            p,
            ".spec.leaderWorkerTemplate.restartPolicy",
            &["Default", "RecreateGroupOnPodRestart", "None"],
        )?;
    }
    ensure!(
        lwt.contains_key("workerTemplate"),
        ".spec.leaderWorkerTemplate.workerTemplate is required"
    );
    for name in ["leaderTemplate", "workerTemplate"] {
        if let Some(t) = lwt.get(name) {
            template(t).with_context(|| format!(".spec.leaderWorkerTemplate.{name}"))?;
        }
    }
    Ok(())
}

fn one_of(v: &Value, path: &str, allowed: &[&str]) -> Result<()> {
    ensure!(
        v.as_str().is_some_and(|s| allowed.contains(&s)),
        "{path}: {v} is not one of {}",
        allowed.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lws() -> Value {
        json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "l"},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 4,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "workerTemplate": {"spec": {"containers": []}}}}})
    }

    #[test]
    fn misspelt_or_invalid_fields_are_refused() {
        let ok = |_: &Value| Ok(());
        check_leader_worker_set(&lws(), ok).unwrap();
        for (pointer, value) in [
            ("/spec/leaderWorkerTemplate/restartPolicy", json!("Always")),
            ("/spec/leaderWorkerTemplate/size", json!(0)),
            ("/spec/replica", json!(1)),
            ("/spec/leaderWorkerTemplate/workerTemplates", json!({})),
        ] {
            let mut bad = lws();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            bad.pointer_mut(parent).unwrap()[key] = value;
            assert!(check_leader_worker_set(&bad, ok).is_err(), "{pointer}");
        }
        let refuse = |_: &Value| anyhow::bail!("bad template");
        assert!(check_leader_worker_set(&lws(), refuse).is_err());
    }
}
