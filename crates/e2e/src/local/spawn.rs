//! Starting a driver as a host process on its node, as the chart's
//! DaemonSet would run it: the node's fixture tree, a token bound to the
//! driver's placeholder pod, its own ops port, the testbed's environment.
//! [`Testbed::start_driver`](crate::testbed::Testbed::start_driver) then
//! waits for the driver's pool; a driver started during an API server
//! outage ([`Testbed::spawn_driver`](crate::testbed::Testbed::spawn_driver))
//! cannot publish, so nothing is awaited here.

use std::process::Command;

use super::LocalTestbed;
use crate::testbed::{DriverKind, Testbed};
use local_cluster::error::{Error, Result};

impl LocalTestbed {
    /// Starts `kind` on `node` (it must not be running); returns how many
    /// devices its pool will hold.
    pub(super) async fn spawn_driver_process(&self, node: &str, kind: DriverKind) -> Result<usize> {
        if self.driver_running(node, kind) {
            return Err(Error::Testbed(format!(
                "{} already runs on {node}",
                kind.binary()
            )));
        }
        let (sys, dev, kubeconfig, port, expected) = self.with_slot(node, kind, |n, s| {
            (
                n.info.fixture.sys.clone(),
                n.info.fixture.dev.clone(),
                s.kubeconfig.clone(),
                s.metrics_port,
                kind.expected_devices_in(&n.info.fixture, &self.driver_env),
            )
        })?;
        let mut cmd = Command::new(self.bin_dir.join(kind.binary()));
        cmd.arg("run")
            .arg("--sysfs-root")
            .arg(&sys)
            .arg("--dev-root")
            .arg(&dev)
            .env("KUBECONFIG", &kubeconfig)
            .env("METRICS_ADDRESS", format!("127.0.0.1:{port}"))
            .env("LOG_FORMAT", "text")
            .env("LOG_LEVEL", "info,dra_core=debug")
            // Plain text in the log files.
            .env("NO_COLOR", "1")
            .envs(self.driver_env.iter().cloned())
            .env_remove("POD_UID");
        let process = {
            let cluster = self.cluster.lock().await;
            cluster.spawn_host_process(node, kind.binary(), cmd)?
        };
        let mut nodes = self.lock_nodes()?;
        if let Some(slot) = nodes
            .iter_mut()
            .find(|n| n.info.name == node)
            .and_then(|n| n.drivers.get_mut(&kind))
        {
            slot.process = Some(process);
        }
        Ok(expected)
    }
}
