//! Turns an [`InstanceSpec`] into files, directories, symlinks and device
//! nodes, the way the kernel lays them out.
//!
//! Symlinks are relative, as the kernel's are, so a tree stays valid when it
//! is moved or mounted elsewhere. Every function is written in two steps,
//! like a real probe: the PCI function itself ([`Writer::add_function`]),
//! then what its driver creates when it binds ([`Writer::bind`]); hot-plug
//! mutations reuse the same steps in reverse.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::spec::{Bdf, DeviceKind, InstanceSpec, Node};
use crate::{DeviceNodes, FixtureError};

/// Major of `/dev/infiniband/uverbsN` (minor 192 + N), fixed by the kernel.
pub const UVERBS_MAJOR: u32 = 231;
/// First minor of `uverbs` devices.
pub const UVERBS_MINOR_BASE: u32 = 192;
/// `/dev/infiniband/rdma_cm` is a misc device (major 10); its minor is
/// dynamic on real hosts, 58 here.
pub const RDMA_CM_DEV: (u32, u32) = (10, 58);
/// Major of `/dev/neuronN` (minor N). Dynamic on real hosts (the neuron
/// driver asks for one at load time); 245 here.
pub const NEURON_MAJOR: u32 = 245;
/// Major of `/dev/nvidiaN` (minor N) and `/dev/nvidiactl` (minor 255).
pub const NVIDIA_MAJOR: u32 = 195;

pub(crate) const EFA_MODULE_VERSION: &str = "2.13.0g";
pub(crate) const NEURON_MODULE_VERSION: &str = "2.21.37.0";
pub(crate) const NVIDIA_MODULE_VERSION: &str = "550.127.05";
pub(crate) const ENA_MODULE_VERSION: &str = "2.13.1g";

/// One function of the tree with everything needed to write it.
#[derive(Debug, Clone)]
pub(crate) struct Placed {
    pub bdf: Bdf,
    /// Path below `sys/devices`, e.g. `pci0000:44/0000:44:01.0/.../0000:4f:00.0`.
    pub rel: PathBuf,
    pub root_bus: u8,
    pub numa_node: i32,
    pub chain: Vec<Bdf>,
    /// `None` for bridges.
    pub kind: Option<DeviceKind>,
    /// `uverbsN` index for EFAs (EFAs numbered in PCI address order).
    pub uverbs: Option<u32>,
}

impl Placed {
    pub fn driver(&self) -> &'static str {
        match &self.kind {
            None => "pcieport",
            Some(DeviceKind::Efa { .. }) => "efa",
            Some(DeviceKind::NvidiaGpu { .. }) => "nvidia",
            Some(DeviceKind::Neuron { .. }) => "neuron",
            Some(DeviceKind::Ena { .. }) => "ena",
            Some(DeviceKind::Nvme { .. }) => "nvme",
        }
    }
}

pub(crate) fn place(spec: &InstanceSpec) -> Vec<Placed> {
    let mut out = Vec::new();
    spec.visit(&mut |root, chain, node| {
        let mut rel = PathBuf::from(format!("pci0000:{:02x}", root.bus));
        for b in chain {
            rel.push(b.to_string());
        }
        rel.push(node.bdf().to_string());
        out.push(Placed {
            bdf: node.bdf(),
            rel,
            root_bus: root.bus,
            numa_node: root.numa_node,
            chain: chain.to_vec(),
            kind: match node {
                Node::Bridge { .. } => None,
                Node::Device { kind, .. } => Some(kind.clone()),
            },
            uverbs: None,
        });
    });
    let mut efas: Vec<usize> = (0..out.len())
        .filter(|i| matches!(out[*i].kind, Some(DeviceKind::Efa { .. })))
        .collect();
    efas.sort_by_key(|i| out[*i].bdf);
    for (n, i) in efas.into_iter().enumerate() {
        out[i].uverbs = Some(n as u32);
    }
    out
}

