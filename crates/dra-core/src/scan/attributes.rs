//! The standard device attributes (`k8s.io/dynamic-resource-allocation/deviceattribute`)
//! and the builders of attribute values, in one place for every driver.
//!
//! Pairing devices across drivers (a GPU with the EFA under the same PCIe
//! root, say) works only if every driver spells these names and types
//! exactly alike: CEL compares `"0"` and `0` differently. So the names are
//! written here once, and [`PciPlacement`] inserts all three of them.

use std::collections::BTreeMap;
use std::fmt::Display;

use k8s_openapi::api::resource::v1::DeviceAttribute;

/// Standard attribute: the PCI root complex, `pci<domain>:<bus>` (string).
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Standard attribute: the PCI address, `DDDD:BB:DD.F` (string).
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// Standard attribute: the NUMA node (int); omitted when unknown.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

/// A string attribute value.
pub fn string(value: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.into()),
        ..Default::default()
    }
}

/// An int attribute value.
pub fn int(value: impl Into<i64>) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value.into()),
        ..Default::default()
    }
}

/// A bool attribute value.
pub fn boolean(value: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(value),
        ..Default::default()
    }
}

/// A semantic-version attribute value (`1.2.3`).
pub fn version(value: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value.into()),
        ..Default::default()
    }
}

/// Where a PCI device sits, as the standard attributes say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPlacement {
    /// `DDDD:BB:DD.F`.
    pub bus_id: String,
    /// `pci<domain>:<bus>`, when the root complex is known.
    pub pcie_root: Option<String>,
    /// When the kernel knows it (sysfs `-1` is unknown: leave it `None`).
    pub numa_node: Option<i64>,
}

impl PciPlacement {
    /// From anything that prints as the standard spells it (topology's
    /// `PciAddress` and `PcieRoot` do).
    pub fn new(
        bus_id: impl Display,
        pcie_root: Option<impl Display>,
        numa_node: Option<impl Into<i64>>,
    ) -> Self {
        PciPlacement {
            bus_id: bus_id.to_string(),
            pcie_root: pcie_root.map(|r| r.to_string()),
            numa_node: numa_node.map(Into::into),
        }
    }

    /// Inserts `pciBusID`, and `pcieRoot` and `numaNode` when known.
    pub fn insert_into(&self, attributes: &mut BTreeMap<String, DeviceAttribute>) {
        attributes.insert(PCI_BUS_ID.to_owned(), string(&self.bus_id));
        if let Some(root) = &self.pcie_root {
            attributes.insert(PCIE_ROOT.to_owned(), string(root));
        }
        if let Some(numa) = self.numa_node {
            attributes.insert(NUMA_NODE.to_owned(), int(numa));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_writes_the_standard_names_and_types() {
        type Case = (PciPlacement, &'static [(&'static str, &'static str)]);
        let cases: Vec<Case> = vec![
            (
                PciPlacement::new("0000:4f:00.0", Some("pci0000:44"), Some(1u32)),
                &[
                    (PCI_BUS_ID, "s:0000:4f:00.0"),
                    (PCIE_ROOT, "s:pci0000:44"),
                    (NUMA_NODE, "i:1"),
                ],
            ),
            (
                PciPlacement::new("0000:10:1c.0", None::<&str>, None::<i64>),
                &[(PCI_BUS_ID, "s:0000:10:1c.0")],
            ),
            (
                PciPlacement::new("0000:10:1c.0", Some("pci0000:10"), None::<i64>),
                &[(PCI_BUS_ID, "s:0000:10:1c.0"), (PCIE_ROOT, "s:pci0000:10")],
            ),
        ];
        for (placement, want) in cases {
            let mut attrs = BTreeMap::new();
            placement.insert_into(&mut attrs);
            let got: BTreeMap<&str, String> = attrs
                .iter()
                .map(|(k, v)| {
                    let value = match (&v.string, v.int) {
                        (Some(s), None) => format!("s:{s}"),
                        (None, Some(i)) => format!("i:{i}"),
                        other => panic!("{k}: not exactly one of string/int: {other:?}"),
                    };
                    (k.as_str(), value)
                })
                .collect();
            let want: BTreeMap<&str, String> =
                want.iter().map(|(k, v)| (*k, v.to_string())).collect();
            assert_eq!(got, want, "{placement:?}");
        }
    }

    #[test]
    fn value_builders_set_one_field() {
        assert_eq!(string("a").string.as_deref(), Some("a"));
        assert_eq!(int(3u32).int, Some(3));
        assert_eq!(boolean(true).bool, Some(true));
        assert_eq!(version("0.1.0").version.as_deref(), Some("0.1.0"));
        assert_eq!(int(-1i64).string, None);
    }
}
