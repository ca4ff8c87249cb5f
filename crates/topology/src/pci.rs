//! PCI functions as sysfs shows them: addresses, root complexes, and a
//! read-only view of one function with its place in the tree.
//!
//! A function's place is read by resolving `bus/pci/devices/<bdf>` into
//! `devices/pci<domain>:<bus>/<bridge>/.../<bdf>`: the first component is the
//! root complex (the `pcieRoot` standard attribute), the components between
//! it and the function are the bridges (root port, switch ports) in order.
//! Limits: bridge bus ranges and ACS are not read; a function whose resolved
//! path is not of that shape (e.g. behind a VMD domain with a 5-digit domain)
//! is reported as an error rather than guessed at.

use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use crate::address::{PciAddress, PciAddressError, PcieRoot};
use crate::error::{Error, Result};
use crate::sysfs::{
    SysfsRoot, link_name, list_dir, parse_attr, read_attr, read_hex_attr, read_hex_u16_attr,
    resolve_link,
};

/// A kernel CPU list such as `0-47,96-143` (`local_cpulist`, NUMA `cpulist`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList {
    ranges: Vec<RangeInclusive<u32>>,
}

impl CpuList {
    pub fn ranges(&self) -> &[RangeInclusive<u32>] {
        &self.ranges
    }
    pub fn contains(&self, cpu: u32) -> bool {
        self.ranges.iter().any(|r| r.contains(&cpu))
    }
    /// Every CPU in the list, ascending as written.
    pub fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().flat_map(|r| r.clone())
    }
    pub fn len(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| (r.end() - r.start()) as usize + 1)
            .sum()
    }
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl FromStr for CpuList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let mut ranges = Vec::new();
        if s.is_empty() {
            return Ok(CpuList { ranges });
        }
        for part in s.split(',') {
            let num = |t: &str| {
                t.parse::<u32>()
                    .map_err(|_| format!("{t:?} is not a CPU number"))
            };
            let range = match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("range {part:?} is reversed"));
                    }
                    a..=b
                }
                None => {
                    let a = num(part)?;
                    a..=a
                }
            };
            ranges.push(range);
        }
        Ok(CpuList { ranges })
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.start() == r.end() {
                write!(f, "{}", r.start())?;
            } else {
                write!(f, "{}-{}", r.start(), r.end())?;
            }
        }
        Ok(())
    }
}

/// One PCI function, read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    pub address: PciAddress,
    /// Canonical path of the function's directory under `<root>/devices`.
    pub sysfs_path: PathBuf,
    pub vendor: u16,
    pub device: u16,
    /// The 24-bit class code (`0x020000` = Ethernet controller).
    pub class: u32,
    pub subsystem_vendor: Option<u16>,
    pub subsystem_device: Option<u16>,
    /// Name of the bound kernel driver (`efa`, `neuron`, `nvidia`), if any.
    pub driver: Option<String>,
    /// NUMA node; `None` where sysfs says `-1` or has no `numa_node`.
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<CpuList>,
    /// `current_link_speed` as written (e.g. `32.0 GT/s PCIe`).
    pub link_speed: Option<String>,
    /// `current_link_width` (lanes).
    pub link_width: Option<u32>,
    /// Bridges from the root port down to (not including) this function.
    pub bridges: Vec<PciAddress>,
    pub pcie_root: PcieRoot,
}

/// PCI class code of a PCI-to-PCI bridge (root ports, switch ports).
pub const CLASS_PCI_BRIDGE: u32 = 0x06_04_00;

