//! The devices the scheduler can see, flattened out of ResourceSlices, with
//! who holds each and how much of each shared counter is left.
//!
//! Built once per run; every explanation reads from it. Pools follow the
//! scheduler's rule: only the highest generation counts, and only when all
//! `resourceSliceCount` slices of it are there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceClaim};

use crate::cel::{DeviceValue, Environment, Outcome, Reads, Selector, split_attribute_name};
use crate::inventory::Inventory;
use crate::slices::{Attribute, Slice, SliceDevice};
use k8s_quantity::Quantity;

/// Driver, pool and device name: how allocation results name a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A typed attribute value, compared as the scheduler compares them for
/// `matchAttribute` (same type and same value).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttributeValue {
    Int(i64),
    Bool(bool),
    String(String),
    Version(String),
}

impl std::fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttributeValue::Int(i) => write!(f, "{i}"),
            AttributeValue::Bool(b) => write!(f, "{b}"),
            AttributeValue::String(s) => write!(f, "{s:?}"),
            AttributeValue::Version(v) => write!(f, "version {v}"),
        }
    }
}

impl AttributeValue {
    pub fn from_slice(attr: &Attribute) -> AttributeValue {
        match attr {
            Attribute::String(s) => AttributeValue::String(s.to_string()),
            Attribute::Int(i) => AttributeValue::Int(*i),
            Attribute::Bool(b) => AttributeValue::Bool(*b),
            Attribute::Version(v) => AttributeValue::Version(v.to_string()),
        }
    }

    /// Bare value for tables.
    pub fn plain(&self) -> String {
        match self {
            AttributeValue::String(s) | AttributeValue::Version(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// One published device.
#[derive(Debug)]
pub struct PublishedDevice<'a> {
    pub id: DeviceId,
    /// The slice that publishes it.
    pub source: &'a Slice,
    pub slice: &'a str,
    /// The node it is on; `None` when the slice serves many nodes.
    pub node: Option<&'a str>,
    pub device: &'a SliceDevice,
    /// Why the scheduler ignores the whole pool, if it does.
    pub pool_problem: Option<String>,
    /// Taints from DeviceTaintRules that select it: (rule name, taint).
    pub rule_taints: Vec<(String, DeviceTaint)>,
}

impl PublishedDevice<'_> {
    /// A fully qualified attribute (`domain/name`); the driver's own domain
    /// may also be written without the domain in the slice.
    pub fn attribute(&self, qualified: &str) -> Option<AttributeValue> {
        if let Some(a) = self.device.attribute(qualified) {
            return a.as_ref().map(AttributeValue::from_slice);
        }
        let (domain, name) = split_attribute_name(&self.id.driver, qualified);
        if domain == self.id.driver {
            return self
                .device
                .attribute(name)
                .and_then(|a| a.as_ref().map(AttributeValue::from_slice));
        }
        None
    }

    /// Counters consumed: (driver, pool, counter set, counter) → amount.
    pub fn consumption(&self) -> impl Iterator<Item = (CounterKey, Quantity)> + '_ {
        self.device.consumes.iter().map(|c| {
            (
                (
                    self.source.driver.clone(),
                    self.source.pool.clone(),
                    c.counter_set.clone(),
                    c.counter.clone(),
                ),
                c.amount,
            )
        })
    }

    /// The device as the `device` variable of a CEL selector, with the
    /// fields the selector reads (built on demand: kept for every device of
    /// a fleet they would be most of the memory).
    pub fn value(&self, reads: Reads) -> DeviceValue {
        DeviceValue::of(&self.source.driver, self.device, reads)
    }

    /// What `selector` says about this device.
    pub fn evaluate(&self, env: &Environment, selector: &Selector) -> Outcome {
        selector.evaluate_on(env, &self.source.driver, self.device)
    }
}

/// Counter key: driver, pool, counter set, counter.
pub type CounterKey = (Arc<str>, Arc<str>, Arc<str>, Arc<str>);

pub struct World<'a> {
    pub env: Environment,
    pub devices: Vec<PublishedDevice<'a>>,
    /// Node → its devices (indices into `devices`), nodes in order.
    by_node: BTreeMap<&'a str, Vec<usize>>,
    /// Device → its index in `devices`.
    by_id: HashMap<DeviceId, usize>,
    /// Device → claims (namespace/name) whose allocation holds it.
    pub holders: HashMap<DeviceId, Vec<String>>,
    /// Device → claims allocated with admin access (they hold nothing:
    /// the scheduler lets other claims have the device too).
    pub admin_holders: HashMap<DeviceId, Vec<String>>,
    /// What is left of each shared counter after every allocated claim.
    pub counters_left: HashMap<CounterKey, Quantity>,
    /// Device → (claim, capacity, amount) for each capacity an allocated
    /// claim consumes of a device that allows multiple allocations.
    pub consumed_capacity: HashMap<DeviceId, Vec<(String, String, Quantity)>>,
    pub inventory: &'a Inventory,
}

pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or("default"),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

impl<'a> World<'a> {
    /// The claims holding device `id`, admin-access ones marked `(admin)`.
    pub fn holders_of(&self, id: &DeviceId) -> Vec<String> {
        self.holders
            .get(id)
            .into_iter()
            .flatten()
            .cloned()
            .chain(
                self.admin_holders
                    .get(id)
                    .into_iter()
                    .flatten()
                    .map(|c| format!("{c} (admin)")),
            )
            .collect()
    }

