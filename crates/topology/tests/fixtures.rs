//! The topology crate against every generated instance type: what it reads
//! must be what the fixture description says was written.

use std::collections::BTreeMap;
use std::path::Path;

use sysfs_fixtures::{Fixture, generate, instance_types};
use topology::{
    DeviceKind, EfaTable, InstanceType, LocatedChip, PciAddress, PciDevice, PciScan, Proximity,
    SysfsRoot, check_table, classify, derive_pairing, nearest, nearest_unique, proximity, scan,
};

struct Scanned {
    fixture: Fixture,
    scan: PciScan,
    _dir: tempfile::TempDir,
}

fn load(instance_type: &str) -> Scanned {
    let dir = tempfile::tempdir().unwrap();
    let fixture = generate(instance_type, dir.path()).unwrap();
    let scan = scan(&SysfsRoot::new(&fixture.sys)).unwrap();
    assert!(scan.errors.is_empty(), "{instance_type}: {:?}", scan.errors);
    Scanned {
        fixture,
        scan,
        _dir: dir,
    }
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

impl Scanned {
    fn dev(&self, bdf: &str) -> &PciDevice {
        self.scan
            .get(addr(bdf))
            .unwrap_or_else(|| panic!("{bdf} not scanned"))
    }
    fn efas(&self) -> Vec<&PciDevice> {
        self.scan
            .devices
            .iter()
            .filter(|d| classify(d) == DeviceKind::Efa)
            .collect()
    }
    fn chips(&self) -> Vec<LocatedChip<'_>> {
        self.fixture
            .neuron_chips
            .iter()
            .map(|c| LocatedChip {
                index: c.index,
                device: self.dev(&c.bdf),
            })
            .collect()
    }
}

fn assert_place(d: &PciDevice, root: &str, numa: Option<u32>, bridges: &[String], what: &str) {
    assert_eq!(d.pcie_root.to_string(), root, "{what} pcieRoot");
    assert_eq!(d.numa_node, numa, "{what} NUMA");
    let got: Vec<String> = d.bridges.iter().map(|b| b.to_string()).collect();
    assert_eq!(got, bridges, "{what} bridges");
    assert!(
        d.local_cpulist.as_ref().is_some_and(|c| !c.is_empty()),
        "{what} cpulist"
    );
}

#[test]
fn every_fixture_reads_back_as_described() {
    assert_eq!(instance_types().len(), 9);
    for t in instance_types() {
        let s = load(t);
        let f = &s.fixture;
        let root = SysfsRoot::new(&f.sys);
        assert_eq!(
            InstanceType::from_sysfs(&root).unwrap().unwrap().as_str(),
            *t
        );
        for g in &f.gpus {
            let d = s.dev(&g.bdf);
            assert_place(
                d,
                &g.pcie_root,
                g.numa_node,
                &g.bridges,
                &format!("{t} gpu{}", g.index),
            );
            assert_eq!(classify(d), DeviceKind::NvidiaGpu);
            assert_eq!(d.driver.as_deref(), Some("nvidia"));
        }
        for e in &f.efas {
            let d = s.dev(&e.bdf);
            assert_place(
                d,
                &e.pcie_root,
                e.numa_node,
                &e.bridges,
                &format!("{t} {}", e.ibdev),
            );
            assert_eq!(classify(d), DeviceKind::Efa);
            assert_eq!((d.device, d.driver.as_deref()), (e.device_id, Some("efa")));
        }
        for c in &f.neuron_chips {
            let d = s.dev(&c.bdf);
            assert_place(
                d,
                &c.pcie_root,
                c.numa_node,
                &c.bridges,
                &format!("{t} chip{}", c.index),
            );
            assert!(
                matches!(classify(d), DeviceKind::Neuron(_)),
                "{t} chip {}",
                c.index
            );
            assert_eq!(d.driver.as_deref(), Some("neuron"));
        }
        for x in &f.decoys {
            assert_eq!(
                classify(s.dev(&x.bdf)),
                DeviceKind::Other,
                "{t} decoy {}",
                x.bdf
            );
        }
        let accel = s
            .scan
            .devices
            .iter()
            .filter(|d| classify(d) != DeviceKind::Other)
            .count();
        assert_eq!(
            accel,
            f.gpus.len() + f.efas.len() + f.neuron_chips.len(),
            "{t}"
        );
        // Proximity of every pair of described devices, from the
        // description: different roots → NUMA decides; same root → the
        // fixtures put a switch (root port + upstream port) above devices
        // that share one, and nothing above Nitro-flat devices.
        let described: Vec<(&str, &str, Option<u32>, &[String])> = f
            .gpus
            .iter()
            .map(|g| {
                (
                    g.bdf.as_str(),
                    g.pcie_root.as_str(),
                    g.numa_node,
                    g.bridges.as_slice(),
                )
            })
            .chain(f.efas.iter().map(|e| {
                (
                    e.bdf.as_str(),
                    e.pcie_root.as_str(),
                    e.numa_node,
                    e.bridges.as_slice(),
                )
            }))
            .chain(f.neuron_chips.iter().map(|c| {
                (
                    c.bdf.as_str(),
                    c.pcie_root.as_str(),
                    c.numa_node,
                    c.bridges.as_slice(),
                )
            }))
            .collect();
        for a in &described {
            for b in &described {
                let want = if a.0 == b.0 {
                    Proximity::SameDevice
                } else if a.1 != b.1 {
                    if a.2 == b.2 {
                        Proximity::SameNumaNode
                    } else {
                        Proximity::CrossNuma
                    }
                } else if a.3.len() >= 2 && b.3.len() >= 2 && a.3[..2] == b.3[..2] {
                    Proximity::SameSwitch
                } else {
                    Proximity::SameRootComplex
                };
                assert_eq!(
                    proximity(s.dev(a.0), s.dev(b.0)),
                    want,
                    "{t}: {} ~ {}",
                    a.0,
                    b.0
                );
            }
        }
    }
}

