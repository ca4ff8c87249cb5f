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
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device, DeviceCapacity,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
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
            ..ApiSupport::unknown()
        }
    } else {
        ApiSupport {
            partitionable_devices: Some(false),
            reason: "the API server dropped sharedCounters from a dry-run ResourceSlice write \
                     (DRAPartitionableDevices is off)"
                .into(),
            ..ApiSupport::unknown()
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
            ..ApiSupport::unknown()
        },
    }
}

/// The slice that asks about consumable capacity: one device that allows
/// multiple allocations, with a capacity that has a request policy (both
/// dropped by a server whose `DRAConsumableCapacity` gate is off).
pub(crate) fn capacity_probe_slice(driver: &str, node: &str) -> ResourceSlice {
    let q = |v: &str| Quantity(v.into());
    let mut slice = probe_slice(driver, node);
    slice.spec.shared_counters = None;
    slice.spec.devices = Some(vec![Device {
        name: "probe".into(),
        allow_multiple_allocations: Some(true),
        capacity: Some(
            [(
                "probe".to_owned(),
                DeviceCapacity {
                    value: q("2"),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(q("1")),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: q("1"),
                            max: Some(q("2")),
                            step: Some(q("1")),
                        }),
                        valid_values: None,
                    }),
                },
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    }]);
    slice
}

/// What the dry-run answer says about consumable capacity: supported when
/// the device kept both `allowMultipleAllocations` and the request policy.
pub(crate) fn judge_consumable_capacity(answer: &ResourceSlice) -> (Option<bool>, String) {
    let device = answer.spec.devices.as_ref().and_then(|d| d.first());
    let kept = device.is_some_and(|d| {
        d.allow_multiple_allocations == Some(true)
            && d.capacity
                .as_ref()
                .and_then(|c| c.values().next())
                .is_some_and(|c| c.request_policy.is_some())
    });
    if kept {
        (
            Some(true),
            "the API server kept allowMultipleAllocations and a capacity requestPolicy in a \
             dry-run ResourceSlice write"
                .into(),
        )
    } else {
        (
            Some(false),
            "the API server dropped allowMultipleAllocations or the capacity requestPolicy from \
             a dry-run ResourceSlice write (DRAConsumableCapacity is off)"
                .into(),
        )
    }
}

/// Both probes: partitionable devices and consumable capacity, each a
/// dry-run write of its own slice.
pub(crate) async fn probe(client: &kube::Client, driver: &str, node: &str) -> ApiSupport {
    let mut support = probe_partitionable_devices(client, driver, node).await;
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let params = PostParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    (
        support.consumable_capacity,
        support.consumable_capacity_reason,
    ) = match api
        .create(&params, &capacity_probe_slice(driver, node))
        .await
    {
        Ok(answer) => judge_consumable_capacity(&answer),
        Err(error) => (
            None,
            format!("the dry-run ResourceSlice write failed: {error}"),
        ),
    };
    support
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

    #[test]
    fn kept_sharing_fields_mean_supported_and_dropped_mean_not() {
        let sent = capacity_probe_slice("d.io", "n");
        assert!(sent.spec.shared_counters.is_none());
        assert_eq!(judge_consumable_capacity(&sent).0, Some(true));
        // A server with the gate off drops both fields of the device.
        let mut dropped = sent.clone();
        let device = &mut dropped.spec.devices.as_mut().unwrap()[0];
        device.allow_multiple_allocations = None;
        for c in device.capacity.as_mut().unwrap().values_mut() {
            c.request_policy = None;
        }
        let (supported, reason) = judge_consumable_capacity(&dropped);
        assert_eq!(supported, Some(false));
        assert!(reason.contains("DRAConsumableCapacity"), "{reason}");
        dropped.spec.devices = None;
        assert_eq!(judge_consumable_capacity(&dropped).0, Some(false));
    }
}
