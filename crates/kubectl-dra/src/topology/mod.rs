//! `kubectl dra topology NODE`: one node's accelerators as a picture.
//!
//! People pair GPUs with EFAs by PCIe root and Neuron chips with EFAs by
//! device group; a table (`kubectl dra devices`) lists those attributes, but
//! whether four free chips and four free EFAs share a group is quicker seen
//! than read. This module turns what the node publishes into a [`NodeTopology`]
//! (PCIe roots with the devices on each, the Neuron chips on their grid with
//! their NeuronCore partitions, device groups as short labels, who holds what,
//! which taints apply); [`text`] and [`svg`] draw it.
//!
//! Everything comes from the ResourceSlices, claims and DeviceTaintRules the
//! scheduler sees (the [`World`]), never from the node itself, so the picture
//! shows what allocation works with. Devices are recognised by the attributes
//! the drivers publish (`resourceType`, `deviceId`, `coreId`, `topology_x`,
//! `resource.kubernetes.io/pcieRoot`, …), not by their names, which differ
//! between driver versions.

pub mod svg;
pub mod text;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::world::{AttributeValue, DeviceId, PublishedDevice, World};

const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
const NEURON_DRIVER: &str = "neuron.aws.com";
/// The device-group sizes shown as labels (`4A`, `8B`, `16A`); group 1 is
/// the chip itself and tells nothing a picture needs.
const GROUP_SIZES: [u8; 3] = [4, 8, 16];

/// What a device is, as far as the picture is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum UnitKind {
    Gpu,
    Efa,
    NeuronChip,
    NeuronCore,
    /// The whole-node device of a Trn2 UltraServer node.
    NeuronNode,
    Other,
}

impl UnitKind {
    /// Three-letter tag for a row of a PCIe root.
    pub fn tag(self) -> &'static str {
        match self {
            UnitKind::Gpu => "GPU",
            UnitKind::Efa => "EFA",
            UnitKind::NeuronChip => "NRN",
            UnitKind::NeuronCore => "NC",
            UnitKind::NeuronNode => "NODE",
            UnitKind::Other => "DEV",
        }
    }
}

/// One taint on a device, and whether it is the driver's health report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaintMark {
    /// `key=value:Effect`.
    pub taint: String,
    /// The part of the key after the domain, for tight spaces.
    pub short: String,
    /// The key is in the device's own driver's domain: the driver found the
    /// device faulty (its health taints are `<driver>/<dimension>`).
    pub unhealthy: bool,
    /// The DeviceTaintRule that puts it there, when not the slice.
    pub rule: Option<String>,
}

/// The one word a device's state reduces to, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    Unhealthy,
    Tainted,
    Allocated,
    Free,
}

/// One published device as drawn.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unit {
    pub id: DeviceId,
    pub kind: UnitKind,
    /// What a person recognises it by besides its name: the GPU model, the
    /// EFA's RDMA device.
    pub detail: String,
    /// `resource.kubernetes.io/pciBusID`, when published: the order devices
    /// are listed in on a root.
    pub pci_bus_id: Option<String>,
    /// Device-group labels (`4A`, `8B`), see [`NodeTopology::groups`].
    pub groups: Vec<String>,
    /// Claims (`namespace/name`) whose allocation holds it; admin-access
    /// claims are marked `(admin)`.
    pub holders: Vec<String>,
    pub taints: Vec<TaintMark>,
    /// Why the scheduler ignores the device's whole pool, if it does.
    pub pool_problem: Option<String>,
}

impl Unit {
    pub fn state(&self) -> State {
        if self.taints.iter().any(|t| t.unhealthy) {
            State::Unhealthy
        } else if !self.taints.is_empty() {
            State::Tainted
        } else if !self.holders.is_empty() {
            State::Allocated
        } else {
            State::Free
        }
    }

    /// A short status: the first holder, else the first taint, else `free`.
    pub fn status(&self) -> String {
        match self.state() {
            State::Unhealthy | State::Tainted => {
                let t = self
                    .taints
                    .iter()
                    .find(|t| t.unhealthy)
                    .or(self.taints.first());
                let word = if self.state() == State::Unhealthy {
                    "unhealthy"
                } else {
                    "tainted"
                };
                match t {
                    Some(t) => format!("{word}: {}", t.short),
                    None => word.to_string(),
                }
            }
            State::Allocated => {
                let more = self.holders.len().saturating_sub(1);
                if more > 0 {
                    format!("{} +{more}", self.holders[0])
                } else {
                    self.holders[0].clone()
                }
            }
            State::Free => "free".to_string(),
        }
    }
}

/// The devices on one PCIe root.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PcieRootBox {
    pub root: String,
    /// NUMA node(s) its devices report.
    pub numa: Vec<String>,
    /// GPUs, EFAs and other devices; Neuron chips are drawn on the grid
    /// and only named here (`neuron_chips`).
    pub units: Vec<Unit>,
    /// `deviceId` of the Neuron chips on this root.
    pub neuron_chips: Vec<i64>,
}

