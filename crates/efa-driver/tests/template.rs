//! `discover --instance-type` against `discover` on the fixture of the same
//! type, for every type with a model: the same slices, field by field,
//! once the runtime-only attributes are taken out of the fixture's devices
//! (and its EFAs renamed by PCI order, as the template names them); and the
//! same groups of devices sharing each runtime-only value. The list of
//! runtime-only attributes is the one `docs/autoscaling.md` documents.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use efa_driver::DRIVER_NAME;
use efa_driver::attributes::FIRMWARE_VERSION;
use efa_driver::template::{RUNTIME_ONLY, template_name};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::Value;

fn run(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_efa-driver"))
        .arg("discover")
        .args(args)
        .env_remove("DRIVER_NAME")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if args.contains(&"yaml") {
        serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap()
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn slices(document: &Value) -> Vec<ResourceSlice> {
    assert_eq!(
        (&document["apiVersion"], &document["kind"]),
        (&"v1".into(), &"List".into())
    );
    serde_json::from_value(document["items"].clone()).unwrap()
}

/// The name `matchAttribute` uses (the driver's domain where none).
fn qualified(attribute: &str) -> String {
    if attribute.contains('/') {
        attribute.to_owned()
    } else {
        format!("{DRIVER_NAME}/{attribute}")
    }
}

/// Groups of devices sharing a value of one attribute: `(qualified
/// attribute, sorted device names)`, sorted.
type Groups = BTreeSet<(String, Vec<String>)>;

/// Takes the runtime-only attributes out of every device of `slices`,
/// renames the EFAs by PCI order, and returns the groups of devices that
/// shared a value, as the template prints them: groups of two or more, and
/// of one in a shared domain except `pciBusID`.
fn strip(slices: &mut [ResourceSlice]) -> Groups {
    let mut names: Vec<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect();
    names.sort();
    let renamed: BTreeMap<String, String> = names
        .into_iter()
        .enumerate()
        .map(|(k, name)| (name, template_name(k as u32)))
        .collect();
    let mut by_value: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for device in slices
        .iter_mut()
        .flat_map(|s| s.spec.devices.iter_mut().flatten())
    {
        device.name = renamed[&device.name].clone();
        let attributes = device.attributes.as_mut().unwrap();
        for attribute in RUNTIME_ONLY {
            if let Some(value) = attributes.remove(*attribute) {
                let value = serde_json::to_string(&value).unwrap();
                by_value
                    .entry((attribute.to_string(), value))
                    .or_default()
                    .push(device.name.clone());
            }
        }
    }
    by_value
        .into_iter()
        .filter(|((a, _), d)| {
            d.len() >= 2 || (a.contains('/') && a != "resource.kubernetes.io/pciBusID")
        })
        .map(|((a, _), mut d)| {
            d.sort();
            (qualified(&a), d)
        })
        .collect()
}

/// The same slices, compared slice by slice and device by device so that
/// a failure names the device.
fn assert_same(template: &[ResourceSlice], real: &[ResourceSlice], it: &str) {
    assert_eq!(template.len(), real.len(), "{it}: slices");
    for (t, r) in template.iter().zip(real) {
        let (mut t, mut r) = (t.clone(), r.clone());
        let (td, rd) = (t.spec.devices.take(), r.spec.devices.take());
        assert_eq!(t, r, "{it}: the slice without its devices");
        let (td, rd) = (td.unwrap_or_default(), rd.unwrap_or_default());
        let names = |d: &[k8s_openapi::api::resource::v1::Device]| -> Vec<String> {
            d.iter().map(|d| d.name.clone()).collect()
        };
        assert_eq!(names(&td), names(&rd), "{it}: device names");
        for (t, r) in td.iter().zip(&rd) {
            assert_eq!(t, r, "{it}: {}", t.name);
        }
    }
}

fn bindings(document: &Value) -> Groups {
    document["attributeBindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let mut devices: Vec<String> = b["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    assert_eq!(d["driver"], DRIVER_NAME);
                    d["device"].as_str().unwrap().to_owned()
                })
                .collect();
            devices.sort();
            assert_eq!(b["group"].as_str().unwrap().len(), 12, "{b}");
            (b["attribute"].as_str().unwrap().to_owned(), devices)
        })
        .collect()
}

