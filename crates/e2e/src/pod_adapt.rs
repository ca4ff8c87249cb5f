//! Pods as the suite runs them: an example's pod adapted to a cluster
//! without a registry (the probe image, never pulled) and, locally, without
//! a CNI (host network).

use serde_json::{Value, json};

use local_cluster::toolchain::PROBE_IMAGE;

/// Makes an example pod runnable on the local cluster: the probe image
/// (never pulled) instead of the example's, which prints what the container
/// got; host network (the probe needs no pod network) and a toleration for
/// every taint (a node is tainted until its kubelet reports Ready); a short
/// grace period (the probe exits on SIGTERM).
pub fn adapt_pod_for_local(pod: &mut Value) {
    use_probe_image(pod);
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("hostNetwork".into(), Value::Bool(true));
        spec.insert("tolerations".into(), json!([{"operator": "Exists"}]));
    }
}

/// The part of [`adapt_pod_for_local`] every cluster needs: the probe image
/// (never pulled) in every container, the example's command dropped, and a
/// short grace period (the probe exits on SIGTERM).
pub fn use_probe_image(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.insert("terminationGracePeriodSeconds".into(), json!(1));
    if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in containers.iter_mut().filter_map(Value::as_object_mut) {
            c.insert("image".into(), Value::String(PROBE_IMAGE.into()));
            c.insert("imagePullPolicy".into(), Value::String("Never".into()));
            c.remove("command");
            c.remove("args");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapted_pods_run_the_probe_on_the_host_network_and_keep_their_claims() {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {
                "resourceClaims": [{"name": "efa", "resourceClaimTemplateName": "t"}],
                "containers": [{
                    "name": "app", "image": "busybox", "command": ["sh"], "args": ["-c", "x"],
                    "resources": {"claims": [{"name": "efa"}]},
                }],
            },
        });
        adapt_pod_for_local(&mut pod);
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["image"], PROBE_IMAGE);
        assert_eq!(c["imagePullPolicy"], "Never");
        assert!(c.get("command").is_none() && c.get("args").is_none());
        assert_eq!(c["resources"]["claims"][0]["name"], "efa");
        assert_eq!(pod["spec"]["hostNetwork"], true);
        assert_eq!(pod["spec"]["tolerations"][0]["operator"], "Exists");
        assert_eq!(
            pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
            "t"
        );
    }
}
