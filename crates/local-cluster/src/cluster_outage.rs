//! Stopping and starting again a kubelet or a control-plane process of a
//! [`LocalCluster`] in place, for `cargo xtask chaos` (kubelet restarts,
//! API server and etcd outages, a simulated node reboot).
//!
//! A stopped process is remembered as its command line and environment
//! (read from `/proc` while it ran), so that it comes back exactly as it was
//! started, with the same data directories.

use std::process::Command;
use std::time::Duration;

use crate::cgroups;
use crate::cluster::LocalCluster;
use crate::error::{Error, Result};
use crate::kubelet_socket;
use crate::process::{ManagedProcess, proc_strings};

/// A process stopped by [`LocalCluster::stop_kubelet`] or
/// [`LocalCluster::stop_control_plane`], ready to be started again.
#[derive(Debug, Clone)]
pub struct Stopped {
    /// `kubelet` or the control-plane name (`kube-apiserver`, `etcd`).
    pub name: String,
    /// The node of a kubelet.
    pub node: Option<String>,
    args: Vec<String>,
    env: Vec<String>,
    log: std::path::PathBuf,
}

impl Stopped {
    fn command(&self) -> Result<Command> {
        let (program, rest) = self
            .args
            .split_first()
            .ok_or_else(|| Error::Host(format!("{} had an empty command line", self.name)))?;
        let mut command = Command::new(program);
        command.args(rest).env_clear();
        for pair in &self.env {
            if let Some((k, v)) = pair.split_once('=') {
                command.env(k, v);
            }
        }
        Ok(command)
    }
}

impl LocalCluster {
    fn node_index(&self, node: &str) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == node)
            .ok_or_else(|| Error::Host(format!("no node named {node}")))
    }

    /// The pid of the kubelet of `node`, while it runs.
    pub fn kubelet_pid(&self, node: &str) -> Option<i32> {
        let index = self.node_index(node).ok()?;
        let guard = self.inner.processes.lock().ok()?;
        guard.nodes.get(index)?.kubelet_pid()
    }

    /// Stops the kubelet of `node` with `signal_grace` for SIGTERM (zero:
    /// SIGKILL at once). Its containers keep running in containerd.
    pub fn stop_kubelet(&self, node: &str, signal_grace: Duration) -> Result<Stopped> {
        let index = self.node_index(node)?;
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        let procs = guard
            .nodes
            .get_mut(index)
            .ok_or_else(|| Error::Host(format!("no processes for node {node}")))?;
        let mut kubelet = procs
            .take_kubelet()
            .ok_or_else(|| Error::Host(format!("the kubelet of {node} is not running")))?;
        let pid = kubelet.pid();
        let stopped = Stopped {
            name: "kubelet".into(),
            node: Some(node.to_string()),
            args: proc_strings(pid, "cmdline")?,
            env: proc_strings(pid, "environ")?,
            log: kubelet.log().to_path_buf(),
        };
        kubelet.terminate(signal_grace);
        Ok(stopped)
    }

    /// Starts a stopped kubelet again (the caller waits for what it needs),
    /// in its turn at the host's device-plugin socket (`kubelet_socket`).
    pub async fn start_kubelet(&self, stopped: &Stopped) -> Result<i32> {
        let node = stopped
            .node
            .as_deref()
            .ok_or_else(|| Error::Host(format!("{} is not a kubelet", stopped.name)))?;
        let index = self.node_index(node)?;
        let process = kubelet_socket::spawn_kubelet(
            stopped.command()?,
            &stopped.log,
            &self.nodes[index].cgroup_root,
        )
        .await?;
        let pid = process.pid();
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        guard.started_pids.insert(pid);
        guard
            .nodes
            .get_mut(index)
            .ok_or_else(|| Error::Host(format!("no processes for node {node}")))?
            .set_kubelet(process);
        Ok(pid)
    }

    /// Stops the control-plane process `name` (SIGTERM, 10 s grace).
    pub fn stop_control_plane(&self, name: &str) -> Result<Stopped> {
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        let index = guard
            .control_plane
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| Error::Host(format!("no {name} process")))?;
        let pid = guard.control_plane[index].pid();
        let stopped = Stopped {
            name: name.to_string(),
            node: None,
            args: proc_strings(pid, "cmdline")?,
            env: proc_strings(pid, "environ")?,
            log: guard.control_plane[index].log().to_path_buf(),
        };
        let mut old = guard.control_plane.remove(index);
        drop(guard);
        old.terminate(Duration::from_secs(10));
        Ok(stopped)
    }

    /// Starts a stopped control-plane process again; returns its pid (the
    /// caller waits for readiness).
    pub fn start_control_plane(&self, stopped: &Stopped) -> Result<i32> {
        let process = ManagedProcess::spawn(&stopped.name, stopped.command()?, &stopped.log)?;
        let pid = process.pid();
        cgroups::track(&format!("{}/control-plane", self.inner.cgroup), pid)?;
        let mut guard = self
            .inner
            .processes
            .lock()
            .map_err(|_| Error::Host("process table poisoned".into()))?;
        guard.started_pids.insert(pid);
        guard.control_plane.push(process);
        Ok(pid)
    }
}
