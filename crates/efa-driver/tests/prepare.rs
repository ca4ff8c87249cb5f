//! Prepare: container edits for 1, 4 and all EFAs of a fixture, shared-claim
//! determinism and the error paths.

use std::collections::BTreeMap;

use dra_core::{AllocatedDevice, ClaimRef, DeviceNode, Driver};
use efa_driver::attributes::device_name;
use efa_driver::prepare::ENV_RDMA_DEVICES;
use efa_driver::{EfaConfig, EfaDriver};
use sysfs_fixtures::{EfaInfo, Fixture, generate};
use topology::{PciAddress, SysfsRoot};

fn fixture(it: &str) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let f = generate(it, dir.path()).unwrap();
    (dir, f)
}

fn driver(f: &Fixture) -> EfaDriver {
    EfaDriver::new(SysfsRoot::new(&f.sys), &f.dev)
}

fn name(e: &EfaInfo) -> String {
    device_name(e.bdf.parse::<PciAddress>().unwrap())
}

fn alloc(devices: &[String]) -> Vec<AllocatedDevice<EfaConfig>> {
    devices
        .iter()
        .map(|d| AllocatedDevice {
            request: "efa".into(),
            pool: "n1".into(),
            device: d.clone(),
            admin_access: false,
            config: Some(EfaConfig {}),
        })
        .collect()
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ml".into(),
        name: "efa-claim".into(),
        uid: uid.into(),
    }
}

fn expected_node(f: &Fixture, rel: &str) -> DeviceNode {
    DeviceNode {
        path: format!("/dev/{rel}"),
        host_path: Some(f.dev.join(rel).display().to_string()),
    }
}

#[tokio::test]
async fn prepare_one_four_and_all() {
    let (_dir, f) = fixture("p5.48xlarge");
    let d = driver(&f);
    for count in [1usize, 4, f.efas.len()] {
        // Every 3rd EFA, so the set is not just the first ones.
        let picked: Vec<&EfaInfo> = f.efas.iter().step_by(3).cycle().take(count).collect();
        let picked: Vec<&EfaInfo> = if count == f.efas.len() {
            f.efas.iter().collect()
        } else {
            picked
        };
        let names: Vec<String> = picked.iter().map(|e| name(e)).collect();
        let edits = d.prepare(&claim("u1"), &alloc(&names)).await.unwrap();
        assert_eq!(edits.len(), count);
        let mut ibdevs: Vec<&str> = picked.iter().map(|e| e.ibdev.as_str()).collect();
        ibdevs.sort();
        let list = ibdevs.join(",");
        for (e, got) in picked.iter().zip(&edits) {
            assert_eq!(got.device, name(e));
            assert_eq!(
                got.edits.device_nodes,
                vec![
                    expected_node(&f, &format!("infiniband/uverbs{}", e.uverbs)),
                    expected_node(&f, "infiniband/rdma_cm"),
                ],
                "{count}: {}",
                e.bdf
            );
            assert_eq!(
                got.edits.env,
                BTreeMap::from([(ENV_RDMA_DEVICES.to_owned(), list.clone())])
            );
        }
        if count == 1 {
            assert_eq!(list, picked[0].ibdev);
        }
    }
    // The first p5 EFA is the one the docs use as the example.
    assert_eq!(f.efas[0].ibdev, "rdmap79s0");
}

#[tokio::test]
async fn shared_claim_answers_identically() {
    let (_dir, f) = fixture("trn2.48xlarge");
    let d = driver(&f);
    let names: Vec<String> = f.efas.iter().take(4).map(name).collect();
    let first = d.prepare(&claim("shared"), &alloc(&names)).await.unwrap();
    let again = d.prepare(&claim("shared"), &alloc(&names)).await.unwrap();
    assert_eq!(first, again);
    // Kubelet may list results in another order: same edits per device.
    let mut reversed = names.clone();
    reversed.reverse();
    let rev = d
        .prepare(&claim("shared"), &alloc(&reversed))
        .await
        .unwrap();
    let by_device = |v: &[dra_core::DeviceEdits]| -> BTreeMap<String, dra_core::ContainerEdits> {
        v.iter()
            .map(|e| (e.device.clone(), e.edits.clone()))
            .collect()
    };
    assert_eq!(by_device(&first), by_device(&rev));
    d.unprepare(&claim("shared"), &[]).await.unwrap();
}

#[tokio::test]
async fn no_rdma_cm_on_the_host_means_none_in_the_container() {
    let (_dir, f) = fixture("p4d.24xlarge");
    std::fs::remove_file(f.dev.join("infiniband/rdma_cm")).unwrap();
    let edits = driver(&f)
        .prepare(&claim("u"), &alloc(&[name(&f.efas[0])]))
        .await
        .unwrap();
    assert_eq!(
        edits[0].edits.device_nodes,
        vec![expected_node(
            &f,
            &format!("infiniband/uverbs{}", f.efas[0].uverbs)
        )]
    );
}

#[tokio::test]
async fn missing_host_node_names_the_host_path() {
    let (_dir, f) = fixture("p4d.24xlarge");
    // /dev on this machine has no EFA: the check for the host node fails
    // before any container is created, and says which path it looked at.
    let d = EfaDriver::new(SysfsRoot::new(&f.sys), "/dev");
    let err = d
        .prepare(&claim("u"), &alloc(&[name(&f.efas[0])]))
        .await
        .unwrap_err();
    assert!(
        err.message
            .contains(&format!("/dev/infiniband/uverbs{}", f.efas[0].uverbs)),
        "{err}"
    );
}

/// (devices, fixture mutation before the call, expected message part)
type ErrorCase = (Vec<String>, Box<dyn Fn(&Fixture)>, &'static str);

#[tokio::test]
async fn prepare_errors_name_the_device() {
    let (_dir, f) = fixture("p5.48xlarge");
    let d = driver(&f);
    let cases: Vec<ErrorCase> = vec![
        (
            vec!["neuron-device-0".into()],
            Box::new(|_| {}),
            "not an EFA device name",
        ),
        (
            vec!["efa-0000-00-05-0".into()],
            Box::new(|_| {}),
            "PCI function 1d0f:ec20 is not an EFA",
        ),
        (
            vec![name(&f.efas[5])],
            Box::new(|f: &Fixture| f.unbind_driver(&f.efas[5].bdf).unwrap()),
            "no kernel driver bound",
        ),
        (
            vec![name(&f.efas[6])],
            Box::new(|f: &Fixture| f.remove_efa(&f.efas[6].bdf).unwrap()),
            "efa-0000",
        ),
        (
            vec![name(&f.efas[7])],
            Box::new(|f: &Fixture| {
                std::fs::remove_file(f.dev.join(format!("infiniband/uverbs{}", f.efas[7].uverbs)))
                    .unwrap()
            }),
            "does not exist (check --dev-root)",
        ),
    ];
    for (devices, mutate, want) in cases {
        mutate(&f);
        let err = d.prepare(&claim("u"), &alloc(&devices)).await.unwrap_err();
        assert!(err.message.contains(want), "{devices:?}: {err}");
        assert!(
            err.message.contains(&devices[0]) || err.message.contains(want),
            "{err}"
        );
    }
}
