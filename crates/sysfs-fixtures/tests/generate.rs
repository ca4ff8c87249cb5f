//! The generated trees have what the kernel would have put there.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use sysfs_fixtures::{
    Bdf, DeviceKind, DeviceNodes, FixtureError, Node, UVERBS_MAJOR, generate, generate_spec,
    instance_types, spec,
};

fn read(p: impl AsRef<Path>) -> String {
    let p = p.as_ref();
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn counts_per_instance_type() {
    // (type, GPUs, EFAs, Neuron chips, cores per chip)
    let table = [
        ("p4d.24xlarge", 8, 4, 0, 0),
        ("p5.48xlarge", 8, 32, 0, 0),
        ("p5en.48xlarge", 8, 16, 0, 0),
        ("trn1.32xlarge", 0, 8, 16, 2),
        ("trn1n.32xlarge", 0, 16, 16, 2),
        ("trn2.48xlarge", 0, 16, 16, 8),
        ("trn2u.48xlarge", 0, 16, 16, 8),
        ("inf2.48xlarge", 0, 0, 12, 2),
        ("m5.8xlarge", 0, 0, 0, 0),
    ];
    let listed: Vec<&str> = table.iter().map(|r| r.0).collect();
    assert_eq!(instance_types(), listed.as_slice());
    for (t, gpus, efas, chips, cores) in table {
        let dir = tempfile::tempdir().unwrap();
        let f = generate(t, dir.path()).unwrap();
        assert_eq!(
            (f.gpus.len(), f.efas.len(), f.neuron_chips.len()),
            (gpus, efas, chips),
            "{t}"
        );
        assert!(f.neuron_chips.iter().all(|c| c.core_count == cores), "{t}");
        assert!(
            f.decoys
                .iter()
                .any(|d| d.device == 0xec20 && d.driver == "ena"),
            "{t}"
        );
        assert_eq!(
            read(f.sys.join("devices/virtual/dmi/id/product_name")),
            format!("{t}\n")
        );
        let uverbs: Vec<u32> = f.efas.iter().map(|e| e.uverbs).collect();
        assert_eq!(uverbs, (0..efas as u32).collect::<Vec<_>>(), "{t}");
        // Every described function is on the bus, resolves, and has a driver.
        for bdf in f
            .efas
            .iter()
            .map(|e| &e.bdf)
            .chain(f.gpus.iter().map(|g| &g.bdf))
            .chain(f.neuron_chips.iter().map(|c| &c.bdf))
        {
            let link = f.sys.join("bus/pci/devices").join(bdf);
            let real = fs::canonicalize(&link).unwrap();
            assert!(real.starts_with(fs::canonicalize(f.sys.join("devices")).unwrap()));
            assert!(real.join("driver").exists(), "{t} {bdf}");
        }
    }
}

#[test]
fn efa_rdma_and_verbs_entries() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("p5.48xlarge", dir.path()).unwrap();
    assert_eq!(read(f.sys.join("module/efa/version")), "2.13.0g\n");
    for e in &f.efas {
        let pci = fs::canonicalize(f.sys.join("bus/pci/devices").join(&e.bdf)).unwrap();
        let ib = f.sys.join("class/infiniband").join(&e.ibdev);
        assert_eq!(fs::canonicalize(ib.join("device")).unwrap(), pci);
        assert!(pci.join("infiniband").join(&e.ibdev).is_dir());
        let verbs = f
            .sys
            .join(format!("class/infiniband_verbs/uverbs{}", e.uverbs));
        assert_eq!(read(verbs.join("ibdev")), format!("{}\n", e.ibdev));
        assert_eq!(read(verbs.join("dev")), format!("231:{}\n", 192 + e.uverbs));
        assert_eq!(fs::canonicalize(verbs.join("device")).unwrap(), pci);
        let drv = fs::canonicalize(f.sys.join("bus/pci/drivers/efa").join(&e.bdf)).unwrap();
        assert_eq!(drv, pci);
        let node = f.dev.join(format!("infiniband/uverbs{}", e.uverbs));
        let meta = fs::metadata(&node).unwrap();
        match f.device_nodes {
            DeviceNodes::CharDevices => {
                assert!(meta.file_type().is_char_device());
                let rdev = meta.rdev();
                assert_eq!(
                    (nix_major(rdev), nix_minor(rdev)),
                    (UVERBS_MAJOR as u64, 192 + e.uverbs as u64)
                );
            }
            DeviceNodes::PlainFiles => assert!(meta.is_file()),
        }
    }
    assert!(f.dev.join("infiniband/rdma_cm").exists());
    assert!(f.dev.join("nvidia7").exists() && f.dev.join("nvidiactl").exists());
    // ENA has a netdev, EFA does not.
    assert!(f.sys.join("class/net/ens5/operstate").exists());
}

fn nix_major(rdev: u64) -> u64 {
    ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff)
}
fn nix_minor(rdev: u64) -> u64 {
    ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)
}

