//! Compact descriptions of AWS instance types: what PCI functions exist,
//! where they hang in the PCIe tree, on which NUMA node.
//!
//! What the descriptions follow (from AWS's published facts):
//! - p4d.24xlarge: 8 A100, 4 EFA (`efa0`); each EFA shares one PCIe switch
//!   (and root complex) with a pair of GPUs; root complexes `pci0000:10`,
//!   `pci0000:20` on NUMA 0, `pci0000:90`, `pci0000:a0` on NUMA 1.
//! - p5.48xlarge: 8 H100, 32 EFA (`efa1`), 4 per GPU; each GPU, its 4 EFAs
//!   and one local NVMe drive sit below one switch on their own root complex
//!   (`pci0000:44` + 0x11·g, so GPUs land on buses 0x53, 0x64, … 0xca as on
//!   real hosts, and the first EFA on bus 0x4f = `rdmap79s0`); GPUs 0-3
//!   NUMA 0, 4-7 NUMA 1.
//! - p5en.48xlarge: the same shape with 8 H200 and 16 EFA (`efa2`), 2 per GPU.
//! - trn1.32xlarge / trn1n.32xlarge: 16 Trainium chips and 8 / 16 EFAs at
//!   exactly the addresses of AWS's chip → EFA tables, flat on root buses
//!   0x10, 0x20 (NUMA 0) and 0x90, 0xa0 (NUMA 1) as on Nitro hosts: chips and
//!   EFAs are on the root bus itself, so the PCIe tree alone cannot tell which
//!   EFA of a root complex belongs to which chip (every pair is `PHB`).
//!   Chips sit at slots 0x1c-0x1f of their root bus.
//! - trn2.48xlarge: 16 Trainium2 chips (8 cores) and 16 EFAs (`efa2`) at the
//!   table's addresses; chip i sits on bus (its EFA's bus + 3), which puts
//!   chip 0 at `0000:cc:00.0` and chip 4 at `0000:6f:00.0` as on real hosts;
//!   each chip shares a switch with its EFA; two chip/EFA pairs per root
//!   complex; chips 0-3 and 12-15 NUMA 1, 4-11 NUMA 0.
//! - trn2u.48xlarge: trn2.48xlarge hardware in a Trn2 UltraServer (4 nodes
//!   joined by NeuronLink), with the kernel driver's UltraServer files;
//!   the 4 nodes of one UltraServer, the election still running (`busy`)
//!   and the non-UltraServer form are [`UltraServerSpec`]s ([`trn2u`]).
//!   The ids are invented (16 hex digits, as the kernel prints them).
//! - inf2.48xlarge: 12 Inferentia2 chips in a ring, no EFA, 3 chips per root
//!   complex (`pci0000:10`, `20` NUMA 0; `90`, `a0` NUMA 1).
//! - m5.8xlarge: no accelerator, no EFA, one NUMA node.
//!
//! Every instance also has an ENA (`1d0f:ec20`, `ens5` at `0000:00:05.0`)
//! and an EBS NVMe controller (`1d0f:8061`) on `pci0000:00`; instance types
//! with local storage add instance-store NVMe (`1d0f:cd01`).
//!
//! Invented where unknown (plausible and self-consistent, checked by
//! [`InstanceSpec::validate`]): bus numbers of bridges, slot numbers of
//! Nitro-flat devices, bridge ids (root ports `8086:347a`, switch ports
//! `1000:c030`), link speeds, Neuron `info/architecture` strings. Bridge bus
//! ranges (`secondary_bus_number`, `subordinate_bus_number`) are not written.

use std::fmt;

mod instances;

use instances::{TRN1_EFA_SLOTS, TRN1N_EFA_SLOTS, inf2, m5, p4d, p5, trn1, trn2};

