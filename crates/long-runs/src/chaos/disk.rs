//! Part (d) of `cargo xtask chaos`: the EFA driver on `p5` with its disk in
//! trouble, each case with a pod asking for one EFA:
//! - a corrupt checkpoint (garbage written over it while a pod holds a
//!   claim): the driver moves it aside, counts it, keeps running, the next
//!   pod runs, and the held pod's deletion leaves no CDI spec behind;
//! - a full CDI directory (a 16 KiB tmpfs, filled, mounted over the node's
//!   CDI directory): the pod gets a `FailedPrepareDynamicResources` event
//!   that says the disk is full, the driver keeps running, and the pod runs
//!   once the space is back (the mount removed);
//! - an unwritable checkpoint directory (the plugin data directory bind
//!   mounted read-only over itself): the same, with "read-only".
//!
//! The mounts need `CAP_SYS_ADMIN` (the local cluster runs as root anyway);
//! each is undone whatever happens.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

use super::cycles::NAMESPACE;
use super::faults::{opt, opt_s};
use e2e::local::LocalTestbed;
use e2e::scenarios::kit;
use e2e::testbed::{DriverKind, Testbed};

const NODE: &str = "p5";
const RUNNING: Duration = Duration::from_secs(180);
const EVENT: Duration = Duration::from_secs(90);

/// What the disk faults showed.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct DiskFigures {
    /// Corrupt checkpoint → a new pod Running, ms.
    pub corrupt_new_pod_ms: Option<u64>,
    /// The corrupt file moved aside (a `checkpoint.json.corrupt-*` file).
    pub corrupt_moved_aside: Option<bool>,
    /// `aws_dra_checkpoint_errors_total{reason="corrupt"}` after it.
    pub corrupt_counted: Option<f64>,
    /// CDI specs of the held pod's claim left 60 s after its deletion.
    pub corrupt_specs_left: Option<usize>,
    /// Full CDI directory: the event's message.
    pub full_event: Option<String>,
    /// Space back (the tmpfs removed) → the pod Running, ms.
    pub full_recovered_ms: Option<u64>,
    /// Read-only checkpoint directory: the event's message.
    pub readonly_event: Option<String>,
    /// Made writable again → the pod Running, ms.
    pub readonly_recovered_ms: Option<u64>,
    /// Driver restarts over the three cases (the pid changed or it died).
    pub driver_restarts: Option<u64>,
}

impl DiskFigures {
    pub fn rows(&self) -> Vec<String> {
        vec![
            format!(
                "| corrupt checkpoint (EFA, p5): moved aside / counted as corrupt | {} / {} |",
                opt(self.corrupt_moved_aside.as_ref()),
                opt(self.corrupt_counted.as_ref())
            ),
            format!(
                "| … corrupt → new pod Running | {} |",
                opt_s(self.corrupt_new_pod_ms)
            ),
            format!(
                "| … CDI specs left 60 s after the pod of a claim prepared before the corruption was deleted | {} |",
                opt(self.corrupt_specs_left.as_ref())
            ),
            format!(
                "| full CDI directory (16 KiB tmpfs): pod event | `{}` |",
                opt(self.full_event.as_ref())
            ),
            format!(
                "| … space back (tmpfs removed) → pod Running | {} |",
                opt_s(self.full_recovered_ms)
            ),
            format!(
                "| read-only checkpoint directory: pod event | `{}` |",
                opt(self.readonly_event.as_ref())
            ),
            format!(
                "| … writable again → pod Running | {} |",
                opt_s(self.readonly_recovered_ms)
            ),
            format!(
                "| driver restarts over the three disk faults | {} |",
                opt(self.driver_restarts.as_ref())
            ),
        ]
    }
}

/// Runs the three cases in order; figures are filled in as they come.
pub async fn run(tb: &LocalTestbed, f: &mut DiskFigures) -> Result<()> {
    kit::namespace(tb, NAMESPACE).await?;
    let node = tb
        .local_node(NODE)
        .await
        .ok_or_else(|| anyhow!("no node {NODE}"))?;
    let data_dir = node.plugins_dir.join(DriverKind::Efa.driver_name());
    let pid = tb.driver_pid(NODE, DriverKind::Efa);
    let outcome = async {
        corrupt_checkpoint(tb, f, &data_dir)
            .await
            .context("corrupt checkpoint")?;
        full_cdi(tb, f, &node.cdi_dir)
            .await
            .context("full CDI directory")?;
        readonly_data_dir(tb, f, &data_dir)
            .await
            .context("read-only checkpoint directory")
    }
    .await;
    let alive = tb.driver_running(NODE, DriverKind::Efa);
    f.driver_restarts = Some(u64::from(
        !alive || tb.driver_pid(NODE, DriverKind::Efa) != pid,
    ));
    outcome
}

fn efa_pod(tb: &LocalTestbed, name: &str) -> serde_json::Value {
    kit::pod_with_claim(tb, name, Some("chaos-efa"), None, Some(NODE))
}

async fn claim_uid(tb: &LocalTestbed, pod: &str) -> Result<String> {
    kit::pod_claims(tb, NAMESPACE, pod)
        .await?
        .pop()
        .and_then(|c| c.metadata.uid)
        .ok_or_else(|| anyhow!("{pod} has no claim"))
}

