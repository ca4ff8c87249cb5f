//! Device health end to end: a fault injected into a node's fixture sysfs
//! tree becomes a device taint in the node's ResourceSlices and an
//! `Unhealthy` device in the pod status (kubelet's health stream), and goes
//! away when the fault is cleared.
//!
//! Fixtures produce no uevents, so the drivers see a fault at their next
//! periodic rescan: every testbed starts them with
//! [`RESCAN_INTERVAL`] (`RESCAN_INTERVAL_SECONDS`). The "rescan trigger" is
//! therefore at most one interval after the injection, and the bound the
//! scenarios assert, measured from the injection, is one interval plus
//! [`AFTER_TRIGGER`]. The measured latencies are printed.
//!
//! Every scenario clears the faults it injected whatever its outcome
//! ([`sysfs_fixtures::health::clear`]) and waits for the taints to go, so
//! the next scenario starts from healthy devices.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::resource::v1::Device;
use serde_json::{Value, json};
use sysfs_fixtures::health::{self, Fault};

use super::agreement;
use super::allocate::{GONE, RUNNING, stays_pending};
use super::kit::{self, attr_int, attr_str};
use crate::testbed::{DriverKind, RESCAN_INTERVAL, Testbed};
use local_cluster::versions::DraFeature;

/// How long after the rescan trigger a taint must be in the API (or gone
/// from it). Typically under 2 s (under 3.1 s in every local run so far,
/// with eight busy loops beside the cluster too). The margin is for CI,
/// which runs its e2e legs side by side on 2 cores: on the charts testbed
/// the drivers are containers with a 10m CPU request (cpu.shares 10), and
/// a warm run with three clusters saw Neuron taints go 6.7 s after
/// clearing; with four clusters and the checks (five lanes), the 1.38 host
/// leg saw 11.7 s. A rescan that never comes still fails at the bound.
pub(super) const AFTER_TRIGGER: Duration = Duration::from_secs(20);
/// How long to wait for kubelet to show the device unhealthy in the pod status.
const POD_STATUS: Duration = Duration::from_secs(90);

/// One device to break: where it is, how to select only it, the fault.
pub(super) struct Target {
    pub node: &'static str,
    pub kind: DriverKind,
    pub device: String,
    /// CEL selecting exactly this device.
    pub cel: String,
    pub fault: Fault,
    /// The taint key the fault must produce.
    pub key: String,
}

impl Target {
    /// The first EFA of `node`, with its admin queue closed.
    pub async fn efa(tb: &impl Testbed, node: &'static str) -> Result<Target> {
        let devices = kit::devices(tb, node, DriverKind::Efa).await?;
        let (device, published) = devices
            .iter()
            .next()
            .ok_or_else(|| anyhow!("{node} publishes no EFA"))?;
        let bdf = attr_str(published, "resource.kubernetes.io/pciBusID")
            .ok_or_else(|| anyhow!("{device} has no pciBusID"))?;
        let info = tb
            .nodes()
            .into_iter()
            .find(|n| n.name == node)
            .ok_or_else(|| anyhow!("no node {node}"))?;
        let ibdev = info
            .fixture
            .efa(&bdf)
            .map(|e| e.ibdev.clone())
            .ok_or_else(|| anyhow!("{node}'s fixture has no EFA at {bdf}"))?;
        Ok(Target {
            node,
            kind: DriverKind::Efa,
            device: device.clone(),
            cel: format!("device.attributes[\"resource.kubernetes.io\"].pciBusID == \"{bdf}\""),
            fault: Fault::EfaAdminQueueClosed { ibdev },
            key: format!("{}/admin-queue-closed", DriverKind::Efa.driver_name()),
        })
    }

    /// The first Neuron chip of `node`, with an uncorrected SRAM ECC error.
    pub async fn neuron(tb: &impl Testbed, node: &'static str) -> Result<Target> {
        let devices = kit::devices(tb, node, DriverKind::Neuron).await?;
        let (device, published) = devices
            .iter()
            .next()
            .ok_or_else(|| anyhow!("{node} publishes no Neuron device"))?;
        let driver = DriverKind::Neuron.driver_name();
        let chip = attr_int(published, &format!("{driver}/deviceId"))
            .or_else(|| attr_int(published, "deviceId"))
            .ok_or_else(|| anyhow!("{device} has no deviceId"))?;
        Ok(Target {
            node,
            kind: DriverKind::Neuron,
            device: device.clone(),
            cel: format!("device.attributes[\"{driver}\"].deviceId == {chip}"),
            fault: Fault::NeuronSramUncorrected {
                chip: u32::try_from(chip).context("deviceId")?,
            },
            key: format!("{driver}/sram-ecc-uncorrected"),
        })
    }

