//! What an allocated EFA's entry in its claim's `status.devices` carries:
//! `data` for the workload and the operator, and `networkData` when the EFA's
//! PCI function has a network interface.
//!
//! `data` (every key present unless said otherwise):
//! - `rdmaDevice`: the RDMA device name, e.g. `rdmap79s0` (what libfabric
//!   and `EFA_RDMA_DEVICES` name);
//! - `uverbsDevice`: the verbs device node in the container,
//!   `/dev/infiniband/uverbsN`;
//! - `pciBusID`, `pcieRoot`: as the published attributes say them;
//! - `numaNode`: an integer, left out when sysfs says `-1`;
//! - `portState`: port 1's state as the kernel names it (`ACTIVE`, `DOWN`,
//!   `INIT`, ...), left out when unreadable.
//!
//! `networkData`: the interface below the EFA's PCI function (`net/<name>`),
//! with its MAC address. An EFA-only interface has none (its traffic never
//! goes through a netdev), so its entry has no `networkData`.
//!
//! Read from sysfs when the status is written, after prepare: one PCI
//! function per device, the same reads as prepare. A device that can no
//! longer be read gets no data (its entry still has its condition).

use std::path::Path;

use dra_core::{AllocatedDevice, DeviceStatus, NetworkData};
use serde_json::{Map, Value, json};
use topology::SysfsRoot;
use topology::sysfs::{list_dir, read_attr};

use crate::attributes::parse_device_name;
use crate::config::EfaConfig;
use crate::discovery::{self, Efa};
use crate::prepare::CONTAINER_INFINIBAND_DIR;

/// The status of each allocated EFA that can be read.
pub(crate) fn device_status(
    sysfs: &SysfsRoot,
    devices: &[AllocatedDevice<EfaConfig>],
) -> Vec<DeviceStatus> {
    devices
        .iter()
        .filter_map(|d| {
            let Some(address) = parse_device_name(&d.device) else {
                tracing::debug!(device = %d.device, "no EFA status data: not an EFA device name");
                return None;
            };
            let efa = discovery::read_one(sysfs, address)
                .inspect_err(|error| {
                    tracing::debug!(device = %d.device, %error, "no EFA status data: the EFA cannot be read")
                })
                .ok()?;
            Some(status_of(sysfs, &d.device, &efa))
        })
        .collect()
}

fn status_of(sysfs: &SysfsRoot, device: &str, efa: &Efa) -> DeviceStatus {
    let function = sysfs.pci_devices_dir().join(efa.address.to_string());
    let mut data = Map::new();
    data.insert("rdmaDevice".into(), json!(efa.rdma_device));
    data.insert(
        "uverbsDevice".into(),
        json!(format!("{CONTAINER_INFINIBAND_DIR}/{}", efa.uverbs_name())),
    );
    data.insert("pciBusID".into(), json!(efa.address.to_string()));
    data.insert("pcieRoot".into(), json!(efa.pcie_root.to_string()));
    if let Some(numa) = efa.numa_node {
        data.insert("numaNode".into(), Value::from(numa));
    }
    let port = function
        .join("infiniband")
        .join(&efa.rdma_device)
        .join("ports/1/state");
    if let Some(state) = port_state(&port) {
        data.insert("portState".into(), json!(state));
    }
    DeviceStatus {
        device: device.to_owned(),
        data,
        network: network_data(&function),
    }
}

/// `4: ACTIVE` → `ACTIVE`.
fn port_state(path: &Path) -> Option<String> {
    let raw = read_attr(path).ok().flatten()?;
    let name = raw.split_once(':').map_or(raw.as_str(), |(_, n)| n).trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// The first interface below the PCI function, with its MAC address.
fn network_data(function: &Path) -> Option<NetworkData> {
    let net = function.join("net");
    let name = list_dir(&net).ok().flatten()?.into_iter().min()?;
    let address = read_attr(net.join(&name).join("address"))
        .ok()
        .flatten()
        .unwrap_or_default();
    Some(NetworkData {
        interface_name: name,
        hardware_address: address,
        ips: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocated(device: &str) -> AllocatedDevice<EfaConfig> {
        AllocatedDevice {
            request: "efa".into(),
            pool: "node".into(),
            device: device.into(),
            admin_access: false,
            config: None,
        }
    }

    #[test]
    fn data_names_the_rdma_device_its_node_and_placement() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let sysfs = SysfsRoot::new(&fixture.sys);
        let found = discovery::discover(&sysfs).unwrap();
        let efa = &found.efas[0];
        let name = crate::attributes::device_name(efa.address);
        let status = device_status(&sysfs, &[allocated(&name), allocated("efa-ffff-ff-1f-7")]);
        assert_eq!(status.len(), 1, "a device that is not there has no data");
        let s = &status[0];
        assert_eq!(s.device, name);
        assert_eq!(s.data["rdmaDevice"], json!(efa.rdma_device));
        assert_eq!(
            s.data["uverbsDevice"],
            json!(format!("/dev/infiniband/uverbs{}", efa.uverbs))
        );
        assert_eq!(s.data["pciBusID"], json!(efa.address.to_string()));
        assert_eq!(s.data["pcieRoot"], json!(efa.pcie_root.to_string()));
        assert_eq!(s.data["portState"], json!("ACTIVE"));
        assert_eq!(
            s.data.get("numaNode").map(Value::is_u64),
            efa.numa_node.map(|_| true)
        );
        assert_eq!(s.network, None, "an EFA-only function has no interface");

        // The same function with an interface below it.
        let net = sysfs
            .pci_devices_dir()
            .join(efa.address.to_string())
            .join("net/eth3");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::write(net.join("address"), "0a:1b:2c:3d:4e:5f\n").unwrap();
        let status = device_status(&sysfs, &[allocated(&name)]);
        assert_eq!(
            status[0].network,
            Some(NetworkData {
                interface_name: "eth3".into(),
                hardware_address: "0a:1b:2c:3d:4e:5f".into(),
                ips: vec![],
            })
        );
    }

    #[test]
    fn port_state_is_the_kernel_name() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("4: ACTIVE\n", Some("ACTIVE")),
            ("1: DOWN", Some("DOWN")),
            ("", None),
        ];
        for (raw, want) in cases {
            let path = dir.path().join("state");
            std::fs::write(&path, raw).unwrap();
            assert_eq!(port_state(&path).as_deref(), want, "{raw:?}");
        }
        assert_eq!(port_state(&dir.path().join("missing")), None);
    }
}
