//! Lays out one node from everything the scheduler sees: device-group
//! labels, devices by PCIe root, the Neuron chips on their grid with their
//! cores, and the instance type.

use std::collections::BTreeMap;

use super::model::{ChipCell, GroupLabel, NeuronGrid, NodeTopology, PcieRootBox, Unit, UnitKind};
use super::natural::{NaturalKey, natural_key};
use super::unit::{
    GROUP_SIZES, NUMA_NODE, PCIE_ROOT, group_attribute, int_attr, kind_of, str_attr, unit,
};
use crate::world::{PublishedDevice, World};

/// The node has nothing to draw.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(
        "node {node:?} publishes no devices in the ResourceSlices read{}; \
         check the name (`kubectl get nodes`), that the drivers run there \
         (`kubectl get resourceslices --field-selector spec.nodeName={node}`), \
         or with -f pass the slices of that node",
        known_nodes(.known)
    )]
    NoDevices { node: String, known: Vec<String> },
}

fn known_nodes(known: &[String]) -> String {
    if known.is_empty() {
        " (none publishes any)".to_string()
    } else {
        format!(" (nodes with devices: {})", known.join(", "))
    }
}

/// `A`, `B`, … `Z`, `AA`, `AB`, …
pub(super) fn letters(mut i: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'A' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// What names a group's letter: chips before other devices, then by chip
/// index and name.
type FirstMember = (u8, i64, NaturalKey);

/// A chip before it has a place on the grid.
struct PlacedChip {
    /// `topology_x`, `topology_y`.
    pos: Option<(i64, i64)>,
    index: i64,
    unit: Unit,
    core_count: Option<i64>,
}

/// Builds the picture of `node` from everything the scheduler sees.
pub fn build(world: &World, node: &str) -> Result<NodeTopology, TopologyError> {
    let devices: Vec<&PublishedDevice> = world
        .on_node(node)
        .iter()
        .map(|&i| &world.devices[i])
        .collect();
    if devices.is_empty() {
        return Err(TopologyError::NoDevices {
            node: node.to_string(),
            known: world.nodes().iter().map(|n| n.to_string()).collect(),
        });
    }

    // Group labels: letters per size in order of the lowest chip (or, with no
    // chips, device) that has the value, so that on a torus 4A is row 0.
    let mut first_seen: BTreeMap<(u8, String), FirstMember> = BTreeMap::new();
    let mut members: BTreeMap<(u8, String), Vec<String>> = BTreeMap::new();
    for d in &devices {
        let kind = kind_of(d);
        if kind == UnitKind::NeuronCore {
            continue;
        }
        for size in GROUP_SIZES {
            if let Some(value) = str_attr(d, &group_attribute(size)) {
                let chip = if kind == UnitKind::NeuronChip { 0 } else { 1 };
                let key = (
                    chip,
                    int_attr(d, &format!("{}/deviceId", d.id.driver)).unwrap_or(i64::MAX),
                    natural_key(&d.id.device),
                );
                let entry = first_seen
                    .entry((size, value.clone()))
                    .or_insert(key.clone());
                if key < *entry {
                    *entry = key;
                }
                members
                    .entry((size, value))
                    .or_default()
                    .push(d.id.device.clone());
            }
        }
    }
    let mut labels: BTreeMap<(u8, String), String> = BTreeMap::new();
    let mut groups = Vec::new();
    for size in GROUP_SIZES {
        let mut values: Vec<(&FirstMember, &String)> = first_seen
            .iter()
            .filter(|((s, _), _)| *s == size)
            .map(|((_, v), k)| (k, v))
            .collect();
        values.sort();
        for (i, (_, value)) in values.into_iter().enumerate() {
            let label = format!("{size}{}", letters(i));
            labels.insert((size, value.clone()), label.clone());
            let mut m = members.remove(&(size, value.clone())).unwrap_or_default();
            m.sort_by_key(|n| natural_key(n));
            groups.push(GroupLabel {
                label,
                attribute: group_attribute(size),
                value: value.clone(),
                members: m,
            });
        }
    }

    let mut roots: BTreeMap<String, PcieRootBox> = BTreeMap::new();
    let mut chips: Vec<PlacedChip> = Vec::new();
    let mut cores: BTreeMap<i64, Vec<(i64, Unit)>> = BTreeMap::new();
    let mut others = Vec::new();
    for d in &devices {
        let u = unit(world, d, &labels);
        let driver = d.id.driver.as_str();
        let index = int_attr(d, &format!("{driver}/deviceId"));
        match u.kind {
            UnitKind::NeuronChip => {
                let pos = int_attr(d, &format!("{driver}/topology_x"))
                    .zip(int_attr(d, &format!("{driver}/topology_y")));
                if let (Some(root), Some(i)) = (str_attr(d, PCIE_ROOT), index) {
                    root_box(&mut roots, &root).neuron_chips.push(i);
                }
                let core_count = int_attr(d, &format!("{driver}/coreCount"));
                chips.push(PlacedChip {
                    pos,
                    index: index.unwrap_or(i64::MAX),
                    unit: u,
                    core_count,
                });
            }
            UnitKind::NeuronCore => {
                let core = int_attr(d, &format!("{driver}/coreId")).unwrap_or(i64::MAX);
                cores
                    .entry(index.unwrap_or(i64::MAX))
                    .or_default()
                    .push((core, u));
            }
            _ => match str_attr(d, PCIE_ROOT) {
                Some(root) => {
                    let b = root_box(&mut roots, &root);
                    if let Some(n) = str_attr(d, NUMA_NODE)
                        && !b.numa.contains(&n)
                    {
                        b.numa.push(n);
                    }
                    b.units.push(u);
                }
                None => others.push(u),
            },
        }
    }
    for b in roots.values_mut() {
        b.units.sort_by(|a, b| {
            (a.kind, &a.pci_bus_id, natural_key(&a.id.device)).cmp(&(
                b.kind,
                &b.pci_bus_id,
                natural_key(&b.id.device),
            ))
        });
        b.neuron_chips.sort_unstable();
        b.numa.sort();
    }
    others.sort_by(|a, b| {
        (a.kind, natural_key(&a.id.device)).cmp(&(b.kind, natural_key(&b.id.device)))
    });

    let grid = (!chips.is_empty()).then(|| {
        let torus = chips.iter().all(|c| c.pos.is_some());
        chips.sort_by_key(|c| (c.pos, c.index, natural_key(&c.unit.id.device)));
        let mut cells = Vec::new();
        for (
            i,
            PlacedChip {
                pos,
                index,
                unit: chip,
                core_count,
            },
        ) in chips.into_iter().enumerate()
        {
            let (row, col) = match pos {
                Some((x, y)) if torus => (
                    usize::try_from(x).unwrap_or(0),
                    usize::try_from(y).unwrap_or(0),
                ),
                _ => (i / 4, i % 4),
            };
            let mut cs = cores.remove(&index).unwrap_or_default();
            cs.sort_by_key(|(core, u)| (*core, natural_key(&u.id.device)));
            cells.push(ChipCell {
                row,
                col,
                index,
                chip,
                core_count,
                cores: cs.into_iter().map(|(_, u)| u).collect(),
            });
        }
        NeuronGrid {
            rows: cells.iter().map(|c| c.row + 1).max().unwrap_or(0),
            cols: cells.iter().map(|c| c.col + 1).max().unwrap_or(0),
            torus,
            chips: cells,
        }
    });
    // Cores whose chip is not published (should not happen): still shown.
    others.extend(cores.into_values().flatten().map(|(_, u)| u));

    let instance_type = world
        .inventory
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get("node.kubernetes.io/instance-type").cloned())
        .or_else(|| {
            devices
                .iter()
                .find_map(|d| str_attr(d, &format!("{}/instanceType", d.id.driver)))
        });

    Ok(NodeTopology {
        node: node.to_string(),
        instance_type,
        roots: roots.into_values().collect(),
        grid,
        others,
        groups,
    })
}

fn root_box<'a>(roots: &'a mut BTreeMap<String, PcieRootBox>, root: &str) -> &'a mut PcieRootBox {
    roots
        .entry(root.to_string())
        .or_insert_with(|| PcieRootBox {
            root: root.to_string(),
            numa: Vec::new(),
            units: Vec::new(),
            neuron_chips: Vec::new(),
        })
}
