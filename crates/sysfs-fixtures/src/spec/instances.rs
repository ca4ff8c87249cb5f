//! The description of each instance type: its root complexes, the devices
//! below them and its NUMA layout, as the parent module's doc lays out.

use super::{
    Bdf, ChipTopology, DeviceKind, InstanceSpec, NeuronSpec, Node, RootComplex, UltraServerSpec,
};

const CPUS_192: &[&str] = &["0-47,96-143", "48-95,144-191"];

fn ep(bus: u8, slot: u8, kind: DeviceKind) -> Node {
    Node::Device {
        bdf: Bdf::new(bus, slot),
        kind,
    }
}

/// Root port `root_bus:rp_slot.0` → switch upstream port on `usp_bus` →
/// one downstream port per endpoint on `dsp_bus` → each endpoint at
/// `<its bus>:00.0`.
fn switched(
    root_bus: u8,
    rp_slot: u8,
    usp_bus: u8,
    dsp_bus: u8,
    endpoints: Vec<(u8, DeviceKind)>,
) -> Node {
    let dsps = endpoints
        .into_iter()
        .enumerate()
        .map(|(k, (bus, kind))| Node::Bridge {
            bdf: Bdf::new(dsp_bus, k as u8),
            children: vec![ep(bus, 0, kind)],
        })
        .collect();
    Node::Bridge {
        bdf: Bdf::new(root_bus, rp_slot),
        children: vec![Node::Bridge {
            bdf: Bdf::new(usp_bus, 0),
            children: dsps,
        }],
    }
}

/// `pci0000:00`: ENA, EBS NVMe and optionally instance-store NVMe.
fn platform_root(instance_store: bool) -> RootComplex {
    let mut children = vec![
        ep(0, 4, DeviceKind::Nvme { device_id: 0x8061 }),
        ep(0, 5, DeviceKind::Ena { ifname: "ens5" }),
    ];
    if instance_store {
        children.push(ep(0, 0x1f, DeviceKind::Nvme { device_id: 0xcd01 }));
    }
    RootComplex {
        bus: 0,
        numa_node: 0,
        children,
    }
}

pub(super) fn p4d() -> InstanceSpec {
    let mut roots = vec![platform_root(true)];
    for (pair, r) in [0x10u8, 0x20, 0x90, 0xa0].into_iter().enumerate() {
        let g = pair as u32 * 2;
        let gpu = |index| DeviceKind::NvidiaGpu {
            index,
            device_id: 0x20b0,
        };
        roots.push(RootComplex {
            bus: r,
            numa_node: if pair < 2 { 0 } else { 1 },
            children: vec![switched(
                r,
                1,
                r + 1,
                r + 2,
                vec![
                    (r + 3, gpu(g)),
                    (r + 4, gpu(g + 1)),
                    (r + 5, DeviceKind::Efa { device_id: 0xefa0 }),
                ],
            )],
        });
    }
    InstanceSpec {
        instance_type: "p4d.24xlarge",
        numa_cpulists: &["0-23,48-71", "24-47,72-95"],
        roots,
        neuron: None,
    }
}

pub(super) fn p5(
    instance_type: &'static str,
    efa_id: u16,
    gpu_id: u16,
    efas_per_gpu: u8,
) -> InstanceSpec {
    let mut roots = vec![platform_root(false)];
    for g in 0..8u8 {
        let r = 0x44 + 0x11 * g;
        let mut endpoints: Vec<(u8, DeviceKind)> = (0..efas_per_gpu)
            .map(|k| (r + 0x0b + k, DeviceKind::Efa { device_id: efa_id }))
            .collect();
        endpoints.push((
            r + 0x0f,
            DeviceKind::NvidiaGpu {
                index: g.into(),
                device_id: gpu_id,
            },
        ));
        endpoints.push((r + 0x10, DeviceKind::Nvme { device_id: 0xcd01 }));
        roots.push(RootComplex {
            bus: r,
            numa_node: if g < 4 { 0 } else { 1 },
            children: vec![switched(r, 1, r + 1, r + 2, endpoints)],
        });
    }
    InstanceSpec {
        instance_type,
        numa_cpulists: CPUS_192,
        roots,
        neuron: None,
    }
}

/// trn1: per root bus, the chips (in slot order 0x1c..0x1f) and EFA slots.
const TRN1_ROOTS: [(u8, i32, [u32; 4]); 4] = [
    (0x10, 0, [0, 1, 12, 13]),
    (0x20, 0, [4, 5, 8, 9]),
    (0x90, 1, [6, 7, 10, 11]),
    (0xa0, 1, [2, 3, 14, 15]),
];
pub(super) const TRN1_EFA_SLOTS: &[u8] = &[0x19, 0x1a];
pub(super) const TRN1N_EFA_SLOTS: &[u8] = &[0x17, 0x18, 0x19, 0x1a];

