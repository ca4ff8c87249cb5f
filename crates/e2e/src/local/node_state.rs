//! Reaching into a node's own state, as a fault on the host would: the
//! driver's checkpoint damaged, a pod's container killed (kubelet restarts
//! it). [`TestbedOp::NodeState`](crate::testbed::TestbedOp::NodeState).

use std::process::Command;

use super::LocalTestbed;
use crate::testbed::DriverKind;
use local_cluster::error::{Error, Result};

impl LocalTestbed {
    /// Cuts the driver's checkpoint on `node` to half its length.
    pub(super) fn truncate_checkpoint(&self, node: &str, kind: DriverKind) -> Result<()> {
        let path = self.with_slot(node, kind, |n, _| {
            n.plugins_dir
                .join(kind.driver_name())
                .join("checkpoint.json")
        })?;
        let failed = |e: std::io::Error| Error::Testbed(format!("{}: {e}", path.display()));
        let bytes = std::fs::read(&path).map_err(failed)?;
        std::fs::write(&path, &bytes[..bytes.len() / 2]).map_err(failed)
    }

    /// SIGKILLs the container `container_id` (`containerd://<id>` as a pod's
    /// status has it, or the bare id) through the node's containerd.
    pub(super) async fn kill_node_container(&self, node: &str, container_id: &str) -> Result<()> {
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        let (ctr, socket) = {
            let cluster = self.cluster.lock().await;
            let n = cluster
                .node(node)
                .ok_or_else(|| Error::Testbed(format!("no node {node}")))?;
            (cluster.binaries().ctr.clone(), n.containerd_socket.clone())
        };
        let out = Command::new(&ctr)
            .arg("--address")
            .arg(&socket)
            .args([
                "--namespace",
                "k8s.io",
                "tasks",
                "kill",
                "--signal",
                "SIGKILL",
                id,
            ])
            .output()
            .map_err(|e| Error::Testbed(format!("{}: {e}", ctr.display())))?;
        if !out.status.success() {
            return Err(Error::Testbed(format!(
                "ctr tasks kill {id} on {node}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}
