//! Generated sysfs and `/dev` trees that look like real AWS accelerator nodes.
//!
//! [`generate`] writes `<dir>/sys` and `<dir>/dev` for one of
//! [`instance_types`] from a compact description ([`spec()`], see the
//! [`spec`](mod@spec) module for what each description follows and what is
//! invented), and returns a [`Fixture`] that says what it wrote, so tests
//! assert against the description instead of repeating it.
//!
//! What a tree contains, as the kernel lays it out:
//! - `sys/devices/pci0000:<bus>/<bridge>/…/<bdf>/` for every function with
//!   `vendor`, `device`, `class`, `subsystem_*`, `numa_node`,
//!   `local_cpulist`, link speed/width, `driver` and `subsystem` links;
//!   `sys/bus/pci/devices/<bdf>` and `sys/bus/pci/drivers/<drv>/<bdf>`
//!   links; bridges bound to `pcieport`;
//! - EFA: `<bdf>/infiniband/<ibdev>` (`device` link, port state),
//!   `<bdf>/infiniband_verbs/uverbsN` (`ibdev`, `dev`, `device` link),
//!   `sys/class/infiniband/<ibdev>`, `sys/class/infiniband_verbs/uverbsN`,
//!   `dev/infiniband/uverbsN` (231:192+N) and `dev/infiniband/rdma_cm`
//!   (10:58); RDMA names are predictable, `rdmap<bus>s<slot>` in decimal;
//!   uverbs numbers follow PCI address order;
//! - Neuron: the PCI function (driver `neuron`) and the class device
//!   `sys/class/neuron_device/neuronN` →
//!   `sys/devices/virtual/neuron_device/neuronN` (`connected_devices`,
//!   `core_count`, `dev`, `reset`, `info/architecture/*`), `dev/neuronN`
//!   (major [`NEURON_MAJOR`], minor N). As on real hosts nothing in sysfs
//!   links `neuronN` to its PCI function: [`Fixture::neuron_chips`] has it;
//! - health counters of EFAs and Neuron chips, zeroed, and faults to inject
//!   into them ([`health`]);
//! - NVIDIA GPUs (driver `nvidia`, `dev/nvidiaN` 195:N, `dev/nvidiactl`),
//!   ENA (`net/<ifname>`, `sys/class/net/<ifname>`), NVMe decoys;
//! - `sys/devices/virtual/dmi/id/product_name`, `sys/module/<m>/version`,
//!   `sys/devices/system/node/nodeK/cpulist`.
//!
//! Device nodes are character devices when the process may create them
//! (root with `CAP_MKNOD`), empty plain files otherwise
//! ([`Fixture::device_nodes`] says which).

pub mod health;
pub mod spec;
mod write;

use std::io;
use std::path::{Path, PathBuf};

pub use spec::{
    Bdf, ChipTopology, DeviceKind, INSTANCE_TYPES, InstanceSpec, NeuronSpec, Node, RootComplex,
    UltraServerSpec, instance_type_of, spec, trn2u, ultraserver_ids,
};
pub use write::{NEURON_MAJOR, NVIDIA_MAJOR, RDMA_CM_DEV, UVERBS_MAJOR, UVERBS_MINOR_BASE};

use write::{Placed, Writer, place};

/// What went wrong while writing a fixture.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    #[error("no fixture description for instance type {0:?}")]
    UnknownInstanceType(String),
    #[error("{instance_type}: description is not a possible PCI tree: {problems}")]
    InvalidSpec {
        instance_type: String,
        problems: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no {kind} at {bdf} in this fixture")]
    NoSuchDevice { kind: &'static str, bdf: String },
}

/// How device nodes under `dev/` are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceNodes {
    /// Real character devices (`mknod`, needs root / `CAP_MKNOD`).
    CharDevices,
    /// Empty regular files at the same paths.
    PlainFiles,
}

/// The instance types with a description, for `--list` and table tests.
pub fn instance_types() -> &'static [&'static str] {
    INSTANCE_TYPES
}

/// An NVIDIA GPU of the fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub bdf: String,
    pub device_id: u16,
    pub pcie_root: String,
    pub numa_node: Option<u32>,
    /// Bridges from the root port down, as `DDDD:BB:DD.F`.
    pub bridges: Vec<String>,
}

