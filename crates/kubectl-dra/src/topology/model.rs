//! The picture of one node: PCIe roots with their devices, the Neuron chip
//! grid, device-group labels, holders and taints. Built by `build`, drawn by
//! [`super::text`] and [`super::svg`], printed as is by `-o json|yaml`.

use serde::Serialize;

use super::natural::natural_key;
use crate::world::DeviceId;

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