#[test]
fn neuron_class_tree() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("trn2.48xlarge", dir.path()).unwrap();
    let c = |n: u32, file: &str| read(f.sys.join(format!("class/neuron_device/neuron{n}/{file}")));
    assert_eq!(c(0, "connected_devices"), "12, 3, 4, 1\n");
    assert_eq!(c(5, "connected_devices"), "1, 4, 9, 6\n");
    assert_eq!(c(0, "core_count"), "8");
    assert_eq!(c(0, "info/architecture/device_name"), "Trainium2\n");
    assert!(f.dev.join("neuron15").exists());
    assert_eq!(f.neuron_chips[0].bdf, "0000:cc:00.0");
    assert_eq!(f.neuron_chips[4].bdf, "0000:6f:00.0");
    // The class device is virtual: no link to the PCI function.
    let real = fs::canonicalize(f.sys.join("class/neuron_device/neuron0")).unwrap();
    assert!(real.ends_with("devices/virtual/neuron_device/neuron0"));
    assert!(!real.join("device").exists());

    let dir = tempfile::tempdir().unwrap();
    let f = generate("inf2.48xlarge", dir.path()).unwrap();
    assert_eq!(
        read(f.sys.join("class/neuron_device/neuron0/connected_devices")),
        "11, 1\n"
    );
    assert_eq!(
        read(f.sys.join("class/neuron_device/neuron11/core_count")),
        "2"
    );
    assert!(!f.sys.join("class/infiniband").exists());
}

#[test]
fn plain_files_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate_spec(
        spec("trn1.32xlarge").unwrap(),
        dir.path(),
        Some(DeviceNodes::PlainFiles),
    )
    .unwrap();
    assert!(fs::metadata(f.dev.join("neuron0")).unwrap().is_file());
    assert_eq!(f.device_nodes, DeviceNodes::PlainFiles);
}

#[test]
fn rdma_names_and_unknown_types() {
    assert_eq!(Bdf::new(0x4f, 0).rdma_name(), "rdmap79s0");
    assert_eq!(Bdf::new(0x10, 0x1a).rdma_name(), "rdmap16s26");
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        generate("x1.nano", dir.path()),
        Err(FixtureError::UnknownInstanceType(_))
    ));
}

#[test]
fn every_description_is_a_possible_pci_tree_and_broken_ones_are_refused() {
    for t in instance_types() {
        spec(t)
            .unwrap()
            .validate()
            .unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let mut s = spec("m5.8xlarge").unwrap();
    s.roots[0].children.push(Node::Device {
        bdf: Bdf::new(0, 5),
        kind: DeviceKind::Nvme { device_id: 0x8061 },
    });
    s.roots[0].children.push(Node::Device {
        bdf: Bdf::new(7, 1),
        kind: DeviceKind::Nvme { device_id: 0x8061 },
    });
    let dir = tempfile::tempdir().unwrap();
    let err = generate_spec(s, dir.path(), None).unwrap_err().to_string();
    assert!(
        err.contains("0000:00:05.0 appears twice") && err.contains("several buses"),
        "{err}"
    );
}

/// The kernel driver's class-level UltraServer files, in each form, and the
/// fixture names of the 4 nodes of one UltraServer.
#[test]
fn trn2u_ultraserver_files_in_every_form() {
    let read = |fx: &sysfs_fixtures::Fixture, name: &str| {
        std::fs::read_to_string(fx.sys.join("class/neuron_device").join(name)).unwrap()
    };
    let mut ids4 = std::collections::BTreeSet::new();
    let mut ids2 = std::collections::BTreeSet::new();
    for node in 0..4u32 {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("trn2u.48xlarge@node{node}");
        let fx = sysfs_fixtures::generate(&name, dir.path()).unwrap();
        assert_eq!(fx.instance_type, "trn2u.48xlarge");
        assert_eq!(sysfs_fixtures::instance_type_of(&name), "trn2u.48xlarge");
        assert_eq!(
            std::fs::read_to_string(fx.sys.join("devices/virtual/dmi/id/product_name")).unwrap(),
            "trn2u.48xlarge\n"
        );
        assert_eq!(fx.neuron_chips.len(), 16);
        assert_eq!(read(&fx, "ultraserver_mode"), "1,2,3,4\n");
        assert_eq!(read(&fx, "node_id_4"), format!("{node}\n"));
        assert_eq!(read(&fx, "node_id_2"), format!("{}\n", node % 2));
        let id4 = read(&fx, "server_id_4");
        let id2 = read(&fx, "server_id_2");
        assert_eq!(id4.trim().len(), 16);
        assert!(id4.trim().bytes().all(|b| b.is_ascii_hexdigit()));
        ids4.insert(id4);
        ids2.insert(id2);
    }
    assert_eq!(
        (ids4.len(), ids2.len()),
        (1, 2),
        "one 4-node set, two 2-node sets"
    );

    let forms = [
        (
            "trn2u.48xlarge@busy",
            [
                "busy",
                "0000000000000000",
                "0000000000000000",
                "busy",
                "busy",
            ],
        ),
        (
            "trn2u.48xlarge@none",
            ["", "0000000000000000", "0000000000000000", "-1", "-1"],
        ),
        (
            "trn2.48xlarge",
            ["", "0000000000000000", "0000000000000000", "-1", "-1"],
        ),
    ];
    for (name, want) in forms {
        let dir = tempfile::tempdir().unwrap();
        let fx = sysfs_fixtures::generate(name, dir.path()).unwrap();
        let files = [
            "ultraserver_mode",
            "server_id_2",
            "server_id_4",
            "node_id_2",
            "node_id_4",
        ];
        for (file, value) in files.iter().zip(want) {
            assert_eq!(read(&fx, file), format!("{value}\n"), "{name} {file}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let fx = sysfs_fixtures::generate("trn2u.48xlarge@node3-modes1_2_3", dir.path()).unwrap();
    assert_eq!(read(&fx, "ultraserver_mode"), "1,2,3\n");
    for bad in [
        "trn2u.48xlarge@node4",
        "trn2u.48xlarge@node1-modes5",
        "trn2u.48xlarge@x",
        "trn2.48xlarge@node1",
    ] {
        assert!(sysfs_fixtures::generate(bad, dir.path()).is_err(), "{bad}");
    }
}
