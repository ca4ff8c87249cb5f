//! The desired state of the node's pool: devices in, ResourceSlices out.
//!
//! Pure: the same devices always give byte-identical slices, which is what
//! makes "nothing changed, nothing written" possible and what `discover`
//! prints. Devices are validated ([`super::validate`]), sorted by name and cut
//! into chunks of at most [`MAX_DEVICES_PER_SLICE`]; a node without devices
//! gets one empty slice, because "pool exists with zero devices" is different
//! from "no pool".
//!
//! Slice names are deterministic (`<node>-<driver>-<index>`, see
//! [`slice_name`]) rather than `generateName`: a crash between a create and
//! the next list cannot leave an orphan twin behind, reconcile can match
//! observed to desired slices by name, and `discover` shows the names `run`
//! will use. The pool generation here is always 1; [`super::reconcile()`] sets the
//! real one from what the API server already has.

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use super::validate::{ValidationIssue, log_issues, validate_devices};

/// Most devices the API server accepts in one ResourceSlice (1.34).
pub(crate) const MAX_DEVICES_PER_SLICE: usize = 128;
/// Most devices in one slice when any of them has taints or consumes
/// counters (`ResourceSliceMaxDevicesWithAdvancedFeatures` in the 1.37 API
/// validation).
pub(crate) const MAX_DEVICES_PER_SLICE_WITH_TAINTS: usize = 64;

/// Most counter sets in one ResourceSlice (`ResourceSliceMaxCounterSets`).
/// A slice carries either devices or counter sets, never both, so counter
/// sets go into slices of their own in the same pool.
pub(crate) const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// What one scan says the pool holds: the devices, and the counter sets
/// that partitioned devices draw on (empty for a driver without
/// partitionable devices). Sent as one value so that a device never reaches
/// the API server without the counter set it consumes, or the other way
/// round.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct PoolContent {
    pub devices: Vec<Device>,
    pub counter_sets: Vec<CounterSet>,
}

/// The devices, which is what most readers of a pool want.
impl std::ops::Deref for PoolContent {
    type Target = Vec<Device>;
    fn deref(&self) -> &Vec<Device> {
        &self.devices
    }
}

impl PoolContent {
    /// Devices only.
    #[cfg(any(test, feature = "testing"))]
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn devices(devices: Vec<Device>) -> Self {
        PoolContent {
            devices,
            counter_sets: Vec::new(),
        }
    }
}

/// Longest object name (DNS subdomain).
const MAX_OBJECT_NAME_LEN: usize = 253;

/// The Node that owns the pool's slices, so they are garbage-collected with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct NodeOwner {
    /// Node name.
    pub name: String,
    /// Node UID (`metadata.uid`).
    pub uid: String,
}

impl NodeOwner {
    /// The owner reference put on every slice.
    pub(crate) fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }
}

/// Desired slices plus what validation repaired on the way.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DesiredPool {
    /// Slices in index order; never empty.
    pub slices: Vec<ResourceSlice>,
    /// Repairs made while validating the devices.
    pub issues: Vec<ValidationIssue>,
    /// Devices that made it into the slices.
    pub device_count: usize,
}

/// Computes the desired pool without logging (the publisher logs and counts
/// the issues itself, once per device change).
#[cfg(test)]
pub(crate) fn desired_pool(
    driver: &str,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: &[Device],
) -> DesiredPool {
    desired_pool_with_counters(driver, node, owner, devices, &[])
}

/// [`desired_pool`] for a pool whose devices consume shared counters: the
/// device slices come first, then the counter sets, sorted by name, at most
/// [`MAX_COUNTER_SETS_PER_SLICE`] per slice, in slices of their own.
pub(crate) fn desired_pool_with_counters(
    driver: &str,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: &[Device],
    counter_sets: &[CounterSet],
) -> DesiredPool {
    let (mut devices, issues) = validate_devices(driver, devices);
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    let device_count = devices.len();
    // The limit is per slice, but one size for the pool keeps the slice
    // boundaries independent of which device happens to be tainted.
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    let per_slice = if advanced {
        MAX_DEVICES_PER_SLICE_WITH_TAINTS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let mut counter_sets = counter_sets.to_vec();
    counter_sets.sort_by(|a, b| a.name.cmp(&b.name));
    let counter_chunks: Vec<Vec<CounterSet>> = counter_sets
        .chunks(MAX_COUNTER_SETS_PER_SLICE)
        .map(<[CounterSet]>::to_vec)
        .collect();
    let chunks: Vec<Vec<Device>> = if devices.is_empty() && counter_chunks.is_empty() {
        vec![Vec::new()]
    } else {
        devices.chunks(per_slice).map(<[Device]>::to_vec).collect()
    };
    let count = i64::try_from(chunks.len() + counter_chunks.len()).unwrap_or(i64::MAX);
    let spec = |devices: Option<Vec<Device>>, shared_counters: Option<Vec<CounterSet>>| {
        ResourceSliceSpec {
            driver: driver.to_owned(),
            node_name: Some(node.to_owned()),
            pool: ResourcePool {
                name: node.to_owned(),
                generation: 1,
                resource_slice_count: count,
            },
            devices,
            shared_counters,
            ..Default::default()
        }
    };
    let specs = chunks
        .into_iter()
        .map(|devices| spec((!devices.is_empty()).then_some(devices), None))
        .chain(
            counter_chunks
                .into_iter()
                .map(|sets| spec(None, Some(sets))),
        );
    let slices = specs
        .enumerate()
        .map(|(index, spec)| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(node, driver, index)),
                owner_references: owner.map(|o| vec![o.owner_reference()]),
                ..Default::default()
            },
            spec,
        })
        .collect();
    DesiredPool {
        slices,
        issues,
        device_count,
    }
}