/// An EFA of the fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfaInfo {
    pub bdf: String,
    pub device_id: u16,
    /// RDMA device name, e.g. `rdmap79s0`.
    pub ibdev: String,
    /// N of `uverbsN` / `dev/infiniband/uverbsN`.
    pub uverbs: u32,
    pub pcie_root: String,
    pub numa_node: Option<u32>,
    pub bridges: Vec<String>,
}

/// A Neuron chip of the fixture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronChipInfo {
    /// N of `neuronN` / `dev/neuronN`.
    pub index: u32,
    /// The PCI function (what `NEURON_IOCTL_DEVICE_BDF` would answer).
    pub bdf: String,
    pub device_id: u16,
    pub pcie_root: String,
    pub numa_node: Option<u32>,
    pub core_count: u32,
    /// `connected_devices`, in file order.
    pub connected: Vec<u32>,
    pub bridges: Vec<String>,
}

/// A function that drivers must not pick up (ENA, NVMe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoyInfo {
    pub bdf: String,
    pub vendor: u16,
    pub device: u16,
    pub driver: &'static str,
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub instance_type: String,
    /// The directory given to [`generate`].
    pub root: PathBuf,
    /// `<root>/sys`: pass as `--sysfs-root`.
    pub sys: PathBuf,
    /// `<root>/dev`: pass as `--dev-root`.
    pub dev: PathBuf,
    pub gpus: Vec<GpuInfo>,
    /// EFAs in PCI address order (= uverbs order).
    pub efas: Vec<EfaInfo>,
    /// Neuron chips by index.
    pub neuron_chips: Vec<NeuronChipInfo>,
    pub decoys: Vec<DecoyInfo>,
    pub device_nodes: DeviceNodes,
    pub spec: InstanceSpec,
    placed: Vec<Placed>,
}

/// Writes the fixture of `instance_type` into `dir/sys` and `dir/dev`,
/// with character devices when possible.
pub fn generate(instance_type: &str, dir: &Path) -> Result<Fixture, FixtureError> {
    let spec = spec(instance_type)
        .ok_or_else(|| FixtureError::UnknownInstanceType(instance_type.to_owned()))?;
    generate_spec(spec, dir, None)
}

/// Writes any description; `nodes` forces how device nodes are made
/// (`None`: character devices when possible).
pub fn generate_spec(
    spec: InstanceSpec,
    dir: &Path,
    nodes: Option<DeviceNodes>,
) -> Result<Fixture, FixtureError> {
    spec.validate()
        .map_err(|problems| FixtureError::InvalidSpec {
            instance_type: spec.instance_type.to_owned(),
            problems,
        })?;
    let sys = dir.join("sys");
    let dev = dir.join("dev");
    for d in [&sys, &dev] {
        std::fs::create_dir_all(d).map_err(|source| FixtureError::Io {
            path: d.clone(),
            source,
        })?;
    }
    let nodes = nodes.unwrap_or_else(|| probe_char_devices(&dev));
    let placed = place(&spec);
    let writer = Writer {
        sys: &sys,
        dev: &dev,
        spec: &spec,
        nodes,
    };
    writer.write_platform(&placed)?;
    for p in &placed {
        writer.add_function(p)?;
        writer.bind(p)?;
    }
    let fixture = describe(spec.clone(), dir, sys.clone(), dev.clone(), nodes, placed);
    Ok(fixture)
}

/// Whether `mknod` works here: tried once, on a scratch node.
fn probe_char_devices(dev: &Path) -> DeviceNodes {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    if !nix::unistd::geteuid().is_root() {
        return DeviceNodes::PlainFiles;
    }
    let probe = dev.join(".mknod-probe");
    let made = mknod(
        &probe,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o600),
        makedev(1, 3),
    )
    .is_ok();
    let _ = std::fs::remove_file(&probe);
    if made {
        DeviceNodes::CharDevices
    } else {
        DeviceNodes::PlainFiles
    }
}

