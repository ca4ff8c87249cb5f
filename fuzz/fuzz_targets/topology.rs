//! The sysfs text parsers of `topology`: PCI addresses (device links,
//! uevent devpaths), PCIe root names, CPU lists (`local_cpulist`) and hex
//! ids (`vendor`, `device`). Never a panic; whatever parses prints back to
//! a string that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topology::pci::{CpuList, PciAddress, PcieRoot};
use topology::sysfs::parse_hex_id;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(address) = text.parse::<PciAddress>() {
        assert_eq!(address.to_string().parse::<PciAddress>(), Ok(address));
    }
    if let Ok(root) = text.parse::<PcieRoot>() {
        assert_eq!(root.to_string().parse::<PcieRoot>(), Ok(root));
    }
    if let Ok(cpus) = text.parse::<CpuList>() {
        let again: CpuList = cpus.to_string().parse().expect("printed CPU list parses");
        assert_eq!(again.ranges(), cpus.ranges());
        assert_eq!(again.len(), cpus.len());
    }
    let _ = parse_hex_id(text);
});
