//! Restarting a control-plane process of a [`LocalCluster`] in place, for the
//! fleet simulation's re-list storm (`cargo xtask bench fleet`).

use std::process::Command;
use std::time::Duration;

use crate::cgroups;
use crate::cluster::LocalCluster;
use crate::error::{Error, Result};
use crate::process::{ManagedProcess, proc_strings};

impl LocalCluster {
    /// The pid of the running control-plane process `name` (`kube-apiserver`).
    pub fn control_plane_pid(&self, name: &str) -> Option<i32> {
        let guard = self.inner.processes.lock().ok()?;
        guard
            .control_plane
            .iter()
            .find(|p| p.name() == name)
            .map(ManagedProcess::pid)
    }

    /// Stops kube-apiserver (SIGTERM, as a rolling restart would), waits
    /// `down_for`, starts it again with the very same command line and
    /// environment (read from `/proc`), and waits until it is ready. Returns
    /// the new pid.
    pub async fn restart_apiserver(&self, down_for: Duration) -> Result<i32> {
        const NAME: &str = "kube-apiserver";
        let (args, env, log) = {
            let mut guard = self
                .inner
                .processes
                .lock()
                .map_err(|_| Error::Host("process table poisoned".into()))?;
            let index = guard
                .control_plane
                .iter()
                .position(|p| p.name() == NAME)
                .ok_or_else(|| Error::Host(format!("no {NAME} process")))?;
            let pid = guard.control_plane[index].pid();
            let args = proc_strings(pid, "cmdline")?;
            let env = proc_strings(pid, "environ")?;
            let log = guard.control_plane[index].log().to_path_buf();
            let mut old = guard.control_plane.remove(index);
            old.terminate(Duration::from_secs(10));
            (args, env, log)
        };
        tokio::time::sleep(down_for).await;
        let (program, rest) = args
            .split_first()
            .ok_or_else(|| Error::Host(format!("{NAME} had an empty command line")))?;
        let mut command = Command::new(program);
        command.args(rest).env_clear();
        for pair in &env {
            if let Some((k, v)) = pair.split_once('=') {
                command.env(k, v);
            }
        }
        let process = ManagedProcess::spawn(NAME, command, &log)?;
        let pid = process.pid();
        cgroups::track(&format!("{}/control-plane", self.inner.cgroup), pid)?;
        {
            let mut guard = self
                .inner
                .processes
                .lock()
                .map_err(|_| Error::Host("process table poisoned".into()))?;
            guard.started_pids.insert(pid);
            guard.control_plane.push(process);
        }
        let client = self.client()?;
        self.wait_until_async(
            "kube-apiserver /readyz after restart",
            Duration::from_secs(120),
            || {
                let client = client.clone();
                async move {
                    let mut req = http::Request::new(Vec::new());
                    *req.uri_mut() = http::Uri::from_static("/readyz");
                    matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok")
                }
            },
        )
        .await?;
        Ok(pid)
    }
}
