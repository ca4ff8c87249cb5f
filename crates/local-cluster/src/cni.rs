//! The pod network of one node: a CNI config for its containerd, so that
//! the CRI reports the network ready and the kubelet reports the Node Ready
//! (without any CNI config, containerd says "cni plugin not initialized" and
//! every Node stays NotReady, although hostNetwork pods run).
//!
//! The config is the smallest the installed plugins (Debian's
//! containernetworking-plugins) allow: a Linux bridge of the node's own,
//! addresses from host-local IPAM in a subnet of the node's own, and portmap
//! for hostPorts where iptables is there to serve it. containerd adds the
//! loopback interface itself (the `loopback` plugin in the same directory).
//!
//! Several clusters run side by side on one host (CI's e2e legs), each with
//! several nodes, so bridge and subnet must differ between every node on the
//! host: both are derived from the node's kubelet port, which the port
//! reservations ([`crate::ports`]) keep unique on the host while the node
//! runs. Subnets are /25s of 100.64.0.0/10 (shared address space, routed
//! nowhere else): 32,768 of them, one per port below 32,768, which is where
//! reservations come from; a kernel-picked port above it (a host whose
//! ephemeral range leaves too few) wraps around. Limits: no masquerading and
//! no kube-proxy, so a pod off the host network reaches this host (the
//! bridge is its gateway) but not Services.

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::error::{Result, io};

/// The bridge and subnet of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodNetwork {
    /// The Linux bridge (at most 15 bytes, the kernel's limit).
    pub(crate) bridge: String,
    /// First address of the node's /25.
    pub(crate) subnet: Ipv4Addr,
}

/// Prefix length of each node's subnet.
const PREFIX: u8 = 25;
/// Where the subnets are carved from: 100.64.0.0/10.
const POOL: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 0);

impl PodNetwork {
    /// The network of the node whose kubelet listens on `kubelet_port`.
    pub(crate) fn for_kubelet_port(kubelet_port: u16) -> PodNetwork {
        let index = u32::from(kubelet_port) % (1 << (PREFIX - 10));
        PodNetwork {
            bridge: format!("ad-cni{kubelet_port}"),
            subnet: Ipv4Addr::from(u32::from(POOL) + (index << (32 - PREFIX))),
        }
    }

    fn address(&self, host: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet) + host)
    }

    /// The conflist containerd loads: bridge with host-local IPAM whose
    /// allocations live in `ipam_dir`, and portmap when `portmap` is true.
    pub(crate) fn conflist(&self, ipam_dir: &Path, portmap: bool) -> Value {
        let last = (1u32 << (32 - PREFIX)) - 2;
        let mut plugins = vec![json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{
                    "subnet": format!("{}/{PREFIX}", self.subnet),
                    "rangeStart": self.address(2).to_string(),
                    "rangeEnd": self.address(last).to_string(),
                    "gateway": self.address(1).to_string(),
                }]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        })];
        if portmap {
            plugins.push(json!({"type": "portmap", "capabilities": {"portMappings": true}}));
        }
        json!({
            "cniVersion": "1.0.0",
            "name": "aws-dra-local",
            "plugins": plugins,
        })
    }

    /// Writes the conflist into `conf_dir` (read by containerd at start and
    /// when it changes), with the plugins `bin_dir` has.
    pub(crate) fn write(&self, conf_dir: &Path, ipam_dir: &Path, bin_dir: &Path) -> Result<()> {
        let portmap = bin_dir.join("portmap").exists() && on_path("iptables");
        let config = self.conflist(ipam_dir, portmap);
        let path = conf_dir.join("10-aws-dra-local.conflist");
        let text = serde_json::to_string_pretty(&config).unwrap_or_default();
        fs::write(&path, text).map_err(io("writing", &path))
    }

    /// Removes the node's bridge (and with it the route to its subnet);
    /// best effort, for when the node's runtime has stopped.
    pub(crate) fn remove(&self) {
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|dir| dir.join(name).exists())
}

#[cfg(test)]
mod tests;