/// A Neuron chip on the grid, with its NeuronCore partitions.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChipCell {
    pub row: usize,
    pub col: usize,
    /// `deviceId`: the N of `/dev/neuronN`.
    pub index: i64,
    pub chip: Unit,
    /// Physical cores the chip has (`coreCount`), when published.
    pub core_count: Option<i64>,
    /// The per-core devices, in `coreId` order (empty when the driver
    /// publishes whole chips only).
    pub cores: Vec<Unit>,
}

/// The Neuron chips of the node laid out as rows and columns.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NeuronGrid {
    pub rows: usize,
    pub cols: usize,
    /// Positions come from `topology_x`/`topology_y` (the 4×4 torus); when
    /// false the chips are placed four to a row in `deviceId` order.
    pub torus: bool,
    pub chips: Vec<ChipCell>,
}

/// A device group, its label and its members.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupLabel {
    /// `4A`: size and letter, unique on the node.
    pub label: String,
    /// `resource.aws.com/devicegroup4_id`.
    pub attribute: String,
    pub value: String,
    /// Device names in the group (chips, EFAs), sorted.
    pub members: Vec<String>,
}

/// Everything drawn for one node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopology {
    pub node: String,
    pub instance_type: Option<String>,
    pub roots: Vec<PcieRootBox>,
    pub grid: Option<NeuronGrid>,
    /// Devices with no PCIe root that are not Neuron chips or cores.
    pub others: Vec<Unit>,
    pub groups: Vec<GroupLabel>,
}

impl NodeTopology {
    /// Every device drawn, in drawing order.
    pub fn units(&self) -> impl Iterator<Item = &Unit> {
        self.roots
            .iter()
            .flat_map(|r| r.units.iter())
            .chain(
                self.grid
                    .iter()
                    .flat_map(|g| g.chips.iter())
                    .flat_map(|c| std::iter::once(&c.chip).chain(c.cores.iter())),
            )
            .chain(self.others.iter())
    }

    /// Devices that are tainted, unhealthy or in an ignored pool: the ones
    /// the picture can only hint at and that get a line of their own.
    pub fn troubled(&self) -> Vec<&Unit> {
        self.units()
            .filter(|u| !u.taints.is_empty() || u.pool_problem.is_some())
            .collect()
    }

    /// One line per taint for the list under the picture; a chip's cores
    /// that carry the chip's own taint (a health report covers the whole
    /// chip) are folded into the chip's line instead of one line each.
    pub fn trouble_lines(&self) -> Vec<TroubleLine> {
        let mut out = Vec::new();
        let mut folded: std::collections::HashSet<(&str, &str)> = Default::default();
        for cell in self.grid.iter().flat_map(|g| g.chips.iter()) {
            for taint in &cell.chip.taints {
                let same: Vec<&Unit> = cell
                    .cores
                    .iter()
                    .filter(|c| c.taints.iter().any(|t| t.taint == taint.taint))
                    .collect();
                for c in &same {
                    folded.insert((c.id.device.as_str(), taint.taint.as_str()));
                }
                let devices = match same.len() {
                    0 => cell.chip.id.device.clone(),
                    n if n == cell.cores.len() => {
                        format!("{} and its {n} cores", cell.chip.id.device)
                    }
                    n => format!("{} and {n} of its cores", cell.chip.id.device),
                };
                folded.insert((cell.chip.id.device.as_str(), taint.taint.as_str()));
                out.push(TroubleLine::new(devices, &cell.chip, taint));
            }
        }
        for u in self.units() {
            for taint in &u.taints {
                if !folded.contains(&(u.id.device.as_str(), taint.taint.as_str())) {
                    out.push(TroubleLine::new(u.id.device.clone(), u, taint));
                }
            }
        }
        out.sort_by_key(|l| natural_key(&l.devices));
        out
    }

    /// Devices held by a claim, with the claims.
    pub fn allocated(&self) -> Vec<&Unit> {
        self.units().filter(|u| !u.holders.is_empty()).collect()
    }
}

/// A taint as listed under the picture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TroubleLine {
    /// The device, or a chip and its cores.
    pub devices: String,
    /// `key=value:Effect`.
    pub taint: String,
    /// Where it comes from: the driver's health report, a DeviceTaintRule,
    /// or the slice.
    pub source: String,
    pub unhealthy: bool,
}

impl TroubleLine {
    fn new(devices: String, u: &Unit, taint: &TaintMark) -> TroubleLine {
        let source = match &taint.rule {
            Some(r) => format!("DeviceTaintRule {r}"),
            None if taint.unhealthy => format!("health reported by {}", u.id.driver),
            None => "on the ResourceSlice".to_string(),
        };
        TroubleLine {
            devices,
            taint: taint.taint.clone(),
            source,
            unhealthy: taint.unhealthy,
        }
    }
}

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