#[test]
fn p5_every_gpu_has_four_efas_on_its_root_and_switch() {
    for (t, per_gpu) in [("p5.48xlarge", 4), ("p5en.48xlarge", 2)] {
        let s = load(t);
        assert_eq!(s.fixture.gpus.len(), 8);
        assert_eq!(s.fixture.efas.len(), 8 * per_gpu);
        for g in &s.fixture.gpus {
            let gpu = s.dev(&g.bdf);
            assert_eq!(gpu.numa_node, Some(if g.index < 4 { 0 } else { 1 }), "{t}");
            let same_root: Vec<_> = s
                .efas()
                .into_iter()
                .filter(|e| e.pcie_root == gpu.pcie_root)
                .collect();
            assert_eq!(same_root.len(), per_gpu, "{t} gpu {}", g.index);
            for e in &same_root {
                assert_eq!(proximity(gpu, e), Proximity::SameSwitch);
            }
            let (best, set) = nearest(gpu, s.efas());
            assert_eq!(best, Some(Proximity::SameSwitch));
            assert_eq!(set, same_root);
            for e in s
                .efas()
                .into_iter()
                .filter(|e| e.pcie_root != gpu.pcie_root)
            {
                let want = if e.numa_node == gpu.numa_node {
                    Proximity::SameNumaNode
                } else {
                    Proximity::CrossNuma
                };
                assert_eq!(proximity(gpu, e), want);
            }
        }
    }
    let s = load("p5.48xlarge");
    let first = &s.fixture.efas[0];
    assert_eq!(
        (first.bdf.as_str(), first.ibdev.as_str(), first.uverbs),
        ("0000:4f:00.0", "rdmap79s0", 0)
    );
}

#[test]
fn p4d_one_efa_per_gpu_pair_under_a_switch() {
    let s = load("p4d.24xlarge");
    assert_eq!((s.fixture.gpus.len(), s.fixture.efas.len()), (8, 4));
    let mut gpus_per_efa: BTreeMap<PciAddress, Vec<u32>> = BTreeMap::new();
    for g in &s.fixture.gpus {
        let gpu = s.dev(&g.bdf);
        let (p, efa) = nearest_unique(gpu, s.efas()).unwrap();
        assert_eq!(p, Proximity::SameSwitch);
        assert_eq!(efa.pcie_root, gpu.pcie_root);
        gpus_per_efa.entry(efa.address).or_default().push(g.index);
    }
    assert_eq!(gpus_per_efa.len(), 4);
    for (efa, gpus) in gpus_per_efa {
        assert_eq!(gpus.len(), 2, "{efa}");
        assert_eq!(gpus[0] / 2, gpus[1] / 2, "{efa} pairs GPUs {gpus:?}");
    }
}