/// A PCI address inside the generator (the generator does not depend on
/// the `topology` crate, so that crate's tests can use the generator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl Bdf {
    pub const fn new(bus: u8, device: u8) -> Bdf {
        Bdf {
            domain: 0,
            bus,
            device,
            function: 0,
        }
    }

    /// The predictable RDMA device name systemd/rdma-core gives the function
    /// (`rdmap<bus>s<slot>` in decimal, `f<fn>` when the function is not 0).
    pub fn rdma_name(&self) -> String {
        let mut s = String::from("rdma");
        if self.domain != 0 {
            s.push_str(&format!("P{}", self.domain));
        }
        s.push_str(&format!("p{}s{}", self.bus, self.device));
        if self.function != 0 {
            s.push_str(&format!("f{}", self.function));
        }
        s
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// An endpoint function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// An EFA with the given PCI device id (`0xefa0`…).
    Efa { device_id: u16 },
    /// NVIDIA GPU number `index` (its `/dev/nvidia<index>`).
    NvidiaGpu { index: u32, device_id: u16 },
    /// Neuron chip number `index` (its `/dev/neuron<index>`).
    Neuron { index: u32 },
    /// ENA network adapter with its interface name.
    Ena { ifname: &'static str },
    /// NVMe controller (`0xcd01` instance store, `0x8061` EBS).
    Nvme { device_id: u16 },
}

/// A node of the PCIe tree below a root complex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Bridge { bdf: Bdf, children: Vec<Node> },
    Device { bdf: Bdf, kind: DeviceKind },
}

impl Node {
    pub fn bdf(&self) -> Bdf {
        match self {
            Node::Bridge { bdf, .. } | Node::Device { bdf, .. } => *bdf,
        }
    }
}

/// One PCI root complex, `pci0000:<bus>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootComplex {
    pub bus: u8,
    /// NUMA node written into every function below (`-1` = unknown).
    pub numa_node: i32,
    pub children: Vec<Node>,
}

/// How Neuron chips are wired to each other (`connected_devices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChipTopology {
    /// 4×4 2D torus, chip N at x = N/4, y = N%4; neighbours listed as
    /// x-1, y-1, x+1, y+1 (chip 0: `12, 3, 4, 1`).
    Torus4x4,
    /// Ring: previous, next.
    Ring,
}

/// What every Neuron chip of the instance looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronSpec {
    pub device_id: u16,
    pub core_count: u32,
    pub topology: ChipTopology,
    pub arch_type: &'static str,
    pub device_name: &'static str,
    pub instance_label: &'static str,
    /// The class-level UltraServer files (`/sys/class/neuron_device/
    /// {ultraserver_mode,server_id_2,server_id_4,node_id_2,node_id_4}`).
    pub ultraserver: UltraServerSpec,
}

/// What the kernel driver's UltraServer files say. It writes them on every
/// Neuron instance; real values only on UltraServer types (trn2u), decided
/// from the DMI product name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UltraServerSpec {
    /// No files (a kernel driver older than UltraServer support).
    Absent,
    /// Not an UltraServer: `node_id_N` = `-1`, `server_id_N` all zeros,
    /// `ultraserver_mode` an empty line.
    NotMember,
    /// The NeuronLink election is running: `node_id_N` and
    /// `ultraserver_mode` read `busy`, `server_id_N` all zeros.
    Busy,
    /// Node `node` (0-3) of UltraServer number `server` (which only makes
    /// the ids differ between UltraServers), supporting `modes` (the
    /// kernel's mode numbers, e.g. `1,2,3,4`). Nodes 0+1 and 2+3 form the
    /// 2-node sets.
    Member {
        server: u32,
        node: u32,
        modes: &'static str,
    },
}

impl UltraServerSpec {
    /// `(ultraserver_mode, server_id_2, server_id_4, node_id_2, node_id_4)`
    /// as the files hold them (without the newline).
    pub fn files(&self) -> Option<[String; 5]> {
        let zero = "0".repeat(16);
        Some(match *self {
            UltraServerSpec::Absent => return None,
            UltraServerSpec::NotMember => {
                [String::new(), zero.clone(), zero, "-1".into(), "-1".into()]
            }
            UltraServerSpec::Busy => [
                "busy".into(),
                zero.clone(),
                zero,
                "busy".into(),
                "busy".into(),
            ],
            UltraServerSpec::Member {
                server,
                node,
                modes,
            } => {
                let (id2, id4) = ultraserver_ids(server, node);
                [
                    modes.to_owned(),
                    id2,
                    id4,
                    (node % 2).to_string(),
                    node.to_string(),
                ]
            }
        })
    }
}

