//! Kernel uevent datagrams (`ACTION@DEVPATH\0KEY=VALUE\0...`) as read from
//! the netlink socket: any bytes parse to an event or to `None`, never a
//! panic, and a parsed event has the shape the watcher relies on.
#![no_main]

use dra_core::fuzzing::Uevent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(event) = Uevent::parse(data) {
        assert!(!event.action.is_empty());
        assert!(event.devpath.starts_with('/'));
        let _ = event.in_subsystems(&["pci", "infiniband"]);
    }
});
