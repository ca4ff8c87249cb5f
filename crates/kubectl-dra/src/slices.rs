//! ResourceSlices as kubectl-dra keeps them: only what allocation reads,
//! with the strings that repeat across a fleet stored once.
//!
//! A 1,000-node fleet publishes ~100,000 devices, and every node repeats
//! the same attribute names, driver, instance type, counter-set layout and
//! capacities. Held as k8s-openapi trees (a `BTreeMap` of four-`Option`
//! structs per device, each name its own `String`) that was most of the
//! 3.4 GiB `kubectl dra` needed; here a device is a few sorted vectors of
//! shared `Arc<str>`s (about 1 KiB on a trn2 NeuronCore partition), and the
//! fields allocation never reads (binding conditions, node selectors,
//! managed fields) are not kept at all.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourceSlice,
};
use k8s_quantity::Quantity;

/// Stores each distinct string once; every slice loaded into one
/// inventory shares them.
#[derive(Debug, Default, Clone)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
}

impl Interner {
    pub fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(existing) = self.strings.get(s) {
            return existing.clone();
        }
        let new: Arc<str> = Arc::from(s);
        self.strings.insert(new.clone());
        new
    }
}

/// An attribute's value as published: the one of `string`, `int`, `bool`,
/// `version` that is set (in that order, as the API reads them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Attribute {
    String(Arc<str>),
    Int(i64),
    Bool(bool),
    Version(Arc<str>),
}

impl Attribute {
    fn from_api(attr: &DeviceAttribute, strings: &mut Interner) -> Option<Attribute> {
        if let Some(s) = &attr.string {
            Some(Attribute::String(strings.get(s)))
        } else if let Some(i) = attr.int {
            Some(Attribute::Int(i))
        } else if let Some(b) = attr.bool {
            Some(Attribute::Bool(b))
        } else {
            attr.version
                .as_deref()
                .map(|v| Attribute::Version(strings.get(v)))
        }
    }
}

/// Counters a device takes from one of its pool's counter sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumption {
    pub counter_set: Arc<str>,
    pub counter: Arc<str>,
    pub amount: Quantity,
}

/// A capacity of a device that allows multiple allocations, parsed: its
/// value and request policy, what the scheduler adds claims up against
/// (consumable capacity). Amounts that do not parse are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumableCapacity {
    pub value: Quantity,
    pub default: Option<Quantity>,
    /// `validValues`, ascending as the API requires.
    pub valid_values: Vec<Quantity>,
    /// `validRange`: its `min`, `max` and `step`.
    pub range: Option<(Quantity, Option<Quantity>, Option<Quantity>)>,
}

impl ConsumableCapacity {
    fn from_api(capacity: &DeviceCapacity) -> Option<ConsumableCapacity> {
        let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
            Quantity::parse(&q.0).ok()
        };
        let policy = capacity.request_policy.as_ref();
        Some(ConsumableCapacity {
            value: parse(&capacity.value)?,
            default: policy.and_then(|p| p.default.as_ref()).and_then(parse),
            valid_values: policy
                .and_then(|p| p.valid_values.as_ref())
                .into_iter()
                .flatten()
                .filter_map(parse)
                .collect(),
            range: policy.and_then(|p| p.valid_range.as_ref()).and_then(|r| {
                Some((
                    parse(&r.min)?,
                    r.max.as_ref().and_then(parse),
                    r.step.as_ref().and_then(parse),
                ))
            }),
        })
    }
}

/// One device of a slice.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceDevice {
    pub name: Arc<str>,
    pub node_name: Option<Arc<str>>,
    /// Sorted by name, as the API's map; `None`: no value set.
    pub attributes: Vec<(Arc<str>, Option<Attribute>)>,
    /// Name and quantity as published, sorted by name.
    pub capacity: Vec<(Arc<str>, Arc<str>)>,
    /// Only amounts that parse as quantities (the scheduler cannot use others).
    pub consumes: Vec<Consumption>,
    pub taints: Vec<DeviceTaint>,
    pub allow_multiple_allocations: Option<bool>,
    /// Only on devices that allow multiple allocations; sorted by name.
    pub consumable: Vec<(Arc<str>, ConsumableCapacity)>,
}