impl PciDevice {
    /// Reads function `address` below `root`.
    pub fn read(root: &SysfsRoot, address: PciAddress) -> Result<PciDevice> {
        let link = root.pci_devices_dir().join(address.to_string());
        let Some(path) = resolve_link(&link)? else {
            return Err(Error::DeviceVanished {
                address,
                path: link,
            });
        };
        let (pcie_root, bridges) = place_in_tree(root, &link, &path, address)?;

        // A function that disappears between resolving its link and reading
        // its attributes is a vanished device, not a missing attribute.
        let required_hex = |name: &str| -> Result<u32> {
            let p = path.join(name);
            match read_hex_attr(&p)? {
                Some(v) => Ok(v),
                None if !path.exists() => Err(Error::DeviceVanished {
                    address,
                    path: path.clone(),
                }),
                None => Err(Error::MissingAttribute { path: p }),
            }
        };
        let vendor = required_hex("vendor")?;
        let device = required_hex("device")?;
        let class = required_hex("class")?;
        let id16 = |v: u32, name: &str| {
            u16::try_from(v).map_err(|_| {
                Error::parse(path.join(name), format!("{v:#x}"), "does not fit 16 bits")
            })
        };
        let vendor = id16(vendor, "vendor")?;
        let device = id16(device, "device")?;

        let numa_path = path.join("numa_node");
        let numa_node = match parse_attr::<i64>(&numa_path)? {
            None | Some(-1) => None,
            Some(n) => Some(u32::try_from(n).map_err(|_| {
                Error::parse(&numa_path, n.to_string(), "NUMA node must be -1 or >= 0")
            })?),
        };

        let dev = PciDevice {
            address,
            vendor,
            device,
            class,
            subsystem_vendor: read_hex_u16_attr(path.join("subsystem_vendor"))?,
            subsystem_device: read_hex_u16_attr(path.join("subsystem_device"))?,
            driver: link_name(path.join("driver"))?,
            numa_node,
            local_cpulist: parse_attr(path.join("local_cpulist"))?,
            link_speed: read_attr(path.join("current_link_speed"))?,
            link_width: parse_attr(path.join("current_link_width"))?,
            bridges,
            pcie_root,
            sysfs_path: path,
        };
        Ok(dev)
    }

    /// Whether this function is a PCI-to-PCI bridge.
    pub fn is_bridge(&self) -> bool {
        self.class >> 8 == CLASS_PCI_BRIDGE >> 8
    }
}

/// Splits `path` (canonical, below `<root>/devices`) into root complex and
/// bridge chain, checking that the last component is `address` itself.
fn place_in_tree(
    root: &SysfsRoot,
    link: &Path,
    path: &Path,
    address: PciAddress,
) -> Result<(PcieRoot, Vec<PciAddress>)> {
    let devices = root.devices_dir();
    // Canonicalize the root too: it may itself sit behind a symlink (/tmp on
    // some systems), and the resolved device path is canonical.
    let devices = std::fs::canonicalize(&devices).map_err(|e| Error::io(&devices, e))?;
    let unexpected = || Error::UnexpectedLinkTarget {
        path: link.to_owned(),
        target: path.to_owned(),
        expected: devices.clone(),
    };
    let rel = path.strip_prefix(&devices).map_err(|_| unexpected())?;
    let mut parts: Vec<&str> = Vec::new();
    for c in rel.components() {
        parts.push(c.as_os_str().to_str().ok_or_else(unexpected)?);
    }
    let (first, rest) = parts.split_first().ok_or_else(unexpected)?;
    let pcie_root: PcieRoot = first.parse().map_err(|source| Error::PciAddress {
        path: path.to_owned(),
        source,
    })?;
    let (last, bridges) = rest.split_last().ok_or_else(unexpected)?;
    let parse = |s: &str| {
        s.parse::<PciAddress>().map_err(|source| Error::PciAddress {
            path: path.to_owned(),
            source,
        })
    };
    if parse(last)? != address {
        return Err(unexpected());
    }
    let bridges = bridges
        .iter()
        .map(|b| parse(b))
        .collect::<Result<Vec<_>>>()?;
    Ok((pcie_root, bridges))
}

/// A function that could not be read during a scan.
#[derive(Debug)]
pub struct ScanError {
    /// The `bus/pci/devices` entry name (not necessarily a valid address).
    pub entry: String,
    pub error: Error,
}

/// The result of reading every PCI function: what could be read, and one
/// error per function that could not. A broken function never hides the
/// others.
#[derive(Debug, Default)]
pub struct PciScan {
    pub devices: Vec<PciDevice>,
    pub errors: Vec<ScanError>,
}

impl PciScan {
    pub fn get(&self, address: PciAddress) -> Option<&PciDevice> {
        self.devices.iter().find(|d| d.address == address)
    }
}