fn table_of(s: &Scanned) -> EfaTable {
    let it: InstanceType = s.fixture.instance_type.parse().unwrap();
    EfaTable::for_instance(&it).unwrap()
}

#[test]
fn trn2_nearest_efa_is_the_tables() {
    let s = load("trn2.48xlarge");
    let table = table_of(&s);
    assert_eq!(s.fixture.neuron_chips[0].bdf, "0000:cc:00.0");
    assert_eq!(s.fixture.neuron_chips[4].bdf, "0000:6f:00.0");
    let efas = s.efas();
    for c in &s.fixture.neuron_chips {
        let chip = s.dev(&c.bdf);
        assert_eq!(
            chip.numa_node,
            Some(if (4..12).contains(&c.index) { 0 } else { 1 })
        );
        let (p, efa) = nearest_unique(chip, efas.iter().copied()).unwrap();
        assert_eq!(p, Proximity::SameSwitch, "chip {}", c.index);
        assert_eq!(
            Some(efa.address),
            table.efa_for_chip(c.index),
            "chip {}",
            c.index
        );
        assert_eq!(efa.numa_node, chip.numa_node);
    }
    let chips = s.chips();
    assert_eq!(check_table(&table, &chips, &efas), vec![]);
    let derived = derive_pairing(&chips, &efas);
    assert_eq!(derived.table, table);
    assert!(derived.ambiguous.is_empty() && derived.unpaired.is_empty());
}

#[test]
fn trn1_nearest_efas_include_the_tables_and_stay_on_the_root() {
    for (t, efas_per_root) in [("trn1.32xlarge", 2), ("trn1n.32xlarge", 4)] {
        let s = load(t);
        let table = table_of(&s);
        let efas = s.efas();
        assert_eq!(efas.len(), table.efas().len(), "{t}");
        for e in &efas {
            let want = if [0x10, 0x20].contains(&e.address.bus()) {
                0
            } else {
                1
            };
            assert_eq!(e.numa_node, Some(want), "{t} {}", e.address);
            assert_eq!(
                e.pcie_root.bus(),
                e.address.bus(),
                "{t}: EFAs sit on the root bus"
            );
        }
        for c in &s.fixture.neuron_chips {
            let chip = s.dev(&c.bdf);
            let (p, set) = nearest(chip, efas.iter().copied());
            assert_eq!(p, Some(Proximity::SameRootComplex), "{t} chip {}", c.index);
            assert_eq!(set.len(), efas_per_root);
            let want = table.efa_for_chip(c.index).unwrap();
            assert!(
                set.iter().any(|e| e.address == want),
                "{t} chip {}",
                c.index
            );
            assert!(nearest_unique(chip, efas.iter().copied()).is_none());
        }
        let chips = s.chips();
        assert_eq!(check_table(&table, &chips, &efas), vec![], "{t}");
        // Flat root buses: no chip shares a switch with an EFA.
        assert_eq!(derive_pairing(&chips, &efas).unpaired.len(), 16);
    }
}

#[test]
fn device_groups_from_the_fixture() {
    let s = load("trn2.48xlarge");
    let it = InstanceType::from_sysfs(&SysfsRoot::new(&s.fixture.sys))
        .unwrap()
        .unwrap();
    let g = topology::device_groups_for_chip(&it, 0).unwrap();
    assert_eq!(
        g.attributes().map(|(_, v)| v.to_owned()),
        [
            "0000:c9:00.0",
            "13713e551cd37c19",
            "3593812b8066a078",
            "821d14afaf11327d"
        ]
    );
    for c in &s.fixture.neuron_chips {
        let chip_groups = topology::device_groups_for_chip(&it, c.index).unwrap();
        let efa = s.dev(&c.bdf);
        let (_, efa) = nearest_unique(efa, s.efas()).unwrap();
        assert_eq!(
            topology::device_groups_for_efa(&it, efa.address),
            Some(chip_groups)
        );
    }

    let s = load("trn1.32xlarge");
    let it: InstanceType = "trn1.32xlarge".parse().unwrap();
    let table = table_of(&s);
    for e in s.efas() {
        let chips = table.chips_for_efa(e.address);
        assert_eq!(chips.len(), 2);
        let a = topology::device_groups_for_chip(&it, chips[0]).unwrap();
        let b = topology::device_groups_for_chip(&it, chips[1]).unwrap();
        assert_eq!(a, b, "{}", e.address);
        assert_eq!(topology::device_groups_for_efa(&it, e.address), Some(a));
    }

    for t in ["inf2.48xlarge", "m5.8xlarge", "p5.48xlarge"] {
        let s = load(t);
        let it = InstanceType::from_sysfs(&SysfsRoot::new(&s.fixture.sys))
            .unwrap()
            .unwrap();
        assert_eq!(topology::device_groups_for_chip(&it, 0), None, "{t}");
        assert!(s.efas().is_empty() || t == "p5.48xlarge");
    }
}

fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap();
}

#[test]
fn malformed_sysfs_costs_one_device_never_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("trn2.48xlarge", dir.path()).unwrap();
    let root = SysfsRoot::new(&f.sys);
    let total = scan(&root).unwrap().devices.len();
    let dev_dir =
        |bdf: &str| std::fs::canonicalize(f.sys.join("bus/pci/devices").join(bdf)).unwrap();

    // Garbage NUMA node.
    let victim = f.efas[0].bdf.clone();
    write(&dev_dir(&victim).join("numa_node"), "banana\n");
    // Missing optional files are None, not errors.
    let quiet = f.efas[1].bdf.clone();
    std::fs::remove_file(dev_dir(&quiet).join("local_cpulist")).unwrap();
    std::fs::remove_file(dev_dir(&quiet).join("current_link_width")).unwrap();
    // Garbage hex id.
    let bad_id = f.efas[2].bdf.clone();
    write(&dev_dir(&bad_id).join("device"), "0xzz\n");
    // Dangling bus link.
    let dangling = f.efas[3].bdf.clone();
    let link = f.sys.join("bus/pci/devices").join(&dangling);
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("../../../devices/pci0000:99/gone", &link).unwrap();
    // An entry that is not an address.
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:00",
        f.sys.join("bus/pci/devices/bogus"),
    )
    .unwrap();

    let s = scan(&root).unwrap();
    assert_eq!(s.devices.len(), total - 3);
    let err_of = |entry: &str| {
        s.errors
            .iter()
            .find(|e| e.entry == entry)
            .unwrap_or_else(|| panic!("no error for {entry}: {:?}", s.errors))
            .error
            .to_string()
    };
    let e = err_of(&victim);
    assert!(e.contains("banana") && e.contains("numa_node"), "{e}");
    let e = err_of(&bad_id);
    assert!(e.contains("0xzz") && e.contains("device"), "{e}");
    let e = err_of(&dangling);
    assert!(e.contains("dangling") && e.contains(&dangling), "{e}");
    assert!(err_of("bogus").contains("\"bogus\""));
    let q = s.get(addr(&quiet)).unwrap();
    assert_eq!((q.local_cpulist.as_ref(), q.link_width), (None, None));
    assert_eq!(s.errors.len(), 4);
}

#[test]
fn device_removed_between_listing_and_reading() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("p5.48xlarge", dir.path()).unwrap();
    let root = SysfsRoot::new(&f.sys);
    let (addrs, _) = topology::list_pci_addresses(&root).unwrap();
    let gone = addr(&f.efas[5].bdf);
    assert!(addrs.contains(&gone));
    f.remove_efa(&f.efas[5].bdf).unwrap();
    assert!(matches!(
        PciDevice::read(&root, gone),
        Err(topology::Error::DeviceVanished { .. })
    ));
    // The directory goes while the bus link lingers: a dangling link.
    let other = &f.efas[6];
    let path = std::fs::canonicalize(f.sys.join("bus/pci/devices").join(&other.bdf)).unwrap();
    std::fs::remove_dir_all(&path).unwrap();
    assert!(matches!(
        PciDevice::read(&root, addr(&other.bdf)),
        Err(topology::Error::DanglingLink { .. })
    ));
    // Attributes vanish under a directory that is still there.
    let third = &f.efas[7];
    let path = std::fs::canonicalize(f.sys.join("bus/pci/devices").join(&third.bdf)).unwrap();
    std::fs::remove_file(path.join("vendor")).unwrap();
    assert!(matches!(
        PciDevice::read(&root, addr(&third.bdf)),
        Err(topology::Error::MissingAttribute { .. })
    ));
    // Every other device still reads.
    let s = scan(&root).unwrap();
    assert_eq!(s.errors.len(), 2, "{:?}", s.errors);
    assert_eq!(
        s.devices
            .iter()
            .filter(|d| classify(d) == DeviceKind::Efa)
            .count(),
        29
    );
}

