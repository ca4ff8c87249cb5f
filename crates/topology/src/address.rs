//! PCI addresses as plain values: a function's `DDDD:BB:DD.F` and a root
//! complex's `pciDDDD:BB`, parsed and printed byte for byte as sysfs and the
//! standard attributes write them.
//!
//! Apart from [`crate::pci`] because these values read nothing: the crate's
//! [`crate::Error`] carries them, and `pci` (which reads sysfs and returns
//! that error) builds on them, so keeping them in `pci` made `error`, `pci`
//! and `sysfs` import each other in a circle. `pci` re-exports them; their
//! tests stay there, beside the scanning code that uses them.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PCI address {input:?}: {reason} (expected DDDD:BB:DD.F, lowercase hex)")]
pub struct PciAddressError {
    pub input: String,
    pub reason: &'static str,
}

/// A PCI function address, `DDDD:BB:DD.F` (domain, bus, device, function).
///
/// Parsing accepts exactly the extended form sysfs uses, in lowercase;
/// display gives it back byte for byte, so the string form is also the
/// `resource.kubernetes.io/pciBusID` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    domain: u16,
    bus: u8,
    device: u8,
    function: u8,
}

impl PciAddress {
    /// `None` when `device` > 0x1f or `function` > 7.
    pub const fn new(domain: u16, bus: u8, device: u8, function: u8) -> Option<Self> {
        if device > 0x1f || function > 7 {
            return None;
        }
        Some(PciAddress {
            domain,
            bus,
            device,
            function,
        })
    }

    pub const fn domain(&self) -> u16 {
        self.domain
    }
    pub const fn bus(&self) -> u8 {
        self.bus
    }
    pub const fn device(&self) -> u8 {
        self.device
    }
    pub const fn function(&self) -> u8 {
        self.function
    }
}

fn hex_field(s: &str, len: usize) -> Option<u32> {
    if s.len() != len
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(input: &str) -> Result<Self, PciAddressError> {
        let err = |reason| PciAddressError {
            input: input.to_owned(),
            reason,
        };
        let (domain, rest) = input.split_once(':').ok_or_else(|| err("no ':'"))?;
        let (bus, rest) = rest.split_once(':').ok_or_else(|| err("no second ':'"))?;
        let (device, function) = rest.split_once('.').ok_or_else(|| err("no '.'"))?;
        let domain = hex_field(domain, 4).ok_or_else(|| err("domain is not 4 hex digits"))?;
        let bus = hex_field(bus, 2).ok_or_else(|| err("bus is not 2 hex digits"))?;
        let device = hex_field(device, 2).ok_or_else(|| err("device is not 2 hex digits"))?;
        let function = hex_field(function, 1).ok_or_else(|| err("function is not 1 digit"))?;
        // The field widths above bound every value; the casts cannot truncate.
        PciAddress::new(domain as u16, bus as u8, device as u8, function as u8)
            .ok_or_else(|| err("device > 1f or function > 7"))
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// A PCI root complex as the `resource.kubernetes.io/pcieRoot` attribute
/// names it: `pci<domain>:<bus>`, e.g. `pci0000:10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PcieRoot {
    domain: u16,
    bus: u8,
}

impl PcieRoot {
    pub const fn new(domain: u16, bus: u8) -> Self {
        PcieRoot { domain, bus }
    }
    pub const fn domain(&self) -> u16 {
        self.domain
    }
    pub const fn bus(&self) -> u8 {
        self.bus
    }
}

impl FromStr for PcieRoot {
    type Err = PciAddressError;

    fn from_str(input: &str) -> Result<Self, PciAddressError> {
        let err = |reason| PciAddressError {
            input: input.to_owned(),
            reason,
        };
        let rest = input
            .strip_prefix("pci")
            .ok_or_else(|| err("root complex name does not start with 'pci'"))?;
        let (domain, bus) = rest.split_once(':').ok_or_else(|| err("no ':'"))?;
        let domain = hex_field(domain, 4).ok_or_else(|| err("domain is not 4 hex digits"))?;
        let bus = hex_field(bus, 2).ok_or_else(|| err("bus is not 2 hex digits"))?;
        Ok(PcieRoot::new(domain as u16, bus as u8))
    }
}

impl fmt::Display for PcieRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}
