//! Discovery and attributes on every generated fixture, asserted against the
//! fixture's own description (never against a copy of this crate's output).

use std::collections::{BTreeMap, BTreeSet};

use efa_driver::attributes::{self, device_name};
use efa_driver::discovery::{UnusableReason, discover};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use sysfs_fixtures::{Fixture, generate, instance_types};
use topology::{PciAddress, SysfsRoot};

fn fixture(instance_type: &str) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let f = generate(instance_type, dir.path()).unwrap();
    (dir, f)
}

fn devices_of(f: &Fixture) -> Vec<Device> {
    attributes::devices(&discover(&SysfsRoot::new(&f.sys)).unwrap())
}

fn attr<'a>(d: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    d.attributes.as_ref().unwrap().get(name)
}

fn string_attr<'a>(d: &'a Device, name: &str) -> Option<&'a str> {
    attr(d, name).map(|a| {
        assert!(
            a.int.is_none() && a.bool.is_none() && a.version.is_none(),
            "{name} must be a string"
        );
        a.string.as_deref().expect("string attribute")
    })
}

fn int_attr(d: &Device, name: &str) -> Option<i64> {
    attr(d, name).map(|a| a.int.expect("int attribute"))
}

/// Instance types whose EFAs get the AWS device-group attributes.
const DEVICE_GROUP_TYPES: &[&str] = &[
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "trn2u.48xlarge",
];

