//! Asking the API server what it accepts, before publishing anything.
//!
//! A field behind a feature gate that is off is dropped on write without an
//! error (see `../shared/reference/dra-features-by-version.md`). Neither the
//! server's version nor its discovery documents say which gates are on, so
//! the one reliable question is the write itself: a server-side dry run
//! (`dryRun=All`: admission and validation run, nothing is stored) of a
//! ResourceSlice that carries the field, and a look at what came back.
//!
//! The probe slice is one the driver may write anyway (its own driver name,
//! its own node, its own pool), so RBAC and the charts' admission policy
//! treat it like any other write of the driver.

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::publish::slice_name;
use crate::scan::inventory::ApiSupport;

/// Field manager of the probe write.
const FIELD_MANAGER: &str = "dra-core-api-probe";

/// The slice the probe dry-runs: one counter set, no devices.
pub(crate) fn probe_slice(driver: &str, node: &str) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{}-probe", slice_name(node, driver, 0))),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation: 1,
                resource_slice_count: 1,
            },
            shared_counters: Some(vec![CounterSet {
                name: "probe".into(),
                counters: [(
                    "probe".to_owned(),
                    Counter {
                        value: Quantity("1".into()),
                    },
                )]
                .into_iter()
                .collect(),
            }]),
            ..Default::default()
        },
    }
}

/// What the dry-run answer says about partitionable devices.
pub(crate) fn judge_partitionable(answer: &ResourceSlice) -> ApiSupport {
    if answer
        .spec
        .shared_counters
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        ApiSupport {
            partitionable_devices: Some(true),
            reason: "the API server kept sharedCounters in a dry-run ResourceSlice write".into(),
        }
    } else {
        ApiSupport {
            partitionable_devices: Some(false),
            reason: "the API server dropped sharedCounters from a dry-run ResourceSlice write \
                     (DRAPartitionableDevices is off)"
                .into(),
        }
    }
}

/// Dry-runs [`probe_slice`] and judges the answer. An error (no permission,
/// server down) gives `partitionable_devices: None` with the error as the
/// reason.
pub(crate) async fn probe_partitionable_devices(
    client: &kube::Client,
    driver: &str,
    node: &str,
) -> ApiSupport {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match api.create(&params, &probe_slice(driver, node)).await {
        Ok(answer) => judge_partitionable(&answer),
        Err(error) => ApiSupport {
            partitionable_devices: None,
            reason: format!("the dry-run ResourceSlice write failed: {error}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_slice_is_valid_for_the_own_pool() {
        let s = probe_slice("neuron.aws.com", "node-a");
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("node-a-neuron.aws.com-0-probe")
        );
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(s.spec.pool.name, "node-a");
        assert!(
            s.spec.devices.is_none(),
            "counters and devices never share a slice"
        );
        assert_eq!(s.spec.shared_counters.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn kept_counters_mean_supported_and_dropped_mean_not() {
        let sent = probe_slice("d.io", "n");
        let kept = judge_partitionable(&sent);
        assert_eq!(kept.partitionable_devices, Some(true));
        let mut dropped = sent.clone();
        dropped.spec.shared_counters = None;
        let judged = judge_partitionable(&dropped);
        assert_eq!(judged.partitionable_devices, Some(false));
        assert!(judged.reason.contains("DRAPartitionableDevices"));
        dropped.spec.shared_counters = Some(Vec::new());
        assert_eq!(
            judge_partitionable(&dropped).partitionable_devices,
            Some(false)
        );
    }
}