/// `(server_id_2, server_id_4)` of node `node` of UltraServer `server`:
/// 16 hex digits, the 2-node set's id differing between nodes 0+1 and 2+3.
pub fn ultraserver_ids(server: u32, node: u32) -> (String, String) {
    let base = 0x5e7a_0000_0000_0000u64 + u64::from(server) * 0x100;
    (
        format!("{:016x}", base + 0x21 + u64::from(node / 2)),
        format!("{:016x}", base + 0x40),
    )
}

/// A trn2u.48xlarge node: the trn2.48xlarge hardware with the UltraServer
/// files in `state`.
pub fn trn2u(state: UltraServerSpec) -> InstanceSpec {
    let mut spec = trn2();
    spec.instance_type = "trn2u.48xlarge";
    if let Some(neuron) = spec.neuron.as_mut() {
        neuron.ultraserver = state;
    }
    spec
}

/// A compact description of one instance type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec {
    pub instance_type: &'static str,
    /// `cpulist` of NUMA node 0, 1, …
    pub numa_cpulists: &'static [&'static str],
    pub roots: Vec<RootComplex>,
    pub neuron: Option<NeuronSpec>,
}

/// The instance types that have a description.
pub const INSTANCE_TYPES: &[&str] = &[
    "p4d.24xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "trn2u.48xlarge",
    "inf2.48xlarge",
    "m5.8xlarge",
];

/// The instance type of a fixture name: a fixture of an UltraServer node is
/// named `trn2u.48xlarge@<variant>` ([`spec`]); the part before `@`.
pub fn instance_type_of(name: &str) -> &str {
    name.split_once('@').map_or(name, |(t, _)| t)
}

/// The UltraServer state of a `trn2u.48xlarge@<variant>` fixture name:
/// `node<N>` (node N of UltraServer 0, every mode), `node<N>-modes<M>`
/// (with modes M, `_`-separated, e.g. `node3-modes1_2_3`), `busy`, `none`.
fn ultraserver_variant(variant: &str) -> Option<UltraServerSpec> {
    match variant {
        "busy" => return Some(UltraServerSpec::Busy),
        "none" => return Some(UltraServerSpec::NotMember),
        _ => {}
    }
    let rest = variant.strip_prefix("node")?;
    let (node, modes) = match rest.split_once("-modes") {
        Some((node, modes)) => (node, modes.replace('_', ",")),
        None => (rest, "1,2,3,4".to_owned()),
    };
    let node: u32 = node.parse().ok().filter(|n| *n < 4)?;
    if modes.is_empty() || !modes.split(',').all(|m| matches!(m, "1" | "2" | "3" | "4")) {
        return None;
    }
    Some(UltraServerSpec::Member {
        server: 0,
        node,
        // A fixture lives as long as the process that describes it; a few
        // bytes per distinct name.
        modes: Box::leak(modes.into_boxed_str()),
    })
}

/// Looks up the description of an instance type, or of a fixture name
/// `trn2u.48xlarge@<variant>` (see [`instance_type_of`]).
pub fn spec(instance_type: &str) -> Option<InstanceSpec> {
    if let Some(("trn2u.48xlarge", variant)) = instance_type.split_once('@') {
        return ultraserver_variant(variant).map(trn2u);
    }
    Some(match instance_type {
        "p4d.24xlarge" => p4d(),
        "p5.48xlarge" => p5("p5.48xlarge", 0xefa1, 0x2330, 4),
        "p5en.48xlarge" => p5("p5en.48xlarge", 0xefa2, 0x2335, 2),
        "trn1.32xlarge" => trn1("trn1.32xlarge", TRN1_EFA_SLOTS),
        "trn1n.32xlarge" => trn1("trn1n.32xlarge", TRN1N_EFA_SLOTS),
        "trn2.48xlarge" => trn2(),
        // Node 0 of an UltraServer that supports every mode; other nodes
        // and states: [`trn2u`].
        "trn2u.48xlarge" => trn2u(UltraServerSpec::Member {
            server: 0,
            node: 0,
            modes: "1,2,3,4",
        }),
        "inf2.48xlarge" => inf2(),
        "m5.8xlarge" => m5(),
        _ => return None,
    })
}