impl SliceDevice {
    pub fn from_api(device: &Device, strings: &mut Interner) -> SliceDevice {
        SliceDevice {
            name: strings.get(&device.name),
            node_name: device.node_name.as_deref().map(|n| strings.get(n)),
            attributes: device
                .attributes
                .iter()
                .flatten()
                .map(|(k, v)| (strings.get(k), Attribute::from_api(v, strings)))
                .collect(),
            capacity: device
                .capacity
                .iter()
                .flatten()
                .map(|(k, c)| (strings.get(k), strings.get(&c.value.0)))
                .collect(),
            consumes: device
                .consumes_counters
                .iter()
                .flatten()
                .flat_map(|c| c.counters.iter().map(move |(n, v)| (c, n, v)))
                .filter_map(|(c, name, counter)| {
                    Quantity::parse(&counter.value.0)
                        .ok()
                        .map(|amount| Consumption {
                            counter_set: strings.get(&c.counter_set),
                            counter: strings.get(name),
                            amount,
                        })
                })
                .collect(),
            taints: device.taints.clone().unwrap_or_default(),
            allow_multiple_allocations: device.allow_multiple_allocations,
            consumable: if device.allow_multiple_allocations == Some(true) {
                device
                    .capacity
                    .iter()
                    .flatten()
                    .filter_map(|(k, c)| {
                        ConsumableCapacity::from_api(c).map(|c| (strings.get(k), c))
                    })
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// The attribute stored under exactly this name.
    pub fn attribute(&self, name: &str) -> Option<&Option<Attribute>> {
        self.attributes
            .binary_search_by(|(k, _)| k.as_ref().cmp(name))
            .ok()
            .map(|i| &self.attributes[i].1)
    }
}

/// A shared counter of a pool and how much of it there is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCounter {
    pub counter_set: Arc<str>,
    pub counter: Arc<str>,
    pub amount: Quantity,
}

/// One ResourceSlice.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// `metadata.name` (empty when unset).
    pub name: Arc<str>,
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub generation: i64,
    pub resource_slice_count: i64,
    pub node_name: Option<Arc<str>>,
    /// In publication order; amounts that do not parse are left out.
    pub shared_counters: Vec<SharedCounter>,
    pub devices: Vec<SliceDevice>,
}

impl Slice {
    pub fn from_api(slice: &ResourceSlice, strings: &mut Interner) -> Slice {
        let spec = &slice.spec;
        Slice {
            name: strings.get(slice.metadata.name.as_deref().unwrap_or("")),
            driver: strings.get(&spec.driver),
            pool: strings.get(&spec.pool.name),
            generation: spec.pool.generation,
            resource_slice_count: spec.pool.resource_slice_count,
            node_name: spec.node_name.as_deref().map(|n| strings.get(n)),
            shared_counters: spec
                .shared_counters
                .iter()
                .flatten()
                .flat_map(|set| set.counters.iter().map(move |(n, c)| (set, n, c)))
                .filter_map(|(set, name, counter)| {
                    Quantity::parse(&counter.value.0)
                        .ok()
                        .map(|amount| SharedCounter {
                            counter_set: strings.get(&set.name),
                            counter: strings.get(name),
                            amount,
                        })
                })
                .collect(),
            devices: spec
                .devices
                .iter()
                .flatten()
                .map(|d| SliceDevice::from_api(d, strings))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_strings_are_stored_once() {
        let mut strings = Interner::default();
        let a = strings.get("trn2.48xlarge");
        let b = strings.get(&String::from("trn2.48xlarge"));
        assert!(Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn keeps_what_allocation_reads() {
        let text = include_str!("../tests/fixtures/trn2-cores-neuron.yaml");
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{e}"));
        let list = &docs[0];
        let slice: ResourceSlice =
            serde_json::from_value(list["items"][0].clone()).unwrap_or_else(|e| panic!("{e}"));
        let mut strings = Interner::default();
        let compact = Slice::from_api(&slice, &mut strings);
        let devices = slice.spec.devices.as_deref().unwrap_or_default();
        assert_eq!(compact.devices.len(), devices.len());
        for (c, d) in compact.devices.iter().zip(devices) {
            assert_eq!(&*c.name, d.name);
            let names: Vec<&str> = c.attributes.iter().map(|(k, _)| k.as_ref()).collect();
            let want: Vec<&str> = d
                .attributes
                .iter()
                .flatten()
                .map(|(k, _)| k.as_str())
                .collect();
            assert_eq!(names, want);
            let counters: usize = d
                .consumes_counters
                .iter()
                .flatten()
                .map(|c| c.counters.len())
                .sum();
            assert_eq!(c.consumes.len(), counters);
        }
        assert_eq!(
            compact.devices[0].attribute("deviceId"),
            Some(&Some(Attribute::Int(0)))
        );
        assert_eq!(compact.devices[0].attribute("nope"), None);
    }
}