    /// A claim template for exactly this device, tolerating its taint or not.
    pub fn template(&self, name: &str, tolerate: bool) -> Value {
        let mut request = json!({
            "deviceClassName": self.kind.driver_name(),
            "selectors": [{"cel": {"expression": self.cel}}],
        });
        if tolerate {
            request["tolerations"] =
                json!([{"key": self.key, "operator": "Exists", "effect": "NoSchedule"}]);
        }
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": request}]}}},
        })
    }

    /// The device's taint with this target's key, as published now.
    pub async fn taint(&self, tb: &impl Testbed) -> Result<Option<(String, String)>> {
        let devices = kit::devices(tb, self.node, self.kind).await?;
        let d = devices
            .get(&self.device)
            .ok_or_else(|| anyhow!("{} is no longer published on {}", self.device, self.node))?;
        Ok(taint_with_key(d, &self.key))
    }

    /// Injects the fault and waits until the taint is published; returns
    /// the time from the injection and checks the bound.
    pub async fn break_and_see_taint(&self, tb: &impl Testbed) -> Result<Duration> {
        let sys = tb.fixture_sysfs(self.node)?;
        let injected = Instant::now();
        health::inject(&sys, &self.fault).with_context(|| format!("injecting {:?}", self.fault))?;
        let (value, effect) = kit::wait_for(
            tb,
            &format!("taint {} on {} {}", self.key, self.node, self.device),
            Duration::from_secs(60),
            || async { self.taint(tb).await },
        )
        .await?;
        let latency = injected.elapsed();
        println!(
            "    {} {}: taint {}={value}:{effect} in the API {} ms after the injection \
             (rescan interval {} s)",
            self.node,
            self.device,
            self.key,
            latency.as_millis(),
            RESCAN_INTERVAL.as_secs()
        );
        ensure!(
            self.key
                .starts_with(&format!("{}/", self.kind.driver_name())),
            "taint key {} outside the driver's domain",
            self.key
        );
        ensure!(
            effect == "NoSchedule",
            "{} on {}: effect {effect}, want NoSchedule",
            self.key,
            self.device
        );
        ensure!(
            latency <= RESCAN_INTERVAL + AFTER_TRIGGER,
            "taint {} took {latency:?}, more than one rescan interval ({RESCAN_INTERVAL:?}) + \
             {AFTER_TRIGGER:?}",
            self.key
        );
        Ok(latency)
    }
}

/// `(value, effect)` of `d`'s taint with `key`.
pub(super) fn taint_with_key(d: &Device, key: &str) -> Option<(String, String)> {
    d.taints
        .as_ref()?
        .iter()
        .find(|t| t.key == key)
        .map(|t| (t.value.clone().unwrap_or_default(), t.effect.clone()))
}

/// Clears every fault of `node`'s tree, then waits until no device of
/// `kind` there carries a taint of ours (bounded like the taint).
pub(super) async fn clear_and_wait(tb: &impl Testbed, node: &str, kind: DriverKind) -> Result<()> {
    let sys = tb.fixture_sysfs(node)?;
    let cleared = Instant::now();
    health::clear(&sys).with_context(|| format!("clearing the faults of {}", sys.display()))?;
    let prefix = format!("{}/", kind.driver_name());
    kit::wait_for(
        tb,
        &format!("no {prefix}* taint left on {node}"),
        Duration::from_secs(60),
        || async {
            let devices = kit::devices(tb, node, kind).await?;
            let tainted = devices.values().any(|d| {
                d.taints
                    .as_ref()
                    .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with(&prefix)))
            });
            Ok((!tainted).then_some(()))
        },
    )
    .await?;
    let latency = cleared.elapsed();
    println!(
        "    {node} {}: taints gone {} ms after clearing",
        kind.binary(),
        latency.as_millis()
    );
    ensure!(
        latency <= RESCAN_INTERVAL + AFTER_TRIGGER,
        "taints on {node} took {latency:?} to go after clearing"
    );
    Ok(())
}

/// Scenario 15: a fault on p5's first EFA and trn2's first Neuron chip.
pub async fn fault_taints(tb: &impl Testbed, ns: &str) -> Result<()> {
    for (tag, target) in [
        ("efa", Target::efa(tb, "p5").await?),
        ("neuron", Target::neuron(tb, "trn2").await?),
    ] {
        let result = fault_one(tb, ns, tag, &target).await;
        let pods = [
            format!("holder-{tag}"),
            format!("blocked-{tag}"),
            format!("tolerating-{tag}"),
        ];
        let names: Vec<&str> = pods.iter().map(String::as_str).collect();
        let deleted = kit::delete_pods(tb, ns, &names, GONE).await;
        let cleared = clear_and_wait(tb, target.node, target.kind).await;
        result.with_context(|| format!("{} {} on {}", tag, target.device, target.node))?;
        deleted?;
        cleared?;
    }
    Ok(())
}