pub(super) fn trn1(instance_type: &'static str, efa_slots: &[u8]) -> InstanceSpec {
    let mut roots = vec![platform_root(true)];
    for (r, numa, chips) in TRN1_ROOTS {
        let mut children: Vec<Node> = efa_slots
            .iter()
            .map(|s| ep(r, *s, DeviceKind::Efa { device_id: 0xefa1 }))
            .collect();
        for (k, index) in chips.into_iter().enumerate() {
            children.push(ep(r, 0x1c + k as u8, DeviceKind::Neuron { index }));
        }
        roots.push(RootComplex {
            bus: r,
            numa_node: numa,
            children,
        });
    }
    InstanceSpec {
        instance_type,
        numa_cpulists: &["0-31,64-95", "32-63,96-127"],
        roots,
        neuron: Some(NeuronSpec {
            device_id: 0x7164,
            core_count: 2,
            topology: ChipTopology::Torus4x4,
            arch_type: "NCv2",
            device_name: "Trainium",
            instance_label: "trn1",
            ultraserver: UltraServerSpec::NotMember,
        }),
    }
}

/// trn2: (chip, EFA bus) pairs, two per root complex, lower EFA bus first.
const TRN2_PAIRS: [((u32, u8), (u32, u8)); 8] = [
    ((2, 0xb3), (1, 0xb4)),
    ((0, 0xc9), (3, 0xca)),
    ((6, 0x56), (5, 0x57)),
    ((4, 0x6c), (7, 0x6d)),
    ((10, 0x82), (9, 0x83)),
    ((8, 0x98), (11, 0x99)),
    ((14, 0xdf), (13, 0xe0)),
    ((12, 0xf5), (15, 0xf6)),
];

pub(super) fn trn2() -> InstanceSpec {
    let mut roots = vec![platform_root(true)];
    let efa = || DeviceKind::Efa { device_id: 0xefa2 };
    for ((chip_a, e), (chip_b, _)) in TRN2_PAIRS {
        // Buses e-4 .. e+4: root, USP a, DSPs a, USP b, EFA a, EFA b, DSPs b,
        // chip a, chip b.
        let r = e - 4;
        let numa = if (4..12).contains(&chip_a) { 0 } else { 1 };
        roots.push(RootComplex {
            bus: r,
            numa_node: numa,
            children: vec![
                switched(
                    r,
                    1,
                    e - 3,
                    e - 2,
                    vec![(e, efa()), (e + 3, DeviceKind::Neuron { index: chip_a })],
                ),
                switched(
                    r,
                    2,
                    e - 1,
                    e + 2,
                    vec![
                        (e + 1, efa()),
                        (e + 4, DeviceKind::Neuron { index: chip_b }),
                    ],
                ),
            ],
        });
    }
    InstanceSpec {
        instance_type: "trn2.48xlarge",
        numa_cpulists: CPUS_192,
        roots,
        neuron: Some(NeuronSpec {
            device_id: 0x7364,
            core_count: 8,
            topology: ChipTopology::Torus4x4,
            arch_type: "NCv3",
            device_name: "Trainium2",
            instance_label: "trn2",
            ultraserver: UltraServerSpec::NotMember,
        }),
    }
}

pub(super) fn inf2() -> InstanceSpec {
    let mut roots = vec![platform_root(false)];
    for (k, r) in [0x10u8, 0x20, 0x90, 0xa0].into_iter().enumerate() {
        let children = (0..3u8)
            .map(|s| {
                ep(
                    r,
                    0x1c + s,
                    DeviceKind::Neuron {
                        index: k as u32 * 3 + u32::from(s),
                    },
                )
            })
            .collect();
        roots.push(RootComplex {
            bus: r,
            numa_node: if k < 2 { 0 } else { 1 },
            children,
        });
    }
    InstanceSpec {
        instance_type: "inf2.48xlarge",
        numa_cpulists: CPUS_192,
        roots,
        neuron: Some(NeuronSpec {
            device_id: 0x7264,
            core_count: 2,
            topology: ChipTopology::Ring,
            arch_type: "NCv2",
            device_name: "Inferentia2",
            instance_label: "inf2",
            ultraserver: UltraServerSpec::NotMember,
        }),
    }
}

pub(super) fn m5() -> InstanceSpec {
    InstanceSpec {
        instance_type: "m5.8xlarge",
        numa_cpulists: &["0-31"],
        roots: vec![platform_root(false)],
        neuron: None,
    }
}