pub(crate) struct Writer<'a> {
    pub sys: &'a Path,
    pub dev: &'a Path,
    pub spec: &'a InstanceSpec,
    pub nodes: DeviceNodes,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FixtureError + '_ {
    move |source| FixtureError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A relative link target from a link at `link` (relative to `sys`) to
/// `target` (relative to `sys`): one `..` per directory above the link.
fn relative(link: &Path, target: &Path) -> PathBuf {
    let depth = link.parent().map_or(0, |p| p.components().count());
    let mut out = PathBuf::new();
    for _ in 0..depth {
        out.push("..");
    }
    out.join(target)
}

fn hex16(v: u16) -> String {
    format!("0x{v:04x}\n")
}

impl Writer<'_> {
    fn write(&self, rel: impl AsRef<Path>, content: &str) -> Result<(), FixtureError> {
        let path = self.sys.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        fs::write(&path, content).map_err(io_err(&path))
    }

    /// A symlink at `link` pointing at `target`, both relative to `sys`.
    fn link(&self, link: impl AsRef<Path>, target: impl AsRef<Path>) -> Result<(), FixtureError> {
        let (link, target) = (link.as_ref(), target.as_ref());
        let path = self.sys.join(link);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        remove_if_exists(&path)?;
        std::os::unix::fs::symlink(relative(link, target), &path).map_err(io_err(&path))
    }

    fn char_dev(&self, rel: &str, major: u32, minor: u32) -> Result<(), FixtureError> {
        let path = self.dev.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        remove_if_exists(&path)?;
        match self.nodes {
            DeviceNodes::CharDevices => {
                use nix::sys::stat::{Mode, SFlag, makedev, mknod};
                mknod(
                    &path,
                    SFlag::S_IFCHR,
                    Mode::from_bits_truncate(0o666),
                    makedev(major.into(), minor.into()),
                )
                .map_err(|e| FixtureError::Io {
                    path: path.clone(),
                    source: io::Error::from(e),
                })
            }
            DeviceNodes::PlainFiles => fs::write(&path, "").map_err(io_err(&path)),
        }
    }

    fn cpulist(&self, numa: i32) -> &'static str {
        usize::try_from(numa)
            .ok()
            .and_then(|n| self.spec.numa_cpulists.get(n).copied())
            .unwrap_or("")
    }

    /// Instance-wide files: DMI, modules, NUMA nodes, class-level files.
    pub fn write_platform(&self, placed: &[Placed]) -> Result<(), FixtureError> {
        let dmi = "devices/virtual/dmi/id";
        self.write(
            format!("{dmi}/product_name"),
            &format!("{}\n", self.spec.instance_type),
        )?;
        self.write(format!("{dmi}/sys_vendor"), "Amazon EC2\n")?;
        self.write(format!("{dmi}/board_vendor"), "Amazon EC2\n")?;
        self.link("class/dmi/id", dmi)?;

        let nodes = self.spec.numa_cpulists.len();
        for (n, cpus) in self.spec.numa_cpulists.iter().enumerate() {
            self.write(
                format!("devices/system/node/node{n}/cpulist"),
                &format!("{cpus}\n"),
            )?;
        }
        let online = if nodes <= 1 {
            "0".to_owned()
        } else {
            format!("0-{}", nodes - 1)
        };
        self.write("devices/system/node/online", &format!("{online}\n"))?;

        let has =
            |f: &dyn Fn(&DeviceKind) -> bool| placed.iter().any(|p| p.kind.as_ref().is_some_and(f));
        let mut modules = vec![("ena", ENA_MODULE_VERSION)];
        if has(&|k| matches!(k, DeviceKind::Efa { .. })) {
            modules.push(("efa", EFA_MODULE_VERSION));
            self.write("class/infiniband_verbs/abi_version", "6\n")?;
            self.char_dev("infiniband/rdma_cm", RDMA_CM_DEV.0, RDMA_CM_DEV.1)?;
        }
        if has(&|k| matches!(k, DeviceKind::Neuron { .. })) {
            modules.push(("neuron", NEURON_MODULE_VERSION));
            // Class attributes sit in the class directory itself.
            let files = self
                .spec
                .neuron
                .as_ref()
                .and_then(|n| n.ultraserver.files());
            if let Some(values) = files {
                let names = [
                    "ultraserver_mode",
                    "server_id_2",
                    "server_id_4",
                    "node_id_2",
                    "node_id_4",
                ];
                for (name, value) in names.iter().zip(values) {
                    self.write(format!("class/neuron_device/{name}"), &format!("{value}\n"))?;
                }
            }
        }
        if has(&|k| matches!(k, DeviceKind::NvidiaGpu { .. })) {
            modules.push(("nvidia", NVIDIA_MODULE_VERSION));
            self.char_dev("nvidiactl", NVIDIA_MAJOR, 255)?;
        }
        for (m, v) in modules {
            self.write(format!("module/{m}/version"), &format!("{v}\n"))?;
            self.write(format!("module/{m}/initstate"), "live\n")?;
        }
        for p in placed {
            if p.chain.is_empty() {
                let root = format!("devices/pci0000:{:02x}", p.root_bus);
                let dir = self.sys.join(&root);
                fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            }
        }
        Ok(())
    }

    /// The PCI function itself, as the PCI core creates it before any driver
    /// binds.
    pub fn add_function(&self, p: &Placed) -> Result<(), FixtureError> {
        let dir = Path::new("devices").join(&p.rel);
        let (vendor, device, class, speed, width) = match &p.kind {
            None if p.chain.is_empty() => (0x8086, 0x347a, 0x060400, "32.0 GT/s PCIe", 16),
            None => (0x1000, 0xc030, 0x060400, "32.0 GT/s PCIe", 16),
            Some(DeviceKind::Efa { device_id }) => {
                (0x1d0f, *device_id, 0x020000, "16.0 GT/s PCIe", 16)
            }
            Some(DeviceKind::NvidiaGpu { device_id, .. }) => {
                (0x10de, *device_id, 0x030200, "32.0 GT/s PCIe", 16)
            }
            Some(DeviceKind::Neuron { .. }) => {
                let id = self.spec.neuron.as_ref().map_or(0x7164, |n| n.device_id);
                (0x1d0f, id, 0x088000, "32.0 GT/s PCIe", 16)
            }
            Some(DeviceKind::Ena { .. }) => (0x1d0f, 0xec20, 0x020000, "8.0 GT/s PCIe", 8),
            Some(DeviceKind::Nvme { device_id }) => {
                (0x1d0f, *device_id, 0x010802, "8.0 GT/s PCIe", 4)
            }
        };
        let attrs: [(&str, String); 13] = [
            ("vendor", hex16(vendor)),
            ("device", hex16(device)),
            ("class", format!("0x{class:06x}\n")),
            ("subsystem_vendor", hex16(vendor)),
            ("subsystem_device", hex16(device)),
            ("revision", "0x00\n".to_owned()),
            ("numa_node", format!("{}\n", p.numa_node)),
            ("local_cpulist", format!("{}\n", self.cpulist(p.numa_node))),
            ("current_link_speed", format!("{speed}\n")),
            ("current_link_width", format!("{width}\n")),
            ("max_link_speed", format!("{speed}\n")),
            ("max_link_width", format!("{width}\n")),
            ("enable", "1\n".to_owned()),
        ];
        for (name, value) in attrs {
            self.write(dir.join(name), &value)?;
        }
        self.write(
            dir.join("uevent"),
            &format!(
                "PCI_CLASS={class:X}\nPCI_ID={vendor:04X}:{device:04X}\nPCI_SUBSYS_ID={vendor:04X}:{device:04X}\nPCI_SLOT_NAME={}\n",
                p.bdf
            ),
        )?;
        self.link(dir.join("subsystem"), "bus/pci")?;
        self.link(format!("bus/pci/devices/{}", p.bdf), &dir)
    }

    /// What the function's driver creates when it binds.
    pub fn bind(&self, p: &Placed) -> Result<(), FixtureError> {
        let dir = Path::new("devices").join(&p.rel);
        let drv = p.driver();
        let drv_dir = format!("bus/pci/drivers/{drv}");
        self.link(dir.join("driver"), &drv_dir)?;
        self.link(format!("{drv_dir}/{}", p.bdf), &dir)?;
        if self.sys.join("module").join(drv).exists() {
            self.link(format!("{drv_dir}/module"), format!("module/{drv}"))?;
        }
        match &p.kind {
            Some(DeviceKind::Efa { .. }) => {
                let n = p.uverbs.unwrap_or(0);
                let ib = p.bdf.rdma_name();
                let ibdir = dir.join("infiniband").join(&ib);
                self.link(ibdir.join("device"), &dir)?;
                self.write(ibdir.join("node_type"), "1: CA\n")?;
                self.write(ibdir.join("fw_ver"), "0.0.0\n")?;
                self.write(ibdir.join("ports/1/state"), "4: ACTIVE\n")?;
                self.write(ibdir.join("ports/1/phys_state"), "5: LinkUp\n")?;
                self.write(ibdir.join("ports/1/link_layer"), "Unspecified\n")?;
                crate::health::write_efa_counters(&self.sys.join(&ibdir))?;
                let vdir = dir.join("infiniband_verbs").join(format!("uverbs{n}"));
                self.write(vdir.join("ibdev"), &format!("{ib}\n"))?;
                self.write(vdir.join("abi_version"), "1\n")?;
                self.write(
                    vdir.join("dev"),
                    &format!("{UVERBS_MAJOR}:{}\n", UVERBS_MINOR_BASE + n),
                )?;
                self.link(vdir.join("device"), &dir)?;
                self.link(format!("class/infiniband/{ib}"), &ibdir)?;
                self.link(format!("class/infiniband_verbs/uverbs{n}"), &vdir)?;
                self.char_dev(
                    &format!("infiniband/uverbs{n}"),
                    UVERBS_MAJOR,
                    UVERBS_MINOR_BASE + n,
                )?;
            }
            Some(DeviceKind::NvidiaGpu { index, .. }) => {
                self.char_dev(&format!("nvidia{index}"), NVIDIA_MAJOR, *index)?;
            }
            Some(DeviceKind::Neuron { index }) => {
                let spec = self.spec.neuron.as_ref();
                let cdir = PathBuf::from(format!("devices/virtual/neuron_device/neuron{index}"));
                let connected: Vec<String> = self
                    .spec
                    .connected_devices(*index)
                    .iter()
                    .map(|c| c.to_string())
                    .collect();
                self.write(
                    cdir.join("connected_devices"),
                    &format!("{}\n", connected.join(", ")),
                )?;
                // The kernel writes core_count without a newline.
                self.write(
                    cdir.join("core_count"),
                    &spec.map_or(0, |s| s.core_count).to_string(),
                )?;
                self.write(cdir.join("reset"), "")?;
                self.write(cdir.join("dev"), &format!("{NEURON_MAJOR}:{index}\n"))?;
                self.write(
                    cdir.join("uevent"),
                    &format!("MAJOR={NEURON_MAJOR}\nMINOR={index}\nDEVNAME=neuron{index}\n"),
                )?;
                let arch = cdir.join("info/architecture");
                if let Some(s) = spec {
                    self.write(arch.join("arch_type"), &format!("{}\n", s.arch_type))?;
                    self.write(arch.join("device_name"), &format!("{}\n", s.device_name))?;
                    self.write(
                        arch.join("instance_type"),
                        &format!("{}\n", s.instance_label),
                    )?;
                }
                crate::health::write_neuron_counters(
                    self.sys,
                    *index,
                    spec.map_or(0, |s| s.core_count),
                )?;
                self.link(cdir.join("subsystem"), "class/neuron_device")?;
                self.link(format!("class/neuron_device/neuron{index}"), &cdir)?;
                self.char_dev(&format!("neuron{index}"), NEURON_MAJOR, *index)?;
            }
            Some(DeviceKind::Ena { ifname }) => {
                let ndir = dir.join("net").join(ifname);
                self.write(
                    ndir.join("address"),
                    &format!("02:00:00:00:{:02x}:{:02x}\n", p.bdf.bus, p.bdf.device),
                )?;
                self.write(ndir.join("operstate"), "up\n")?;
                self.write(ndir.join("mtu"), "9001\n")?;
                self.link(format!("class/net/{ifname}"), &ndir)?;
            }
            Some(DeviceKind::Nvme { .. }) | None => {}
        }
        Ok(())
    }

    /// Undoes [`Writer::bind`], as a driver unbind does.
    pub fn unbind(&self, p: &Placed) -> Result<(), FixtureError> {
        let dir = self.sys.join("devices").join(&p.rel);
        let drv = p.driver();
        remove_if_exists(&dir.join("driver"))?;
        remove_if_exists(&self.sys.join(format!("bus/pci/drivers/{drv}/{}", p.bdf)))?;
        match &p.kind {
            Some(DeviceKind::Efa { .. }) => {
                let n = p.uverbs.unwrap_or(0);
                let ib = p.bdf.rdma_name();
                remove_if_exists(&self.sys.join(format!("class/infiniband/{ib}")))?;
                remove_if_exists(&self.sys.join(format!("class/infiniband_verbs/uverbs{n}")))?;
                remove_tree(&dir.join("infiniband"))?;
                remove_tree(&dir.join("infiniband_verbs"))?;
                remove_if_exists(&self.dev.join(format!("infiniband/uverbs{n}")))?;
            }
            Some(DeviceKind::NvidiaGpu { index, .. }) => {
                remove_if_exists(&self.dev.join(format!("nvidia{index}")))?;
            }
            Some(DeviceKind::Neuron { index }) => {
                remove_if_exists(&self.sys.join(format!("class/neuron_device/neuron{index}")))?;
                remove_tree(
                    &self
                        .sys
                        .join(format!("devices/virtual/neuron_device/neuron{index}")),
                )?;
                remove_if_exists(&self.dev.join(format!("neuron{index}")))?;
            }
            Some(DeviceKind::Ena { ifname }) => {
                remove_if_exists(&self.sys.join(format!("class/net/{ifname}")))?;
                remove_tree(&dir.join("net"))?;
            }
            Some(DeviceKind::Nvme { .. }) | None => {}
        }
        Ok(())
    }

    /// Removes the function entirely (hot-unplug): unbind, then the PCI core
    /// drops the device directory and its bus link.
    pub fn remove(&self, p: &Placed) -> Result<(), FixtureError> {
        self.unbind(p)?;
        remove_tree(&self.sys.join("devices").join(&p.rel))?;
        remove_if_exists(&self.sys.join(format!("bus/pci/devices/{}", p.bdf)))
    }
}

fn remove_if_exists(path: &Path) -> Result<(), FixtureError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FixtureError::Io {
            path: path.to_owned(),
            source: e,
        }),
    }
}

fn remove_tree(path: &Path) -> Result<(), FixtureError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FixtureError::Io {
            path: path.to_owned(),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_links() {
        assert_eq!(
            relative(
                Path::new("bus/pci/devices/0000:4f:00.0"),
                Path::new("devices/pci0000:44/x")
            ),
            PathBuf::from("../../../devices/pci0000:44/x")
        );
        assert_eq!(
            relative(
                Path::new("class/dmi/id"),
                Path::new("devices/virtual/dmi/id")
            ),
            PathBuf::from("../../devices/virtual/dmi/id")
        );
    }
}