async fn fault_one(tb: &impl Testbed, ns: &str, tag: &str, t: &Target) -> Result<()> {
    let (plain, tolerating) = (format!("only-{tag}"), format!("tolerating-{tag}"));
    kit::apply_all(
        tb,
        ns,
        &[t.template(&plain, false), t.template(&tolerating, true)],
    )
    .await?;

    // A pod already runs on the device that breaks.
    let holder = format!("holder-{tag}");
    let pod = kit::pod_with_claim(tb, &holder, Some(&plain), None, Some(t.node));
    kit::apply_all(tb, ns, &[pod]).await?;
    kit::running(tb, ns, &holder, RUNNING).await?;
    let devs = kit::pod_devices(tb, ns, &holder).await?;
    ensure!(
        devs.len() == 1 && devs[0].device == t.device,
        "the claim for {} got {devs:?}",
        t.device
    );

    // (a) The taint, within the bound.
    t.break_and_see_taint(tb).await?;

    // (c) Kubelet shows the running pod's device as Unhealthy.
    let since = Instant::now();
    let health = kit::wait_for(
        tb,
        &format!("{ns}/{holder} showing {} Unhealthy", t.device),
        POD_STATUS,
        || async {
            Ok(device_health(tb, ns, &holder, &t.device)
                .await?
                .filter(|h| h == "Unhealthy"))
        },
    )
    .await;
    let health = match health {
        Ok(h) => h,
        Err(e) => {
            // Say what kubelet did report, for whoever reads the failure.
            let seen = kit::get_pod(tb, ns, &holder)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .map(|s| {
                    s.container_statuses
                        .unwrap_or_default()
                        .into_iter()
                        .map(|c| format!("{:?}", c.allocated_resources_status))
                        .collect::<Vec<_>>()
                        .join("; ")
                });
            return Err(e.context(format!("allocatedResourcesStatus seen: {seen:?}")));
        }
    };
    println!(
        "    {} {}: pod status {health} {} ms after the taint",
        t.node,
        t.device,
        since.elapsed().as_millis()
    );
    kit::delete_pods(tb, ns, &[&holder], GONE).await?;

    // (b) The device is free but tainted: a claim that can only take it stays Pending.
    let blocked = format!("blocked-{tag}");
    let pod = kit::pod_with_claim(tb, &blocked, Some(&plain), None, Some(t.node));
    kit::apply_all(tb, ns, &[pod]).await?;
    let (reason, message, explained) = stays_pending(tb, ns, &blocked).await?;
    ensure!(
        reason == "Unschedulable",
        "a claim for the tainted {} without a toleration: scheduler said {reason}: {message}",
        t.device
    );
    agreement::names_the_reason(
        &blocked,
        &explained,
        &[&format!("taint {}=", t.key), "is not tolerated", &t.cel],
    )?;
    if message.contains(&t.key) {
        println!("    scheduler names the taint: {message}");
    } else {
        println!("    scheduler: {reason} (does not name the taint): {message}");
    }
    kit::delete_pods(tb, ns, &[&blocked], GONE).await?;

    // (d) A claim tolerating the key gets the device and runs.
    let pod = kit::pod_with_claim(tb, &tolerating, Some(&tolerating), None, Some(t.node));
    kit::apply_all(tb, ns, &[pod]).await?;
    kit::running(tb, ns, &tolerating, RUNNING).await?;
    let devs = kit::pod_devices(tb, ns, &tolerating).await?;
    ensure!(
        devs.len() == 1 && devs[0].device == t.device,
        "a claim tolerating {} got {devs:?}, not {}",
        t.key,
        t.device
    );
    Ok(())
}

/// The health kubelet reports for `device` in the pod's
/// `status.containerStatuses[].allocatedResourcesStatus` (`None`: not listed).
async fn device_health(
    tb: &impl Testbed,
    ns: &str,
    pod: &str,
    device: &str,
) -> Result<Option<String>> {
    let Some(p) = kit::get_pod(tb, ns, pod).await? else {
        return Ok(None);
    };
    // Kubelet names a resource by the CDI device id the driver returned
    // for it (`<kind>=<claim uid>-<device>` from our drivers), or by
    // `<driver>/<pool>/<device>` where there is none: match the device name
    // at the end, after a separator.
    let names_device = |id: &str| {
        id.strip_suffix(device)
            .is_some_and(|head| head.ends_with(['/', '-', '=']))
    };
    Ok(p.status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|c| c.allocated_resources_status.unwrap_or_default())
        .flat_map(|r| r.resources.unwrap_or_default())
        .find(|h| names_device(&h.resource_id))
        .and_then(|h| h.health))
}