async fn corrupt_checkpoint(tb: &LocalTestbed, f: &mut DiskFigures, data_dir: &Path) -> Result<()> {
    kit::apply_all(tb, NAMESPACE, &[efa_pod(tb, "disk-held")]).await?;
    kit::running(tb, NAMESPACE, "disk-held", RUNNING).await?;
    let held_claim = claim_uid(tb, "disk-held").await?;
    let checkpoint = data_dir.join("checkpoint.json");
    ensure!(
        std::fs::read_to_string(&checkpoint)?.contains(&held_claim),
        "{held_claim} is not in {}",
        checkpoint.display()
    );
    std::fs::write(&checkpoint, b"{\"version\": 1, \"claims\": ")?;
    let t = Instant::now();
    kit::apply_all(tb, NAMESPACE, &[efa_pod(tb, "after-corrupt")]).await?;
    kit::running(tb, NAMESPACE, "after-corrupt", RUNNING).await?;
    f.corrupt_new_pod_ms = Some(t.elapsed().as_millis() as u64);
    f.corrupt_moved_aside = Some(std::fs::read_dir(data_dir)?.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with("checkpoint.json.corrupt-")
    }));
    let metrics = tb.driver_metrics(NODE, DriverKind::Efa).await?;
    f.corrupt_counted = kit::gauge(
        &metrics,
        "aws_dra_checkpoint_errors_total",
        r#"reason="corrupt""#,
    );
    // The held claim was prepared before the checkpoint was lost: its
    // deletion must still take its CDI spec.
    kit::delete_pods(
        tb,
        NAMESPACE,
        &["disk-held", "after-corrupt"],
        Duration::from_secs(120),
    )
    .await?;
    let left = || -> Result<usize> {
        Ok(tb
            .cdi_spec_files(NODE)?
            .iter()
            .filter(|s| s.contains(&held_claim))
            .count())
    };
    let gone = kit::wait_for(
        tb,
        "the held claim's CDI spec removed",
        Duration::from_secs(60),
        || async { Ok((left()? == 0).then_some(())) },
    )
    .await;
    f.corrupt_specs_left = Some(left()?);
    gone.map(|_| ())
}

/// A mount that is undone when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount(args: &[&str], target: &Path) -> Result<()> {
    let status = Command::new("mount")
        .args(args)
        .arg(target)
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!("mount {args:?} {} failed: {status}", target.display());
    }
    Ok(())
}

/// Waits for the pod's `FailedPrepareDynamicResources` event and returns
/// its message (the kubelet's words around the driver's).
async fn failed_prepare(tb: &LocalTestbed, pod: &str) -> Result<String> {
    kit::wait_for(
        tb,
        &format!("FailedPrepareDynamicResources on {pod}"),
        EVENT,
        || async {
            Ok(kit::events(tb, NAMESPACE, pod)
                .await?
                .into_iter()
                .find(|(r, _)| r == "FailedPrepareDynamicResources")
                .map(|(_, m)| m))
        },
    )
    .await
}

async fn full_cdi(tb: &LocalTestbed, f: &mut DiskFigures, cdi_dir: &Path) -> Result<()> {
    // The specs already there are hidden while it is mounted; no pod is
    // started meanwhile except the one under test.
    mount(&["-t", "tmpfs", "-o", "size=16k", "tmpfs"], cdi_dir)?;
    let mounted = Mounted(cdi_dir.to_path_buf());
    // Fill it to the last byte (the write that no longer fits fails).
    let _ = std::fs::write(cdi_dir.join("filler"), vec![0u8; 64 * 1024]);
    kit::apply_all(tb, NAMESPACE, &[efa_pod(tb, "cdi-full")]).await?;
    let message = failed_prepare(tb, "cdi-full").await?;
    ensure!(
        message.contains("No space left on device"),
        "the event does not say the disk is full: {message:?}"
    );
    f.full_event = Some(message);
    // Space comes back by removing the mount, not the filler: containerd
    // watches the CDI directory with inotify, on the directory underneath,
    // so a spec written into the tmpfs would never reach it (the first run
    // of this case saw "unresolvable CDI devices" after the driver had
    // written the spec there). On a real full disk there is no second
    // directory.
    drop(mounted);
    let t = Instant::now();
    kit::running(tb, NAMESPACE, "cdi-full", RUNNING).await?;
    f.full_recovered_ms = Some(t.elapsed().as_millis() as u64);
    kit::delete_pods(tb, NAMESPACE, &["cdi-full"], Duration::from_secs(120)).await
}

async fn readonly_data_dir(tb: &LocalTestbed, f: &mut DiskFigures, data_dir: &Path) -> Result<()> {
    mount(&["--bind", &data_dir.to_string_lossy()], data_dir)?;
    let mounted = Mounted(data_dir.to_path_buf());
    mount(&["-o", "remount,ro,bind"], data_dir)?;
    kit::apply_all(tb, NAMESPACE, &[efa_pod(tb, "ckpt-readonly")]).await?;
    let message = failed_prepare(tb, "ckpt-readonly").await?;
    ensure!(
        message.contains("Read-only file system"),
        "the event does not say the checkpoint directory is read-only: {message:?}"
    );
    f.readonly_event = Some(message);
    drop(mounted);
    let t = Instant::now();
    kit::running(tb, NAMESPACE, "ckpt-readonly", RUNNING).await?;
    f.readonly_recovered_ms = Some(t.elapsed().as_millis() as u64);
    kit::delete_pods(tb, NAMESPACE, &["ckpt-readonly"], Duration::from_secs(120)).await
}