/// Lists the addresses in `bus/pci/devices`, sorted. Entries that are not
/// addresses come back as errors alongside.
pub fn list_pci_addresses(root: &SysfsRoot) -> Result<(Vec<PciAddress>, Vec<ScanError>)> {
    let dir = root.pci_devices_dir();
    let names = list_dir(&dir)?.ok_or_else(|| {
        Error::io(
            &dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no PCI bus in this sysfs"),
        )
    })?;
    let mut addrs = Vec::new();
    let mut errors = Vec::new();
    for name in names {
        match name.parse::<PciAddress>() {
            Ok(a) => addrs.push(a),
            Err(source) => errors.push(ScanError {
                error: Error::PciAddress {
                    path: dir.join(&name),
                    source,
                },
                entry: name,
            }),
        }
    }
    addrs.sort();
    Ok((addrs, errors))
}

/// Reads every PCI function. Fails only when `bus/pci/devices` itself cannot
/// be listed; per-function problems land in [`PciScan::errors`].
pub fn scan(root: &SysfsRoot) -> Result<PciScan> {
    let (addrs, mut errors) = list_pci_addresses(root)?;
    let mut devices = Vec::with_capacity(addrs.len());
    for address in addrs {
        match PciDevice::read(root, address) {
            Ok(d) => devices.push(d),
            Err(error) => errors.push(ScanError {
                entry: address.to_string(),
                error,
            }),
        }
    }
    Ok(PciScan { devices, errors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn addresses_table() {
        let ok = [
            ("0000:00:00.0", (0, 0, 0, 0)),
            ("0000:4f:00.0", (0, 0x4f, 0, 0)),
            ("ffff:ff:1f.7", (0xffff, 0xff, 0x1f, 7)),
        ];
        for (s, (d, b, dev, f)) in ok {
            let a: PciAddress = s.parse().unwrap();
            assert_eq!(
                (a.domain(), a.bus(), a.device(), a.function()),
                (d, b, dev, f)
            );
            assert_eq!(a.to_string(), s);
        }
        let bad = [
            "",
            "0000:4F:00.0",
            "000:4f:00.0",
            "0000:4f:00",
            "0000:4f:20.0",
            "0000:4f:00.8",
            "0000-4f-00.0",
            "00000:4f:00.0",
            " 0000:4f:00.0",
            "0000:4f:00.0\n",
            "+000:4f:00.0",
            "0000:4f:0.00",
        ];
        for s in bad {
            let e = s.parse::<PciAddress>().unwrap_err();
            assert_eq!(e.input, s);
            assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
        }
    }

    #[test]
    fn roots_and_cpulists() {
        let r: PcieRoot = "pci0000:10".parse().unwrap();
        assert_eq!(r, PcieRoot::new(0, 0x10));
        assert_eq!(r.to_string(), "pci0000:10");
        for bad in [
            "pci0000",
            "0000:10",
            "pci10000:00",
            "pciXXXX:10",
            "platform",
        ] {
            assert!(bad.parse::<PcieRoot>().is_err(), "{bad}");
        }
        let c: CpuList = "0-47,96-143".parse().unwrap();
        assert_eq!(c.len(), 96);
        assert!(c.contains(100) && !c.contains(50));
        assert_eq!(c.to_string(), "0-47,96-143");
        assert_eq!(
            "5".parse::<CpuList>().unwrap().cpus().collect::<Vec<_>>(),
            [5]
        );
        assert!("".parse::<CpuList>().unwrap().is_empty());
        for bad in ["a-b", "3-1", "1,,2", "1-"] {
            assert!(bad.parse::<CpuList>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn address_round_trip(d in any::<u16>(), b in any::<u8>(), dev in 0u8..=0x1f, f in 0u8..=7) {
            let a = PciAddress::new(d, b, dev, f).unwrap();
            let s = a.to_string();
            prop_assert_eq!(s.parse::<PciAddress>().unwrap(), a);
            prop_assert_eq!(s.len(), 12);
        }

        #[test]
        fn address_parse_never_panics(s in "\\PC{0,20}") {
            let _ = s.parse::<PciAddress>();
            let _ = s.parse::<PcieRoot>();
            let _ = s.parse::<CpuList>();
        }

        #[test]
        fn near_addresses_never_panic(s in "[0-9a-fA-F:.x ]{0,14}") {
            if let Ok(a) = s.parse::<PciAddress>() {
                prop_assert_eq!(a.to_string(), s);
            }
        }
    }
}