fn int_attr(d: &PublishedDevice, name: &str) -> Option<i64> {
    match d.attribute(name)? {
        AttributeValue::Int(i) => Some(i),
        AttributeValue::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn str_attr(d: &PublishedDevice, name: &str) -> Option<String> {
    d.attribute(name).map(|v| v.plain())
}

fn kind_of(d: &PublishedDevice) -> UnitKind {
    let driver = d.id.driver.as_str();
    if driver == NEURON_DRIVER || driver.ends_with(".neuron.aws.com") {
        return match str_attr(d, &format!("{driver}/resourceType")).as_deref() {
            Some("neuron_core") => UnitKind::NeuronCore,
            Some("neuron_node") => UnitKind::NeuronNode,
            _ => UnitKind::NeuronChip,
        };
    }
    if driver.starts_with("efa.") || str_attr(d, &format!("{driver}/rdmaDevice")).is_some() {
        return UnitKind::Efa;
    }
    if driver == "gpu.nvidia.com"
        && str_attr(d, &format!("{driver}/type")).is_none_or(|t| t == "gpu")
    {
        return UnitKind::Gpu;
    }
    UnitKind::Other
}

fn detail_of(d: &PublishedDevice, kind: UnitKind) -> String {
    let driver = d.id.driver.as_str();
    let attr = |n: &str| str_attr(d, &format!("{driver}/{n}"));
    match kind {
        UnitKind::Gpu => attr("productName").unwrap_or_default(),
        UnitKind::Efa => attr("rdmaDevice").unwrap_or_default(),
        UnitKind::NeuronChip => attr("deviceId")
            .map(|i| format!("/dev/neuron{i}"))
            .unwrap_or_default(),
        UnitKind::NeuronCore => attr("coreId")
            .map(|i| format!("core {i}"))
            .unwrap_or_default(),
        UnitKind::NeuronNode | UnitKind::Other => driver.to_string(),
    }
}

fn taints_of(d: &PublishedDevice) -> Vec<TaintMark> {
    let mark = |t: &k8s_openapi::api::resource::v1::DeviceTaint, rule: Option<&String>| {
        let (domain, short) = t.key.split_once('/').unwrap_or(("", t.key.as_str()));
        TaintMark {
            taint: format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            ),
            short: short.to_string(),
            unhealthy: rule.is_none() && domain == d.id.driver,
            rule: rule.cloned(),
        }
    };
    d.device
        .taints
        .iter()
        .map(|t| mark(t, None))
        .chain(d.rule_taints.iter().map(|(r, t)| mark(t, Some(r))))
        .collect()
}

fn unit(world: &World, d: &PublishedDevice, labels: &BTreeMap<(u8, String), String>) -> Unit {
    let kind = kind_of(d);
    let groups = GROUP_SIZES
        .iter()
        .filter_map(|&size| {
            let value = str_attr(d, &group_attribute(size))?;
            labels.get(&(size, value)).cloned()
        })
        .collect();
    Unit {
        id: d.id.clone(),
        kind,
        detail: detail_of(d, kind),
        pci_bus_id: str_attr(d, PCI_BUS_ID),
        groups,
        holders: world
            .holders
            .get(&d.id)
            .into_iter()
            .flatten()
            .cloned()
            .chain(
                world
                    .admin_holders
                    .get(&d.id)
                    .into_iter()
                    .flatten()
                    .map(|c| format!("{c} (admin)")),
            )
            .collect(),
        taints: taints_of(d),
        pool_problem: d.pool_problem.clone(),
    }
}

fn group_attribute(size: u8) -> String {
    format!("resource.aws.com/devicegroup{size}_id")
}

/// `A`, `B`, … `Z`, `AA`, `AB`, …
fn letters(mut i: usize) -> String {
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

/// Digit runs as numbers, the rest as text: see [`natural_key`].
type NaturalKey = Vec<(u8, u64, String)>;

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

/// Natural order for names like `efa-0000-4f-00-0` and `neurondevice10`:
/// digit runs compare as numbers.
fn natural_key(s: &str) -> NaturalKey {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        let mut run = String::new();
        let digits = c.is_ascii_digit();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_digit() != digits {
                break;
            }
            run.push(c);
            chars.next();
        }
        if digits {
            out.push((0, run.parse().unwrap_or(u64::MAX), run));
        } else {
            out.push((1, 0, run));
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_run_past_z() {
        assert_eq!(letters(0), "A");
        assert_eq!(letters(25), "Z");
        assert_eq!(letters(26), "AA");
        assert_eq!(letters(27), "AB");
    }

    #[test]
    fn natural_order_compares_numbers() {
        let mut names = vec!["neurondevice10", "neurondevice2", "neurondevice1"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, ["neurondevice1", "neurondevice2", "neurondevice10"]);
    }
}
