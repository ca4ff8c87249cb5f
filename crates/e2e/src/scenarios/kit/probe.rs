//! The probe container's report (devices and environment it saw), read
//! from its log.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;

use super::wait_for;
use crate::testbed::Testbed;

/// What the probe container reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    /// path → `char M:m`
    pub devices: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
}

impl ProbeReport {
    pub fn parse(log: &str) -> Option<ProbeReport> {
        let body = log
            .split_once("probe-begin\n")?
            .1
            .split_once("probe-end")?
            .0;
        let mut r = ProbeReport::default();
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("dev ") {
                if let Some((path, what)) = rest.split_once(' ') {
                    r.devices.insert(path.to_string(), what.to_string());
                }
            } else if let Some(kv) = line.strip_prefix("env ")
                && let Some((k, v)) = kv.split_once('=')
            {
                r.env.insert(k.to_string(), v.to_string());
            }
        }
        Some(r)
    }

    /// Device paths under `prefix` (e.g. `/dev/infiniband/uverbs`).
    pub fn devices_with_prefix(&self, prefix: &str) -> BTreeSet<String> {
        self.devices
            .keys()
            .filter(|p| p.starts_with(prefix))
            .cloned()
            .collect()
    }
}

/// Waits for the probe's complete report in the pod's log.
pub async fn probe(tb: &impl Testbed, ns: &str, pod: &str) -> Result<ProbeReport> {
    let pods: Api<Pod> = Api::namespaced(tb.client(), ns);
    wait_for(
        tb,
        &format!("probe report of {ns}/{pod}"),
        Duration::from_secs(60),
        || async {
            let log = pods.logs(pod, &LogParams::default()).await?;
            Ok(ProbeReport::parse(&log))
        },
    )
    .await
}
