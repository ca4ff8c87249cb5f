//! The reference Go driver (`e2e/go/refdriver`): building it into the cache,
//! the cluster objects it needs (DeviceClass, ServiceAccount, RBAC), and its
//! command line on a fixture node.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use e2e::charts::NAMESPACE;
use e2e::manifests;
use local_cluster::error::{Error, Result, io};
use local_cluster::go_build::{GoTarget, GoToolchain, Progress, build_set};
use local_cluster::paths::{cache_root, repo_root};

/// The reference driver's DRA driver name (and DeviceClass name).
pub const DRIVER_NAME: &str = "efa-ref.bench.aws-dra.dev";
/// Its ServiceAccount in [`NAMESPACE`].
pub const SERVICE_ACCOUNT: &str = "efa-ref-driver";
/// Its executable name.
pub const BINARY: &str = "refdriver";

/// Builds the reference driver (stripped, `-s -w`, as Go release builds
/// usually are) unless the cached build matches the module's sources.
/// Returns the binary's path.
pub fn build(progress: &mut Progress) -> Result<PathBuf> {
    let go = GoToolchain::find()?;
    let module = repo_root().join("e2e/go/refdriver");
    let mut key = Sha256::new();
    let mut sources: Vec<PathBuf> = fs::read_dir(&module)
        .map_err(io("listing", &module))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "go"))
        .collect();
    sources.sort();
    for path in &sources {
        key.update(fs::read(path).map_err(io("reading", path))?);
    }
    let out = cache_root().join("bin").join(BINARY);
    build_set(
        &go,
        BINARY,
        &module,
        &out,
        &[GoTarget {
            name: BINARY,
            package: ".".into(),
            cgo: false,
            ldflags: "-s -w".into(),
            tags: String::new(),
        }],
        &hex::encode(key.finalize()),
        progress,
    )?;
    Ok(out.join(BINARY))
}

/// DeviceClass, ServiceAccount, ClusterRole and binding of the reference
/// driver: what its chart would hold if it had one.
pub fn cluster_objects() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER_NAME},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER_NAME}\"")}}]},
        }),
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": SERVICE_ACCOUNT},
            "rules": [
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                 "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": SERVICE_ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SERVICE_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
        }),
    ]
}

/// Applies [`cluster_objects`] server-side.
pub async fn install(client: &kube::Client) -> Result<()> {
    for obj in cluster_objects() {
        manifests::apply(client, &obj, None).await?;
    }
    Ok(())
}

/// Writes the devices the reference driver publishes: `<driver> discover`
/// of the node's fixture (`efa-driver`, or `neuron-driver` for the Neuron
/// bench, with `env` set), under the reference driver's name. Returns the
/// file and the number of devices.
pub fn discover_devices(
    driver: &Path,
    env: &[(&str, &str)],
    sys: &Path,
    dev: &Path,
    node: &str,
    out: &Path,
) -> Result<(PathBuf, usize)> {
    let output = Command::new(driver)
        .envs(env.iter().copied())
        .arg("discover")
        .arg("--sysfs-root")
        .arg(sys)
        .arg("--dev-root")
        .arg(dev)
        .arg("--node-name")
        .arg(node)
        .arg("--driver-name")
        .arg(DRIVER_NAME)
        .args(["--output", "json"])
        .output()
        .map_err(|source| Error::Spawn {
            command: format!("{} discover", driver.display()),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::CommandFailed {
            command: format!("{} discover", driver.display()),
            status: output.status.to_string(),
            output_tail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let list: Value = serde_json::from_slice(&output.stdout).map_err(|source| Error::Json {
        what: format!("{} discover output", driver.display()),
        source,
    })?;
    let devices = list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    fs::write(out, &output.stdout).map_err(io("writing", out))?;
    Ok((out.to_path_buf(), devices))
}

/// The reference driver's command line on a fixture node (the node's
/// kubelet dirs and CDI dir come from the environment
/// [`local_cluster::LocalCluster::spawn_host_process`] sets).
pub fn command(binary: &Path, slices: &Path, sys: &Path, dev: &Path, kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.arg("--slices")
        .arg(slices)
        .arg("--sysfs-root")
        .arg(sys)
        .arg("--dev-root")
        .arg(dev)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--driver-name")
        .arg(DRIVER_NAME);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_name_the_driver_everywhere() {
        let objects = cluster_objects();
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "DeviceClass",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding"
            ]
        );
        assert!(
            objects[0]["spec"]["selectors"][0]["cel"]["expression"]
                .as_str()
                .unwrap()
                .contains(DRIVER_NAME)
        );
    }

    #[test]
    fn module_pins_the_helper_library_at_the_main_release() {
        let go_mod = fs::read_to_string(repo_root().join("e2e/go/refdriver/go.mod")).unwrap();
        let main = local_cluster::versions::KubernetesVersion::resolve(&format!(
            "1.{}",
            local_cluster::versions::MAIN_MINOR
        ))
        .unwrap();
        assert_eq!(
            local_cluster::go_build::required_version(
                &go_mod,
                "k8s.io/dynamic-resource-allocation"
            ),
            Some(main.staging_version())
        );
    }
}
