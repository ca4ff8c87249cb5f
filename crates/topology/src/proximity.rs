//! How close two PCI functions are, in the terms of `nvidia-smi topo -m`.
//!
//! The relation is read from the bridge chains alone (plus NUMA for
//! functions on different root complexes), so it is cheap and needs no
//! vendor tool. Limits: it does not know about NVLink or Neuron's chip-to-chip
//! links, and it treats an unknown NUMA node as "across NUMA" (the
//! conservative answer for placement).

use std::fmt;

use crate::pci::PciDevice;

/// Distance classes, closest first (the derived `Ord` sorts that way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proximity {
    /// The same function (`X`).
    SameDevice,
    /// Below one PCIe switch: the path crosses at most one switch (`PIX`).
    SameSwitch,
    /// Below the same root port through several switches, without the host
    /// bridge (`PXB`).
    MultipleSwitches,
    /// Same root complex, the path goes through the host bridge (`PHB`).
    SameRootComplex,
    /// Different root complexes on the same NUMA node (`NODE`).
    SameNumaNode,
    /// Different NUMA nodes, or a NUMA node is unknown (`SYS`).
    CrossNuma,
}

impl Proximity {
    /// The `nvidia-smi topo -m` label.
    pub fn label(self) -> &'static str {
        match self {
            Proximity::SameDevice => "X",
            Proximity::SameSwitch => "PIX",
            Proximity::MultipleSwitches => "PXB",
            Proximity::SameRootComplex => "PHB",
            Proximity::SameNumaNode => "NODE",
            Proximity::CrossNuma => "SYS",
        }
    }

    /// Whether the two functions share a PCIe switch (`PIX` or `PXB`), the
    /// relation AWS's device pairing is defined on.
    pub fn shares_switch(self) -> bool {
        matches!(self, Proximity::SameSwitch | Proximity::MultipleSwitches)
    }
}

impl fmt::Display for Proximity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The proximity of `a` and `b`.
pub fn proximity(a: &PciDevice, b: &PciDevice) -> Proximity {
    if a.address == b.address {
        return Proximity::SameDevice;
    }
    if a.pcie_root != b.pcie_root {
        return match (a.numa_node, b.numa_node) {
            (Some(x), Some(y)) if x == y => Proximity::SameNumaNode,
            _ => Proximity::CrossNuma,
        };
    }
    let common = a
        .bridges
        .iter()
        .zip(&b.bridges)
        .take_while(|(x, y)| x == y)
        .count();
    if common == 0 {
        // They meet only at the host bridge (or sit on the root bus itself).
        return Proximity::SameRootComplex;
    }
    // Below the deepest shared bridge each side may cross one downstream
    // port of that switch; any more bridges mean another switch on the way.
    let below_a = a.bridges.len() - common;
    let below_b = b.bridges.len() - common;
    if below_a <= 1 && below_b <= 1 {
        Proximity::SameSwitch
    } else {
        Proximity::MultipleSwitches
    }
}

/// `candidates` with their proximity to `from`, closest first (ties by PCI
/// address, so the order is stable).
pub fn rank_by_proximity<'a>(
    from: &PciDevice,
    candidates: impl IntoIterator<Item = &'a PciDevice>,
) -> Vec<(Proximity, &'a PciDevice)> {
    let mut ranked: Vec<_> = candidates
        .into_iter()
        .map(|c| (proximity(from, c), c))
        .collect();
    ranked.sort_by_key(|(p, c)| (*p, c.address));
    ranked
}

/// Every candidate at the closest proximity found, by PCI address. Empty
/// when there are no candidates. More than one entry means sysfs cannot tell
/// them apart (e.g. several EFAs flat on one root bus, as on trn1).
pub fn nearest<'a>(
    from: &PciDevice,
    candidates: impl IntoIterator<Item = &'a PciDevice>,
) -> (Option<Proximity>, Vec<&'a PciDevice>) {
    let ranked = rank_by_proximity(from, candidates);
    let Some(best) = ranked.first().map(|(p, _)| *p) else {
        return (None, Vec::new());
    };
    let set = ranked
        .into_iter()
        .take_while(|(p, _)| *p == best)
        .map(|(_, c)| c)
        .collect();
    (Some(best), set)
}

/// The single nearest candidate, or `None` when there is none or when
/// several are equally near (ambiguity is not resolved by guessing).
pub fn nearest_unique<'a>(
    from: &PciDevice,
    candidates: impl IntoIterator<Item = &'a PciDevice>,
) -> Option<(Proximity, &'a PciDevice)> {
    let (best, set) = nearest(from, candidates);
    match (best, set.as_slice()) {
        (Some(p), [only]) => Some((p, *only)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::{PciAddress, PcieRoot};
    use std::path::PathBuf;

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    fn dev(a: &str, root: u8, numa: Option<u32>, bridges: &[&str]) -> PciDevice {
        PciDevice {
            address: addr(a),
            sysfs_path: PathBuf::new(),
            vendor: 0x1d0f,
            device: 0xefa1,
            class: 0x020000,
            subsystem_vendor: None,
            subsystem_device: None,
            driver: None,
            numa_node: numa,
            local_cpulist: None,
            link_speed: None,
            link_width: None,
            bridges: bridges.iter().map(|b| addr(b)).collect(),
            pcie_root: PcieRoot::new(0, root),
        }
    }

    #[test]
    fn relation_table() {
        let rp = "0000:44:01.0";
        let usp = "0000:45:00.0";
        let a = dev("0000:4f:00.0", 0x44, Some(0), &[rp, usp, "0000:46:00.0"]);
        let cases = [
            (
                dev("0000:4f:00.0", 0x44, Some(0), &[rp, usp, "0000:46:00.0"]),
                Proximity::SameDevice,
            ),
            (
                dev("0000:53:00.0", 0x44, Some(0), &[rp, usp, "0000:46:04.0"]),
                Proximity::SameSwitch,
            ),
            (
                dev(
                    "0000:60:00.0",
                    0x44,
                    Some(0),
                    &[rp, usp, "0000:46:05.0", "0000:5f:00.0", "0000:5f:01.0"],
                ),
                Proximity::MultipleSwitches,
            ),
            (
                dev("0000:44:05.0", 0x44, Some(0), &[]),
                Proximity::SameRootComplex,
            ),
            (
                dev("0000:70:00.0", 0x44, Some(0), &["0000:44:02.0"]),
                Proximity::SameRootComplex,
            ),
            (
                dev("0000:64:00.0", 0x55, Some(0), &["0000:55:01.0"]),
                Proximity::SameNumaNode,
            ),
            (
                dev("0000:a8:00.0", 0x99, Some(1), &["0000:99:01.0"]),
                Proximity::CrossNuma,
            ),
            (
                dev("0000:a8:00.0", 0x99, None, &["0000:99:01.0"]),
                Proximity::CrossNuma,
            ),
        ];
        for (b, want) in &cases {
            assert_eq!(proximity(&a, b), *want, "{}", b.address);
            assert_eq!(proximity(b, &a), *want, "symmetric {}", b.address);
        }
        let candidates: Vec<PciDevice> = cases.into_iter().skip(1).map(|(d, _)| d).collect();
        let (p, set) = nearest(&a, &candidates);
        assert_eq!(p, Some(Proximity::SameSwitch));
        assert_eq!(set.len(), 1);
        assert_eq!(
            nearest_unique(&a, &candidates).unwrap().1.address,
            addr("0000:53:00.0")
        );
        assert_eq!(Proximity::MultipleSwitches.label(), "PXB");
    }
}