#[test]
fn every_fixture_every_attribute() {
    for &it in instance_types() {
        let (_dir, f) = fixture(it);
        let devices = devices_of(&f);
        assert_eq!(devices.len(), f.efas.len(), "{it}: EFA count");
        let instance: topology::InstanceType = it.parse().unwrap();
        for (efa, dev) in f.efas.iter().zip(&devices) {
            let address: PciAddress = efa.bdf.parse().unwrap();
            assert_eq!(dev.name, device_name(address), "{it}");
            assert_eq!(
                dev.name,
                format!("efa-{}", efa.bdf.replace([':', '.'], "-")),
                "{it}"
            );
            assert_eq!(
                string_attr(dev, "resource.kubernetes.io/pcieRoot"),
                Some(efa.pcie_root.as_str()),
                "{it} {}",
                efa.bdf
            );
            assert_eq!(
                string_attr(dev, "resource.kubernetes.io/pciBusID"),
                Some(efa.bdf.as_str())
            );
            assert_eq!(
                int_attr(dev, "resource.kubernetes.io/numaNode"),
                efa.numa_node.map(i64::from),
                "{it} {}",
                efa.bdf
            );
            assert_eq!(
                string_attr(dev, "rdmaDevice"),
                Some(efa.ibdev.as_str()),
                "{it}"
            );
            assert_eq!(string_attr(dev, "instanceType"), Some(it));
            assert_eq!(
                string_attr(dev, "pciDeviceId"),
                Some(format!("0x{:04x}", efa.device_id).as_str())
            );
            assert_eq!(
                int_attr(dev, "efaGeneration"),
                Some(i64::from(efa.device_id - 0xefa0 + 1))
            );
            assert_eq!(string_attr(dev, "firmwareVersion"), Some("0.0.0"));
            assert!(string_attr(dev, "efaDriverVersion").is_some_and(|v| !v.is_empty()));
            assert_eq!(
                attr(dev, "draDriverVersion").and_then(|a| a.version.as_deref()),
                Some(env!("CARGO_PKG_VERSION"))
            );

            // Device groups: only on EFA-enabled Neuron types, equal to what
            // the Neuron side computes for the chips paired with this EFA.
            let groups: BTreeMap<&str, &str> = dev
                .attributes
                .as_ref()
                .unwrap()
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("resource.aws.com/")
                        .map(|n| (n, v.string.as_deref().unwrap()))
                })
                .collect();
            if DEVICE_GROUP_TYPES.contains(&it) {
                let table = topology::EfaTable::for_instance(&instance).unwrap();
                let chips = table.chips_for_efa(address);
                assert!(!chips.is_empty(), "{it}: EFA {} not in table", efa.bdf);
                for chip in chips {
                    let want = topology::device_groups_for_chip(&instance, chip).unwrap();
                    let want: BTreeMap<&str, &str> = want.attributes().into_iter().collect();
                    assert_eq!(groups, want, "{it} EFA {} chip {chip}", efa.bdf);
                }
                assert_eq!(groups["devicegroup1_id"], efa.bdf);
            } else {
                assert!(groups.is_empty(), "{it}: no device groups expected");
            }
            let expected_count = 9
                + usize::from(efa.numa_node.is_some())
                + if DEVICE_GROUP_TYPES.contains(&it) {
                    4
                } else {
                    0
                };
            assert_eq!(
                dev.attributes.as_ref().unwrap().len(),
                expected_count,
                "{it}: {:?}",
                dev.attributes.as_ref().unwrap().keys().collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn uverbs_numbers_match_the_fixture() {
    for it in ["p5.48xlarge", "trn1.32xlarge", "p4d.24xlarge"] {
        let (_dir, f) = fixture(it);
        let found = discover(&SysfsRoot::new(&f.sys)).unwrap();
        let got: Vec<(String, String, u32)> = found
            .efas
            .iter()
            .map(|e| (e.address.to_string(), e.rdma_device.clone(), e.uverbs))
            .collect();
        let want: Vec<(String, String, u32)> = f
            .efas
            .iter()
            .map(|e| (e.bdf.clone(), e.ibdev.clone(), e.uverbs))
            .collect();
        assert_eq!(got, want, "{it}");
        assert!(found.unusable.is_empty());
    }
}

#[test]
fn gpus_share_pcie_root_with_their_efas() {
    for (it, per_gpu) in [
        ("p4d.24xlarge", None),
        ("p5.48xlarge", Some(4)),
        ("p5en.48xlarge", Some(2)),
    ] {
        let (_dir, f) = fixture(it);
        let devices = devices_of(&f);
        let by_root = |root: &str| -> BTreeSet<String> {
            devices
                .iter()
                .filter(|d| string_attr(d, "resource.kubernetes.io/pcieRoot") == Some(root))
                .map(|d| {
                    string_attr(d, "resource.kubernetes.io/pciBusID")
                        .unwrap()
                        .to_owned()
                })
                .collect()
        };
        assert_eq!(f.gpus.len(), 8, "{it}");
        for gpu in &f.gpus {
            let efas = by_root(&gpu.pcie_root);
            // Expected: the EFAs the fixture places below the same switch.
            let want: BTreeSet<String> = f
                .efas
                .iter()
                .filter(|e| e.bridges.get(1) == gpu.bridges.get(1))
                .map(|e| e.bdf.clone())
                .collect();
            assert!(!efas.is_empty(), "{it}: GPU {} has no EFA", gpu.index);
            assert_eq!(efas, want, "{it}: GPU {}", gpu.index);
            if let Some(n) = per_gpu {
                assert_eq!(efas.len(), n, "{it}: GPU {}", gpu.index);
            }
        }
    }
    // p4d: two GPUs per root share its single EFA.
    let (_dir, f) = fixture("p4d.24xlarge");
    let roots: BTreeSet<&str> = f.gpus.iter().map(|g| g.pcie_root.as_str()).collect();
    assert_eq!(roots.len(), 4);
    assert_eq!(devices_of(&f).len(), 4);
}

#[test]
fn decoys_are_never_published() {
    for &it in instance_types() {
        let (_dir, f) = fixture(it);
        assert!(!f.decoys.is_empty(), "{it}: fixture has decoys");
        let names: BTreeSet<String> = devices_of(&f).into_iter().map(|d| d.name).collect();
        for decoy in &f.decoys {
            let a: PciAddress = decoy.bdf.parse().unwrap();
            assert!(!names.contains(&device_name(a)), "{it}: decoy {decoy:?}");
        }
        for chip in &f.neuron_chips {
            let a: PciAddress = chip.bdf.parse().unwrap();
            assert!(
                !names.contains(&device_name(a)),
                "{it}: Neuron chip {}",
                chip.index
            );
        }
        for gpu in &f.gpus {
            let a: PciAddress = gpu.bdf.parse().unwrap();
            assert!(!names.contains(&device_name(a)), "{it}: GPU {}", gpu.index);
        }
    }
}

#[test]
fn non_efa_instances_have_an_empty_pool() {
    for it in ["m5.8xlarge", "inf2.48xlarge"] {
        let (_dir, f) = fixture(it);
        let found = discover(&SysfsRoot::new(&f.sys)).unwrap();
        assert!(found.efas.is_empty() && found.unusable.is_empty(), "{it}");
        let slices = dra_core::testing::desired_slices(
            efa_driver::DRIVER_NAME,
            "n1",
            None,
            &attributes::devices(&found),
        );
        assert_eq!(slices.len(), 1, "{it}: one empty slice, not none");
        assert_eq!(slices[0].spec.devices, None);
        assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
    }
}

#[test]
fn unbound_or_broken_efas_are_reported_not_published() {
    let (_dir, f) = fixture("p5.48xlarge");
    let root = SysfsRoot::new(&f.sys);
    let unbound = f.efas[0].bdf.clone();
    f.unbind_driver(&unbound).unwrap();

    // An EFA whose driver is bound but whose verbs device is missing.
    let no_verbs = &f.efas[1];
    let fn_dir = std::fs::canonicalize(f.sys.join("bus/pci/devices").join(&no_verbs.bdf)).unwrap();
    std::fs::remove_dir_all(fn_dir.join("infiniband_verbs")).unwrap();
    std::fs::remove_file(
        f.sys
            .join(format!("class/infiniband_verbs/uverbs{}", no_verbs.uverbs)),
    )
    .unwrap();
    // And one without its RDMA device.
    let no_rdma = &f.efas[2];
    let fn_dir = std::fs::canonicalize(f.sys.join("bus/pci/devices").join(&no_rdma.bdf)).unwrap();
    std::fs::remove_dir_all(fn_dir.join("infiniband")).unwrap();

    let found = discover(&root).unwrap();
    assert_eq!(found.efas.len(), 29);
    let reasons: BTreeMap<String, UnusableReason> = found
        .unusable
        .iter()
        .map(|u| (u.address.to_string(), u.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        BTreeMap::from([
            (
                unbound.clone(),
                UnusableReason::DriverNotBound { driver: None }
            ),
            (
                no_verbs.bdf.clone(),
                UnusableReason::NoUverbsDevice {
                    rdma_device: no_verbs.ibdev.clone()
                }
            ),
            (no_rdma.bdf.clone(), UnusableReason::NoRdmaDevice),
        ])
    );
}

#[test]
fn uverbs_found_through_the_class_when_not_below_the_function() {
    let (_dir, f) = fixture("p4d.24xlarge");
    // Older kernels do not link infiniband_verbs below the PCI function;
    // class/infiniband_verbs/*/ibdev still names the RDMA device.
    for efa in &f.efas {
        let fn_dir = std::fs::canonicalize(f.sys.join("bus/pci/devices").join(&efa.bdf)).unwrap();
        let verbs = fn_dir.join("infiniband_verbs");
        let class_dir = f.sys.join("devices/virtual/infiniband_verbs");
        std::fs::create_dir_all(&class_dir).unwrap();
        let moved = class_dir.join(format!("uverbs{}", efa.uverbs));
        std::fs::rename(verbs.join(format!("uverbs{}", efa.uverbs)), &moved).unwrap();
        std::fs::remove_dir(&verbs).unwrap();
        let link = f
            .sys
            .join(format!("class/infiniband_verbs/uverbs{}", efa.uverbs));
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&moved, &link).unwrap();
    }
    let found = discover(&SysfsRoot::new(&f.sys)).unwrap();
    let got: Vec<u32> = found.efas.iter().map(|e| e.uverbs).collect();
    let want: Vec<u32> = f.efas.iter().map(|e| e.uverbs).collect();
    assert_eq!(got, want);
    assert!(found.unusable.is_empty());
}
