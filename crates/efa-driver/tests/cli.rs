//! The binary end to end: `discover` on generated fixtures.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use k8s_openapi::api::resource::v1::ResourceSlice;

fn discover(f: &sysfs_fixtures::Fixture, format: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_efa-driver"))
        .args(["discover", "--node-name", "n1", "-o", format])
        .arg("--sysfs-root")
        .arg(&f.sys)
        .arg("--dev-root")
        .arg(&f.dev)
        .env_remove("DRIVER_NAME")
        .output()
        .unwrap()
}

fn items(value: &serde_json::Value) -> Vec<ResourceSlice> {
    assert_eq!(value["apiVersion"], "v1");
    assert_eq!(value["kind"], "List");
    serde_json::from_value(value["items"].clone()).unwrap()
}

#[test]
fn discover_p5_prints_32_efas_four_per_gpu_root() {
    let dir = tempfile::tempdir().unwrap();
    let f = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
    let out = discover(&f, "yaml");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let slices = items(&value);
    assert_eq!(slices.len(), 1);
    let spec = &slices[0].spec;
    assert_eq!(spec.driver, "efa.networking.k8s.aws");
    assert_eq!(spec.node_name.as_deref(), Some("n1"));
    assert_eq!(spec.pool.name, "n1");
    let devices = spec.devices.as_ref().unwrap();
    assert_eq!(devices.len(), 32);
    let mut per_root: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in devices {
        let root = d.attributes.as_ref().unwrap()["resource.kubernetes.io/pcieRoot"]
            .string
            .clone()
            .unwrap();
        per_root.entry(root).or_default().insert(d.name.clone());
    }
    let gpu_roots: BTreeSet<String> = f.gpus.iter().map(|g| g.pcie_root.clone()).collect();
    assert_eq!(per_root.keys().cloned().collect::<BTreeSet<_>>(), gpu_roots);
    for (root, names) in &per_root {
        assert_eq!(names.len(), 4, "{root}");
    }
    // JSON gives the same slices.
    let json = discover(&f, "json");
    assert!(json.status.success());
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(items(&value), slices);
}

#[test]
fn discover_m5_prints_an_empty_pool_and_bad_root_fails() {
    let dir = tempfile::tempdir().unwrap();
    let f = sysfs_fixtures::generate("m5.8xlarge", dir.path()).unwrap();
    let out = discover(&f, "json");
    assert!(out.status.success());
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slices = items(&value);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.devices, None);

    let out = Command::new(env!("CARGO_BIN_EXE_efa-driver"))
        .args(["discover", "--node-name", "n1", "--sysfs-root"])
        .arg(dir.path().join("nowhere"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nowhere"), "{stderr}");
}

/// `(device, key, effect)` of every taint in the List `discover` printed.
fn taints(f: &sysfs_fixtures::Fixture) -> Vec<(String, String, String)> {
    let out = discover(f, "json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    items(&value)
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .flat_map(|d| {
            d.taints
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (d.name.clone(), t.key, t.effect))
        })
        .collect()
}

#[test]
fn discover_taints_only_the_efa_whose_admin_queue_closed() {
    let dir = tempfile::tempdir().unwrap();
    let f = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
    assert_eq!(taints(&f), vec![], "healthy fixture: no taints");
    let efa = &f.efas[5];
    sysfs_fixtures::health::inject(
        &f.sys,
        &sysfs_fixtures::health::Fault::EfaAdminQueueClosed {
            ibdev: efa.ibdev.clone(),
        },
    )
    .unwrap();
    let name = efa_driver::attributes::device_name(efa.bdf.parse().unwrap());
    let got = taints(&f);
    assert_eq!(got.len(), 1, "{got:?}");
    let (device, key, effect) = &got[0];
    assert_eq!(device, &name);
    assert!(key.starts_with("efa.networking.k8s.aws/"), "{key}");
    assert_eq!(key, "efa.networking.k8s.aws/admin-queue-closed");
    assert_eq!(effect, "NoSchedule");
}

#[test]
fn discover_healthy_fixtures_have_no_taints() {
    for it in sysfs_fixtures::instance_types() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate(it, dir.path()).unwrap();
        assert_eq!(taints(&f), vec![], "{it}");
    }
}
