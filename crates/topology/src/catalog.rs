//! What each supported instance type holds, known without looking at a node:
//! the hardware model `discover --instance-type` builds its devices from.
//!
//! A model says only what is the same on every node of the type: how many
//! EFAs and Neuron chips there are, which of them share a PCI root complex,
//! the NUMA node of each root complex, the EFA generation, the chips'
//! generation, cores and wiring, and whether the type is an UltraServer
//! node. It holds no PCI address, name or serial: those exist only on a
//! running node. Both drivers read the same model, so the devices of one
//! root complex are the same group on the EFA side and the Neuron side.
//!
//! The facts come from `docs/topology.md` and the hardware reference the
//! fixtures of `sysfs-fixtures` follow; the drivers' tests check each model
//! against a real `discover` of that type's fixture, field by field, so a
//! model and a fixture cannot drift apart unnoticed.
//!
//! Order: root complexes are listed in PCI bus order, and so are the EFAs
//! within one: the n-th EFA of a model is the n-th EFA in PCI address order
//! on a node, which is the order the EFA driver publishes them in.

use crate::ids::NeuronGeneration;

/// How a type's Neuron chips are wired to each other (`connected_devices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChipWiring {
    /// 4×4 2D torus: chip N at x = N/4, y = N%4, wrapping around.
    Torus4x4,
    /// A ring: each chip's neighbours are the previous and the next.
    Ring,
}

/// The Neuron chips of a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeuronModel {
    pub generation: NeuronGeneration,
    /// Physical NeuronCores per chip.
    pub cores_per_chip: u32,
    pub wiring: ChipWiring,
    /// A Trn2 UltraServer node (trn2u): the kernel driver elects the node's
    /// place in its UltraServer, and the node publishes a whole-node device.
    pub ultraserver: bool,
}

/// One PCI root complex with EFAs or Neuron chips below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootModel {
    pub numa_node: u32,
    /// EFAs below this root complex.
    pub efas: u32,
    /// Neuron chip indices below this root complex.
    pub chips: &'static [u32],
}

/// One instance type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceModel {
    pub instance_type: &'static str,
    /// PCI device id of its EFAs (`0xefa0`…); `None` without EFAs.
    pub efa_device_id: Option<u16>,
    pub neuron: Option<NeuronModel>,
    /// In PCI bus order.
    pub roots: &'static [RootModel],
}

/// An EFA of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelEfa {
    /// Position in PCI address order (0 for the lowest address).
    pub position: u32,
    /// Index of its root complex in [`InstanceModel::roots`].
    pub root: usize,
    pub numa_node: u32,
}

/// A Neuron chip of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelChip {
    /// N of `/dev/neuronN`.
    pub index: u32,
    /// Index of its root complex in [`InstanceModel::roots`].
    pub root: usize,
    pub numa_node: u32,
}

impl InstanceModel {
    /// Every EFA, in PCI address order.
    pub fn efas(&self) -> Vec<ModelEfa> {
        let mut out = Vec::new();
        for (root, r) in self.roots.iter().enumerate() {
            for _ in 0..r.efas {
                out.push(ModelEfa {
                    position: out.len() as u32,
                    root,
                    numa_node: r.numa_node,
                });
            }
        }
        out
    }

    /// Every Neuron chip, by index.
    pub fn chips(&self) -> Vec<ModelChip> {
        let mut out: Vec<ModelChip> = self
            .roots
            .iter()
            .enumerate()
            .flat_map(|(root, r)| {
                r.chips.iter().map(move |&index| ModelChip {
                    index,
                    root,
                    numa_node: r.numa_node,
                })
            })
            .collect();
        out.sort_by_key(|c| c.index);
        out
    }

    /// The neighbours of chip `index` (`connected_devices`), as the kernel
    /// lists them on a node of this type; empty without Neuron chips.
    pub fn connected(&self, index: u32) -> Vec<u32> {
        let n = self.chips().len() as u32;
        match self.neuron.map(|m| m.wiring) {
            Some(ChipWiring::Torus4x4) => {
                let (x, y) = (index / 4, index % 4);
                let at = |x: u32, y: u32| (x % 4) * 4 + y % 4;
                vec![at(x + 3, y), at(x, y + 3), at(x + 1, y), at(x, y + 1)]
            }
            Some(ChipWiring::Ring) if n > 1 => vec![(index + n - 1) % n, (index + 1) % n],
            _ => Vec::new(),
        }
    }
}

const fn root(numa_node: u32, efas: u32, chips: &'static [u32]) -> RootModel {
    RootModel {
        numa_node,
        efas,
        chips,
    }
}

/// p4d.24xlarge: 4 EFAs, each on the root complex of a pair of GPUs.
const P4D: &[RootModel] = &[
    root(0, 1, &[]),
    root(0, 1, &[]),
    root(1, 1, &[]),
    root(1, 1, &[]),
];

/// p5.48xlarge: 32 EFAs, 4 on the root complex of each of the 8 GPUs.
const P5: &[RootModel] = &[
    root(0, 4, &[]),
    root(0, 4, &[]),
    root(0, 4, &[]),
    root(0, 4, &[]),
    root(1, 4, &[]),
    root(1, 4, &[]),
    root(1, 4, &[]),
    root(1, 4, &[]),
];

/// p5en.48xlarge: 16 EFAs, 2 on the root complex of each of the 8 GPUs.
const P5EN: &[RootModel] = &[
    root(0, 2, &[]),
    root(0, 2, &[]),
    root(0, 2, &[]),
    root(0, 2, &[]),
    root(1, 2, &[]),
    root(1, 2, &[]),
    root(1, 2, &[]),
    root(1, 2, &[]),
];