impl InstanceSpec {
    /// Number of Neuron chips described.
    pub fn chip_count(&self) -> u32 {
        let mut n = 0;
        self.visit(&mut |_, _, node| {
            if let Node::Device {
                kind: DeviceKind::Neuron { .. },
                ..
            } = node
            {
                n += 1;
            }
        });
        n
    }

    /// Neighbours of chip `index` per the instance's chip topology.
    pub fn connected_devices(&self, index: u32) -> Vec<u32> {
        let n = self.chip_count();
        match self.neuron.as_ref().map(|s| s.topology) {
            Some(ChipTopology::Torus4x4) => {
                let (x, y) = (index / 4, index % 4);
                let at = |x: u32, y: u32| (x % 4) * 4 + y % 4;
                vec![at(x + 3, y), at(x, y + 3), at(x + 1, y), at(x, y + 1)]
            }
            Some(ChipTopology::Ring) if n > 1 => vec![(index + n - 1) % n, (index + 1) % n],
            _ => Vec::new(),
        }
    }

    /// Calls `f(root, chain of bridges above, node)` for every node, depth first.
    pub fn visit(&self, f: &mut dyn FnMut(&RootComplex, &[Bdf], &Node)) {
        fn walk(
            root: &RootComplex,
            chain: &mut Vec<Bdf>,
            node: &Node,
            f: &mut dyn FnMut(&RootComplex, &[Bdf], &Node),
        ) {
            f(root, chain, node);
            if let Node::Bridge { bdf, children } = node {
                chain.push(*bdf);
                for c in children {
                    walk(root, chain, c, f);
                }
                chain.pop();
            }
        }
        for root in &self.roots {
            let mut chain = Vec::new();
            for c in &root.children {
                walk(root, &mut chain, c, f);
            }
        }
    }

    /// Checks that the description is a possible PCI tree: unique addresses,
    /// the children of a root on its root bus, the children of each bridge
    /// on one bus of their own, and a NUMA node for every root.
    pub fn validate(&self) -> Result<(), String> {
        use std::collections::{BTreeMap, BTreeSet};
        let mut seen = BTreeSet::new();
        let mut bus_owner: BTreeMap<u8, String> = BTreeMap::new();
        let mut problems = Vec::new();
        for root in &self.roots {
            if bus_owner
                .insert(root.bus, format!("root pci0000:{:02x}", root.bus))
                .is_some()
            {
                problems.push(format!("root bus {:02x} used twice", root.bus));
            }
            if root.numa_node >= self.numa_cpulists.len() as i32 {
                problems.push(format!("root {:02x}: NUMA node without cpulist", root.bus));
            }
        }
        fn check_children(
            owner: String,
            bus: Option<u8>,
            children: &[Node],
            bus_owner: &mut BTreeMap<u8, String>,
            problems: &mut Vec<String>,
        ) {
            let buses: BTreeSet<u8> = children.iter().map(|c| c.bdf().bus).collect();
            if buses.len() > 1 {
                problems.push(format!("{owner}: children on several buses {buses:?}"));
            }
            if let (Some(b), Some(want)) = (buses.first(), bus)
                && *b != want
            {
                problems.push(format!("{owner}: child on bus {b:02x}, not {want:02x}"));
            }
            if bus.is_none()
                && let Some(b) = buses.first()
                && let Some(prev) = bus_owner.insert(*b, owner.clone())
            {
                problems.push(format!("bus {b:02x} used by {prev} and {owner}"));
            }
        }
        for root in &self.roots {
            check_children(
                format!("root {:02x}", root.bus),
                Some(root.bus),
                &root.children,
                &mut bus_owner,
                &mut problems,
            );
        }
        self.visit(&mut |_, _, node| {
            if !seen.insert(node.bdf()) {
                problems.push(format!("{} appears twice", node.bdf()));
            }
            if let Node::Bridge { bdf, children } = node {
                if children.is_empty() {
                    problems.push(format!("bridge {bdf} has no children"));
                }
                check_children(
                    format!("bridge {bdf}"),
                    None,
                    children,
                    &mut bus_owner,
                    &mut problems,
                );
            }
        });
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}