fn describe(
    spec: InstanceSpec,
    dir: &Path,
    sys: PathBuf,
    dev: PathBuf,
    device_nodes: DeviceNodes,
    placed: Vec<Placed>,
) -> Fixture {
    let mut f = Fixture {
        instance_type: spec.instance_type.to_owned(),
        root: dir.to_owned(),
        sys,
        dev,
        gpus: Vec::new(),
        efas: Vec::new(),
        neuron_chips: Vec::new(),
        decoys: Vec::new(),
        device_nodes,
        spec,
        placed: Vec::new(),
    };
    for p in &placed {
        let bdf = p.bdf.to_string();
        let pcie_root = format!("pci0000:{:02x}", p.root_bus);
        let numa_node = u32::try_from(p.numa_node).ok();
        let bridges: Vec<String> = p.chain.iter().map(|b| b.to_string()).collect();
        match &p.kind {
            None => {}
            Some(DeviceKind::Efa { device_id }) => f.efas.push(EfaInfo {
                bdf,
                device_id: *device_id,
                ibdev: p.bdf.rdma_name(),
                uverbs: p.uverbs.unwrap_or(0),
                pcie_root,
                numa_node,
                bridges,
            }),
            Some(DeviceKind::NvidiaGpu { index, device_id }) => f.gpus.push(GpuInfo {
                index: *index,
                bdf,
                device_id: *device_id,
                pcie_root,
                numa_node,
                bridges,
            }),
            Some(DeviceKind::Neuron { index }) => {
                let n = f.spec.neuron.as_ref();
                f.neuron_chips.push(NeuronChipInfo {
                    index: *index,
                    bdf,
                    device_id: n.map_or(0, |n| n.device_id),
                    pcie_root,
                    numa_node,
                    core_count: n.map_or(0, |n| n.core_count),
                    connected: f.spec.connected_devices(*index),
                    bridges,
                })
            }
            Some(DeviceKind::Ena { .. }) => f.decoys.push(DecoyInfo {
                bdf,
                vendor: 0x1d0f,
                device: 0xec20,
                driver: "ena",
            }),
            Some(DeviceKind::Nvme { device_id }) => f.decoys.push(DecoyInfo {
                bdf,
                vendor: 0x1d0f,
                device: *device_id,
                driver: "nvme",
            }),
        }
    }
    f.gpus.sort_by_key(|g| g.index);
    f.efas.sort_by_key(|e| e.uverbs);
    f.neuron_chips.sort_by_key(|c| c.index);
    f.decoys.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    f.placed = placed;
    f
}

impl Fixture {
    fn writer(&self) -> Writer<'_> {
        Writer {
            sys: &self.sys,
            dev: &self.dev,
            spec: &self.spec,
            nodes: self.device_nodes,
        }
    }

    fn placed(&self, bdf: &str, kind: &'static str) -> Result<&Placed, FixtureError> {
        self.placed
            .iter()
            .find(|p| {
                p.bdf.to_string() == bdf
                    && (kind != "EFA" || matches!(p.kind, Some(DeviceKind::Efa { .. })))
            })
            .ok_or_else(|| FixtureError::NoSuchDevice {
                kind,
                bdf: bdf.to_owned(),
            })
    }

    /// The EFA at `bdf`, as described.
    pub fn efa(&self, bdf: &str) -> Option<&EfaInfo> {
        self.efas.iter().find(|e| e.bdf == bdf)
    }

    /// Hot-unplugs the EFA at `bdf`: its driver unbinds (RDMA and verbs
    /// entries and `dev/infiniband/uverbsN` go), then the PCI function goes.
    pub fn remove_efa(&self, bdf: &str) -> Result<(), FixtureError> {
        self.writer().remove(self.placed(bdf, "EFA")?)
    }

    /// Hot-plugs the EFA at `bdf` back, exactly as first generated.
    pub fn add_efa(&self, bdf: &str) -> Result<(), FixtureError> {
        let p = self.placed(bdf, "EFA")?;
        let w = self.writer();
        w.add_function(p)?;
        w.bind(p)
    }

    /// Unbinds the driver of any function at `bdf` (the function stays).
    pub fn unbind_driver(&self, bdf: &str) -> Result<(), FixtureError> {
        self.writer().unbind(self.placed(bdf, "PCI function")?)
    }

    /// Binds the driver of the function at `bdf` again.
    pub fn bind_driver(&self, bdf: &str) -> Result<(), FixtureError> {
        self.writer().bind(self.placed(bdf, "PCI function")?)
    }

    /// Hot-unplugs any function at `bdf` (GPU, Neuron chip, decoy).
    pub fn remove_device(&self, bdf: &str) -> Result<(), FixtureError> {
        self.writer().remove(self.placed(bdf, "PCI function")?)
    }
}