/// trn1.32xlarge: chips and EFAs flat on four root buses (0x10, 0x20 NUMA
/// 0; 0x90, 0xa0 NUMA 1), 4 chips and 2 EFAs on each.
const TRN1: &[RootModel] = &[
    root(0, 2, &[0, 1, 12, 13]),
    root(0, 2, &[4, 5, 8, 9]),
    root(1, 2, &[6, 7, 10, 11]),
    root(1, 2, &[2, 3, 14, 15]),
];

/// trn1n.32xlarge: as trn1.32xlarge with 4 EFAs on each root bus.
const TRN1N: &[RootModel] = &[
    root(0, 4, &[0, 1, 12, 13]),
    root(0, 4, &[4, 5, 8, 9]),
    root(1, 4, &[6, 7, 10, 11]),
    root(1, 4, &[2, 3, 14, 15]),
];

/// trn2.48xlarge (and trn2u): two chip/EFA pairs per root complex; chips
/// 4-11 on NUMA 0, 0-3 and 12-15 on NUMA 1.
const TRN2: &[RootModel] = &[
    root(0, 2, &[6, 5]),
    root(0, 2, &[4, 7]),
    root(0, 2, &[10, 9]),
    root(0, 2, &[8, 11]),
    root(1, 2, &[2, 1]),
    root(1, 2, &[0, 3]),
    root(1, 2, &[14, 13]),
    root(1, 2, &[12, 15]),
];

/// inf2.48xlarge: 12 chips in a ring, 3 per root complex, no EFA.
const INF2: &[RootModel] = &[
    root(0, 0, &[0, 1, 2]),
    root(0, 0, &[3, 4, 5]),
    root(1, 0, &[6, 7, 8]),
    root(1, 0, &[9, 10, 11]),
];

const fn trn2(instance_type: &'static str, ultraserver: bool) -> InstanceModel {
    InstanceModel {
        instance_type,
        efa_device_id: Some(0xefa2),
        neuron: Some(NeuronModel {
            generation: NeuronGeneration::Trainium2,
            cores_per_chip: 8,
            wiring: ChipWiring::Torus4x4,
            ultraserver,
        }),
        roots: TRN2,
    }
}

const TRAINIUM1: NeuronModel = NeuronModel {
    generation: NeuronGeneration::Trainium1,
    cores_per_chip: 2,
    wiring: ChipWiring::Torus4x4,
    ultraserver: false,
};

/// Every instance type with a model.
pub const INSTANCE_MODELS: &[InstanceModel] = &[
    InstanceModel {
        instance_type: "p4d.24xlarge",
        efa_device_id: Some(0xefa0),
        neuron: None,
        roots: P4D,
    },
    InstanceModel {
        instance_type: "p5.48xlarge",
        efa_device_id: Some(0xefa1),
        neuron: None,
        roots: P5,
    },
    InstanceModel {
        instance_type: "p5en.48xlarge",
        efa_device_id: Some(0xefa2),
        neuron: None,
        roots: P5EN,
    },
    InstanceModel {
        instance_type: "trn1.32xlarge",
        efa_device_id: Some(0xefa1),
        neuron: Some(TRAINIUM1),
        roots: TRN1,
    },
    InstanceModel {
        instance_type: "trn1n.32xlarge",
        efa_device_id: Some(0xefa1),
        neuron: Some(TRAINIUM1),
        roots: TRN1N,
    },
    trn2("trn2.48xlarge", false),
    trn2("trn2u.48xlarge", true),
    InstanceModel {
        instance_type: "inf2.48xlarge",
        efa_device_id: None,
        neuron: Some(NeuronModel {
            generation: NeuronGeneration::Inferentia2,
            cores_per_chip: 2,
            wiring: ChipWiring::Ring,
            ultraserver: false,
        }),
        roots: INF2,
    },
];

/// The model of `instance_type`, if there is one.
pub fn model(instance_type: &str) -> Option<&'static InstanceModel> {
    INSTANCE_MODELS
        .iter()
        .find(|m| m.instance_type == instance_type)
}

/// The instance types with a model, comma-separated (for error messages).
pub fn known_instance_types() -> String {
    INSTANCE_MODELS
        .iter()
        .map(|m| m.instance_type)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every chip index appears once and the torus neighbours are
    /// symmetric; the counts are those of AWS's instance tables.
    #[test]
    fn models_are_consistent() {
        let counts = [
            ("p4d.24xlarge", 4, 0),
            ("p5.48xlarge", 32, 0),
            ("p5en.48xlarge", 16, 0),
            ("trn1.32xlarge", 8, 16),
            ("trn1n.32xlarge", 16, 16),
            ("trn2.48xlarge", 16, 16),
            ("trn2u.48xlarge", 16, 16),
            ("inf2.48xlarge", 0, 12),
        ];
        assert_eq!(counts.len(), INSTANCE_MODELS.len());
        for (name, efas, chips) in counts {
            let m = model(name).unwrap();
            assert_eq!(m.efas().len(), efas, "{name}");
            assert_eq!(m.efa_device_id.is_some(), efas > 0, "{name}");
            let indices: BTreeSet<u32> = m.chips().iter().map(|c| c.index).collect();
            assert_eq!(indices, (0..chips).collect(), "{name}");
            for c in m.chips() {
                for n in m.connected(c.index) {
                    assert!(m.connected(n).contains(&c.index), "{name}: {n}, {c:?}");
                }
            }
        }
        assert_eq!(model("m5.8xlarge"), None);
        assert!(known_instance_types().contains("trn2u.48xlarge"));
    }
}