/// Every fixture type but the one without accelerators has a model, and
/// for each the template is the fixture's `discover` without what only a
/// node has, in JSON and YAML alike.
#[test]
fn templates_agree_with_fixture_discover_on_every_type() {
    let types: Vec<&str> = topology::catalog::INSTANCE_MODELS
        .iter()
        .map(|m| m.instance_type)
        .collect();
    let fixtures: Vec<&str> = sysfs_fixtures::instance_types()
        .iter()
        .copied()
        .filter(|t| *t != "m5.8xlarge")
        .collect();
    assert_eq!(types, fixtures);
    let mut published_somewhere = BTreeSet::new();
    for it in types {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate(it, dir.path()).unwrap();
        let (sys, dev) = (f.sys.to_str().unwrap(), f.dev.to_str().unwrap());
        let real = run(&["--sysfs-root", sys, "--dev-root", dev, "--node-name", it]);
        let mut real = slices(&real);
        for d in real.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            published_somewhere.extend(d.attributes.as_ref().unwrap().keys().cloned());
        }
        let mut real_groups = strip(&mut real);
        let template = run(&["--instance-type", it]);
        assert_same(&slices(&template), &real, it);
        assert_eq!(
            run(&["--instance-type", it, "-o", "yaml"]),
            template,
            "{it}"
        );
        // The firmware version is not bound: adapters may differ.
        let firmware = qualified(FIRMWARE_VERSION);
        real_groups.retain(|(a, _)| *a != firmware);
        assert_eq!(bindings(&template), real_groups, "{it}");
        let runtime_only: Vec<String> = RUNTIME_ONLY.iter().map(|a| qualified(a)).collect();
        assert_eq!(
            template["runtimeOnlyAttributes"],
            serde_json::json!(runtime_only)
        );
        if !f.efas.is_empty() {
            assert!(!real_groups.is_empty(), "{it}: nothing shared");
        }
    }
    for attribute in RUNTIME_ONLY {
        assert!(
            published_somewhere.contains(*attribute),
            "{attribute} is never published"
        );
    }
}

/// `--sharing capacity` changes nothing, as in `discover`, which asks no
/// API server whether it keeps the consumable-capacity fields; a node name
/// names the pool; a type without a model, a hardware root beside a type,
/// or neither a type nor a node name is an error.
#[test]
fn flags_and_errors() {
    let shared = run(&["--instance-type", "p5.48xlarge", "--sharing", "capacity"]);
    assert_eq!(
        slices(&shared),
        slices(&run(&["--instance-type", "p5.48xlarge"]))
    );
    let named = run(&["--instance-type", "p5.48xlarge", "--node-name", "n1"]);
    assert_eq!(slices(&named)[0].spec.pool.name, "n1");
    for (args, says) in [
        (&["--instance-type", "m5.8xlarge"][..], "p5.48xlarge"),
        (
            &["--instance-type", "p5.48xlarge", "--sysfs-root", "/sys"],
            "cannot be used with",
        ),
        (&[], "--node-name"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_efa-driver"))
            .arg("discover")
            .args(args)
            .env_remove("NODE_NAME")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// `docs/autoscaling.md` lists exactly these attributes as the EFA
/// driver's runtime-only ones.
#[test]
fn runtime_only_attributes_are_the_documented_ones() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/autoscaling.md"),
    )
    .unwrap();
    let documented: BTreeSet<&str> = doc
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 3 && cells[1] == "EFA").then(|| cells[2].trim_matches('`'))
        })
        .collect();
    assert_eq!(documented, RUNTIME_ONLY.iter().copied().collect());
}