    /// How much of `capacity` of device `id` the allocated claims other than
    /// `except` consume; `None`: none of it.
    pub fn capacity_used(
        &self,
        id: &DeviceId,
        capacity: &str,
        except: Option<&str>,
    ) -> Option<Quantity> {
        self.consumed_capacity
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(claim, name, _)| name == capacity && Some(claim.as_str()) != except)
            .map(|(_, _, q)| *q)
            .reduce(|sum, q| sum.checked_add(q).unwrap_or(sum))
    }

    pub fn new(inventory: &'a Inventory) -> World<'a> {
        // Highest generation and slice count per pool.
        let mut pools: HashMap<(&str, &str), (i64, i64, usize)> = HashMap::new();
        for slice in &inventory.slices {
            let key = (slice.driver.as_ref(), slice.pool.as_ref());
            let entry = pools.entry(key).or_insert((i64::MIN, 0, 0));
            let generation = slice.generation;
            if generation > entry.0 {
                *entry = (generation, slice.resource_slice_count, 1);
            } else if generation == entry.0 {
                entry.2 += 1;
            }
        }
        let mut devices = Vec::new();
        let mut counters_left: HashMap<CounterKey, Quantity> = HashMap::new();
        for slice in &inventory.slices {
            let Some(&(generation, want, have)) =
                pools.get(&(slice.driver.as_ref(), slice.pool.as_ref()))
            else {
                continue;
            };
            if slice.generation < generation {
                continue; // superseded: the scheduler ignores it
            }
            let pool_problem = (usize::try_from(want).unwrap_or(0) > have).then(|| {
                format!(
                    "pool {} of {} is incomplete ({have} of {want} slices of generation {generation})",
                    slice.pool, slice.driver
                )
            });
            for c in &slice.shared_counters {
                counters_left.insert(
                    (
                        slice.driver.clone(),
                        slice.pool.clone(),
                        c.counter_set.clone(),
                        c.counter.clone(),
                    ),
                    c.amount,
                );
            }
            for device in &slice.devices {
                let node = slice.node_name.as_deref().or(device.node_name.as_deref());
                devices.push(PublishedDevice {
                    id: DeviceId {
                        driver: slice.driver.to_string(),
                        pool: slice.pool.to_string(),
                        device: device.name.to_string(),
                    },
                    source: slice,
                    slice: &slice.name,
                    node,
                    device,
                    pool_problem: pool_problem.clone(),
                    rule_taints: inventory
                        .taint_rules
                        .iter()
                        .filter(|r| r.selects(&slice.driver, &slice.pool, &device.name))
                        .map(|r| (r.name.clone(), r.taint.clone()))
                        .collect(),
                });
            }
        }
        let mut by_node: BTreeMap<&'a str, Vec<usize>> = BTreeMap::new();
        for (i, d) in devices.iter().enumerate() {
            if let Some(n) = d.node {
                by_node.entry(n).or_default().push(i);
            }
        }
        let mut holders: HashMap<DeviceId, Vec<String>> = HashMap::new();
        let mut admin_holders: HashMap<DeviceId, Vec<String>> = HashMap::new();
        let by_id: HashMap<DeviceId, usize> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.clone(), i))
            .collect();
        let mut consumed: Vec<(CounterKey, Quantity)> = Vec::new();
        let mut consumed_capacity: HashMap<DeviceId, Vec<(String, String, Quantity)>> =
            HashMap::new();
        for claim in &inventory.claims {
            let results = claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_deref())
                .unwrap_or_default();
            for result in results {
                let id = DeviceId {
                    driver: result.driver.clone(),
                    pool: result.pool.clone(),
                    device: result.device.clone(),
                };
                if result.admin_access != Some(true)
                    && let Some(&i) = by_id.get(&id)
                {
                    consumed.extend(devices[i].consumption());
                }
                // What a share of a device takes, as the scheduler recorded it.
                for (name, q) in result.consumed_capacity.iter().flatten() {
                    if let Ok(q) = Quantity::parse(&q.0) {
                        consumed_capacity.entry(id.clone()).or_default().push((
                            claim_key(claim),
                            name.clone(),
                            q,
                        ));
                    }
                }
                let by = if result.admin_access == Some(true) {
                    &mut admin_holders
                } else {
                    &mut holders
                };
                by.entry(id).or_default().push(claim_key(claim));
            }
        }
        for (key, q) in consumed {
            if let Some(left) = counters_left.get_mut(&key)
                && let Some(rest) = left.checked_sub(q)
            {
                *left = rest;
            }
        }
        World {
            env: Environment::new(),
            devices,
            by_node,
            by_id,
            holders,
            admin_holders,
            counters_left,
            consumed_capacity,
            inventory,
        }
    }

    /// The devices of one node (indices into `devices`, in slice order).
    pub fn on_node(&self, node: &str) -> &[usize] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// The index of a device in `devices`.
    pub fn index_of(&self, id: &DeviceId) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Node names that publish devices, sorted.
    pub fn nodes(&self) -> Vec<&'a str> {
        self.by_node.keys().copied().collect()
    }

    pub fn counters_snapshot(&self) -> BTreeMap<CounterKey, Quantity> {
        self.counters_left
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}