#[test]
fn hot_plug_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let f = generate("p5.48xlarge", dir.path()).unwrap();
    let root = SysfsRoot::new(&f.sys);
    let e = f.efas[3].clone();
    let before = PciDevice::read(&root, addr(&e.bdf)).unwrap();
    let ib = f.sys.join("class/infiniband").join(&e.ibdev);
    assert!(ib.join("device").exists());

    f.unbind_driver(&e.bdf).unwrap();
    let unbound = PciDevice::read(&root, addr(&e.bdf)).unwrap();
    assert_eq!(unbound.driver, None);
    assert!(
        !ib.exists()
            && !f
                .dev
                .join(format!("infiniband/uverbs{}", e.uverbs))
                .exists()
    );
    f.bind_driver(&e.bdf).unwrap();
    assert_eq!(PciDevice::read(&root, addr(&e.bdf)).unwrap(), before);

    f.remove_efa(&e.bdf).unwrap();
    assert!(scan(&root).unwrap().get(addr(&e.bdf)).is_none());
    f.add_efa(&e.bdf).unwrap();
    assert_eq!(PciDevice::read(&root, addr(&e.bdf)).unwrap(), before);
    assert_eq!(
        topology::sysfs::read_attr(
            f.sys
                .join(format!("class/infiniband_verbs/uverbs{}/ibdev", e.uverbs))
        )
        .unwrap()
        .as_deref(),
        Some(e.ibdev.as_str())
    );
}

#[test]
fn check_table_reports_where_table_and_tree_disagree() {
    use topology::TableMismatch;
    let dir = tempfile::tempdir().unwrap();
    let f = generate("trn2.48xlarge", dir.path()).unwrap();
    let root = SysfsRoot::new(&f.sys);
    let published = EfaTable::published("trn2").unwrap();

    // A table with chips 0 and 3 swapped: both now name a farther EFA.
    let mut chips = published.chips().clone();
    let (e0, e3) = (chips[&0], chips[&3]);
    chips.insert(0, e3);
    chips.insert(3, e0);
    // And chip 15 dropped, so its EFA is in the tree but not in the table.
    chips.remove(&15);
    let wrong = EfaTable::new(chips);

    // The EFA of chip 5 is hot-unplugged.
    let gone = published.efa_for_chip(5).unwrap();
    f.remove_efa(&gone.to_string()).unwrap();

    let s = scan(&root).unwrap();
    let efas: Vec<&PciDevice> = s
        .devices
        .iter()
        .filter(|d| classify(d) == DeviceKind::Efa)
        .collect();
    let located: Vec<LocatedChip> = f
        .neuron_chips
        .iter()
        .map(|c| LocatedChip {
            index: c.index,
            device: s.get(addr(&c.bdf)).unwrap(),
        })
        .collect();
    let found = check_table(&wrong, &located, &efas);
    let expect = vec![
        TableMismatch::EfaNotInTable {
            efa: published.efa_for_chip(15).unwrap(),
        },
        TableMismatch::NotNearest {
            chip: 0,
            table_efa: e3,
            table_proximity: Proximity::SameRootComplex,
            nearest: vec![e0],
            nearest_proximity: Proximity::SameSwitch,
        },
        TableMismatch::NotNearest {
            chip: 3,
            table_efa: e0,
            table_proximity: Proximity::SameRootComplex,
            nearest: vec![e3],
            nearest_proximity: Proximity::SameSwitch,
        },
        TableMismatch::EfaMissing { chip: 5, efa: gone },
    ];
    assert_eq!(found, expect);
    assert!(
        found[1]
            .to_string()
            .contains("chip 0: table names EFA 0000:ca:00.0 (PHB)"),
        "{}",
        found[1]
    );

    // Derived from the tree, the pairing has every chip but the one whose
    // EFA is gone, which now shares no switch with any EFA.
    let derived = derive_pairing(&located, &efas);
    assert_eq!(derived.unpaired, vec![5]);
    for (chip, efa) in derived.table.chips() {
        assert_eq!(published.efa_for_chip(*chip), Some(*efa));
    }
    assert_eq!(derived.table.chips().len(), 15);
}