/// How long the slices must stay unwritten on a server that drops taints.
const QUIET: Duration = Duration::from_secs(60);

/// Scenario 16: a fault on a server without `DRADeviceTaints` (1.34) makes
/// the driver neither crash nor rewrite its slices forever. On a release
/// with taints it only checks that the taint is published and cleared.
pub async fn taints_dropped(tb: &impl Testbed, _ns: &str) -> Result<()> {
    let release = local_cluster::cluster::selected_kubernetes_version()
        .release()
        .map_err(|e| anyhow!("{e}"))?;
    let target = Target::efa(tb, "p5").await?;
    let result = if release.lacks(&[DraFeature::DeviceTaints]).is_none() {
        target.break_and_see_taint(tb).await.map(|_| ())
    } else {
        quiet_after_fault(tb, &target).await
    };
    let cleared = if release.lacks(&[DraFeature::DeviceTaints]).is_none() {
        clear_and_wait(tb, target.node, target.kind).await
    } else {
        health::clear(&tb.fixture_sysfs(target.node)?).context("clearing the faults")
    };
    result?;
    cleared
}

/// `name value` of an unlabelled metric in `/metrics` text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

/// `(resourceVersion, name)` of every slice of `kind` on `node`.
async fn versions(
    tb: &impl Testbed,
    node: &str,
    kind: DriverKind,
) -> Result<Vec<(String, String)>> {
    let mut v: Vec<(String, String)> = kit::slices(tb, node, kind)
        .await?
        .into_iter()
        .map(|s| {
            (
                s.metadata.name.unwrap_or_default(),
                s.metadata.resource_version.unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    Ok(v)
}

async fn quiet_after_fault(tb: &impl Testbed, t: &Target) -> Result<()> {
    let sys = tb.fixture_sysfs(t.node)?;
    let injected = Instant::now();
    health::inject(&sys, &t.fault).with_context(|| format!("injecting {:?}", t.fault))?;
    // The driver's rescan metrics are `aws_dra_<binary without -driver>_...`
    // (dra-core's runner; the rule in docs/operations.md).
    let driver = t
        .kind
        .binary()
        .trim_end_matches("-driver")
        .replace('-', "_");
    let unhealthy = format!("aws_dra_{driver}_devices_by_health{{state=\"unhealthy\"}}");
    // The first rescan that saw the fault, and the publisher's verdict on the
    // taints it then wrote.
    kit::wait_for(
        tb,
        &format!(
            "{} on {} to see the fault and find its taints dropped",
            t.kind.binary(),
            t.node
        ),
        Duration::from_secs(60),
        || async {
            let text = tb.driver_metrics(t.node, t.kind).await?;
            let seen = metric(&text, &unhealthy).is_some_and(|v| v >= 1.0);
            let dropped = metric(&text, "aws_dra_publish_taints_dropped") == Some(1.0);
            Ok((seen && dropped).then_some(()))
        },
    )
    .await?;
    println!(
        "    {} {}: fault seen and taints found dropped {} ms after the injection",
        t.node,
        t.device,
        injected.elapsed().as_millis()
    );
    let before = versions(tb, t.node, t.kind).await?;
    ensure!(
        !before.is_empty(),
        "{} publishes no slice on {}",
        t.kind.binary(),
        t.node
    );
    let started = Instant::now();
    while started.elapsed() < QUIET {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ensure!(
            tb.driver_running(t.node, t.kind),
            "{} on {} stopped after the fault; {}",
            t.kind.binary(),
            t.node,
            tb.logs_hint()
        );
        let now = versions(tb, t.node, t.kind).await?;
        ensure!(
            now == before,
            "{} on {} rewrote its slices {:?} after the first rescan that saw the fault: \
             {before:?} -> {now:?}",
            t.kind.binary(),
            t.node,
            started.elapsed()
        );
    }
    let d = kit::devices(tb, t.node, t.kind).await?;
    let dev = d
        .get(&t.device)
        .ok_or_else(|| anyhow!("{} no longer published", t.device))?;
    ensure!(
        taint_with_key(dev, &t.key).is_none(),
        "the server kept taint {} although DRADeviceTaints is off",
        t.key
    );
    println!(
        "    {}: {} slices unchanged for {QUIET:?}, driver still running",
        t.node,
        before.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_plain_and_labelled_metrics() {
        let text = "# HELP x\naws_dra_efa_devices_by_health{state=\"unhealthy\"} 1\n\
                    aws_dra_publish_taints_dropped 0\n";
        assert_eq!(
            metric(text, "aws_dra_efa_devices_by_health{state=\"unhealthy\"}"),
            Some(1.0)
        );
        assert_eq!(metric(text, "aws_dra_publish_taints_dropped"), Some(0.0));
        assert_eq!(metric(text, "nothing"), None);
    }
}