/// The slices `run` would publish for `devices` on `node` (what `discover`
/// prints). Validation issues are logged at `warn`.
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub fn desired_slices(
    driver: &str,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: &[Device],
) -> Vec<ResourceSlice> {
    desired_slices_with_counters(driver, node, owner, devices, &[])
}

/// [`desired_slices`] with the pool's counter sets.
pub(crate) fn desired_slices_with_counters(
    driver: &str,
    node: &str,
    owner: Option<&NodeOwner>,
    devices: &[Device],
    counter_sets: &[CounterSet],
) -> Vec<ResourceSlice> {
    let pool = desired_pool_with_counters(driver, node, owner, devices, counter_sets);
    log_issues(&pool.issues);
    pool.slices
}

/// `<node>-<driver>-<index>`. Node names and driver names are DNS subdomains,
/// so the result is one too; when it would exceed 253 characters the prefix is
/// cut and a short hash of the full prefix keeps it unique.
pub(crate) fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let prefix = format!("{node}-{driver}");
    let suffix = format!("-{index}");
    if prefix.len() + suffix.len() <= MAX_OBJECT_NAME_LEN {
        return prefix + &suffix;
    }
    let hash = hex::encode(&Sha256::digest(prefix.as_bytes())[..4]);
    let keep = MAX_OBJECT_NAME_LEN - suffix.len() - hash.len() - 1;
    // Both inputs are ASCII (DNS names), so byte slicing is safe; strip
    // separators so no label ends in '-' or '.'.
    let cut = prefix
        .get(..keep)
        .unwrap_or(&prefix)
        .trim_end_matches(['-', '.']);
    format!("{cut}-{hash}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::validate::is_dns_subdomain;
    use k8s_openapi::api::resource::v1::DeviceAttribute;

    const DRIVER: &str = "efa.networking.k8s.aws";

    pub(crate) fn devices(n: usize) -> Vec<Device> {
        (0..n)
            .map(|i| Device {
                name: format!("dev-{i:04}"),
                attributes: Some(
                    [(
                        "index".to_string(),
                        DeviceAttribute {
                            int: Some(i as i64),
                            ..Default::default()
                        },
                    )]
                    .into(),
                ),
                ..Default::default()
            })
            .collect()
    }

    fn owner() -> NodeOwner {
        NodeOwner {
            name: "node-a".into(),
            uid: "uid-1".into(),
        }
    }

    #[test]
    fn chunking_table() {
        // (devices, expected devices per slice)
        for (n, want) in [
            (0usize, vec![0usize]),
            (1, vec![1]),
            (128, vec![128]),
            (129, vec![128, 1]),
            (300, vec![128, 128, 44]),
        ] {
            let mut input = devices(n);
            input.reverse(); // output must be sorted regardless of input order
            let pool = desired_pool(DRIVER, "node-a", Some(&owner()), &input);
            let sizes: Vec<usize> = pool
                .slices
                .iter()
                .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                .collect();
            assert_eq!(sizes, want, "{n} devices");
            assert_eq!(pool.device_count, n);
            let names: Vec<String> = pool
                .slices
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten())
                .map(|d| d.name.clone())
                .collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted);
            for (i, s) in pool.slices.iter().enumerate() {
                assert_eq!(
                    s.metadata.name.as_deref(),
                    Some(format!("node-a-{DRIVER}-{i}").as_str())
                );
                assert_eq!(
                    s.spec.pool,
                    ResourcePool {
                        name: "node-a".into(),
                        generation: 1,
                        resource_slice_count: want.len() as i64
                    }
                );
                assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
                assert_eq!(s.spec.driver, DRIVER);
                assert_eq!(
                    s.metadata.owner_references,
                    Some(vec![owner().owner_reference()])
                );
            }
        }
    }

    #[test]
    fn a_tainted_device_repacks_the_pool_by_64() {
        use k8s_openapi::api::resource::v1::DeviceTaint;
        let mut input = devices(130);
        input[7].taints = Some(vec![DeviceTaint {
            key: format!("{DRIVER}/admin-queue-closed"),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        let pool = desired_pool(DRIVER, "node-a", None, &input);
        let sizes: Vec<usize> = pool
            .slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect();
        assert_eq!(sizes, vec![64, 64, 2]);
    }

    #[test]
    fn counter_sets_get_slices_of_their_own() {
        use k8s_openapi::api::resource::v1::{Counter, DeviceCounterConsumption};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let counters = |n: u32| {
            (0..n)
                .map(|k| {
                    (
                        format!("core-{k}"),
                        Counter {
                            value: Quantity("1".into()),
                        },
                    )
                })
                .collect()
        };
        // 16 chips of 8 cores: 16 whole-chip devices + 128 cores, 16 sets.
        let sets: Vec<CounterSet> = (0..16)
            .rev()
            .map(|c| CounterSet {
                name: format!("chip-{c:02}"),
                counters: counters(8),
            })
            .collect();
        let mut input = devices(144);
        for (i, d) in input.iter_mut().enumerate() {
            d.consumes_counters = Some(vec![DeviceCounterConsumption {
                counter_set: format!("chip-{:02}", i % 16),
                counters: counters(1),
            }]);
        }
        let pool = desired_pool_with_counters(DRIVER, "node-a", None, &input, &sets);
        let shape: Vec<(usize, Vec<String>)> = pool
            .slices
            .iter()
            .map(|s| {
                assert!(
                    s.spec.devices.is_none() || s.spec.shared_counters.is_none(),
                    "a slice carries devices or counters, never both"
                );
                assert_eq!(s.spec.pool.resource_slice_count, 5);
                (
                    s.spec.devices.as_ref().map_or(0, Vec::len),
                    s.spec
                        .shared_counters
                        .iter()
                        .flatten()
                        .map(|c| c.name.clone())
                        .collect(),
                )
            })
            .collect();
        let names = |r: std::ops::Range<u32>| r.map(|c| format!("chip-{c:02}")).collect();
        assert_eq!(
            shape,
            vec![
                (64, vec![]),
                (64, vec![]),
                (16, vec![]),
                (0, names(0..8)),
                (0, names(8..16)),
            ]
        );
        let slice_names: Vec<_> = pool
            .slices
            .iter()
            .map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(
            slice_names[4].as_deref(),
            Some("node-a-efa.networking.k8s.aws-4")
        );
        // Counter sets without devices still make a pool, without an empty
        // device slice.
        let only = desired_pool_with_counters(DRIVER, "n", None, &[], &sets[..1]);
        assert_eq!(only.slices.len(), 1);
        assert!(only.slices[0].spec.devices.is_none());
    }

    #[test]
    fn deterministic_and_owner_optional() {
        let a = desired_slices(DRIVER, "n", None, &devices(5));
        let b = desired_slices(DRIVER, "n", None, &devices(5));
        assert_eq!(
            serde_json::to_string(&a).ok(),
            serde_json::to_string(&b).ok()
        );
        assert_eq!(a[0].metadata.owner_references, None);
        let r = owner().owner_reference();
        assert_eq!(
            (r.kind.as_str(), r.api_version.as_str(), r.controller),
            ("Node", "v1", Some(true))
        );
    }

    #[test]
    fn invalid_devices_do_not_reach_slices() {
        let mut input = devices(2);
        input.push(Device {
            name: "Not_A_Label".into(),
            ..Default::default()
        });
        let pool = desired_pool(DRIVER, "n", None, &input);
        assert_eq!(pool.device_count, 2);
        assert_eq!(pool.issues.len(), 1);
    }

    #[test]
    fn long_names_stay_valid_and_unique() {
        let base = format!("{}.", "a".repeat(60)).repeat(4); // 244 characters
        let node = format!("{base}x");
        let names: Vec<String> = (0..3).map(|i| slice_name(&node, DRIVER, i)).collect();
        for n in &names {
            assert!(n.len() <= 253, "{n}");
            assert!(is_dns_subdomain(n), "{n}");
        }
        assert_ne!(names[0], names[1]);
        let other = slice_name(&format!("{base}y"), DRIVER, 0);
        assert_ne!(
            names[0], other,
            "hash separates prefixes cut to the same text"
        );
    }
}
