//! The devices the scheduler can see, flattened out of ResourceSlices, with
//! who holds each and how much of each shared counter is left.
//!
//! Built once per run; every explanation reads from it. Pools follow the
//! scheduler's rule: only the highest generation counts, and only when all
//! `resourceSliceCount` slices of it are there.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceTaint, ResourceClaim};

use crate::cel::{DeviceValue, Environment, split_attribute_name};
use crate::inventory::Inventory;
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
    fn from_api(attr: &DeviceAttribute) -> Option<AttributeValue> {
        if let Some(s) = &attr.string {
            Some(AttributeValue::String(s.clone()))
        } else if let Some(i) = attr.int {
            Some(AttributeValue::Int(i))
        } else if let Some(b) = attr.bool {
            Some(AttributeValue::Bool(b))
        } else {
            attr.version.clone().map(AttributeValue::Version)
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
    pub slice: &'a str,
    /// The node it is on; `None` when the slice serves many nodes.
    pub node: Option<&'a str>,
    pub device: &'a Device,
    pub value: DeviceValue,
    /// Why the scheduler ignores the whole pool, if it does.
    pub pool_problem: Option<String>,
    /// Taints from DeviceTaintRules that select it: (rule name, taint).
    pub rule_taints: Vec<(String, DeviceTaint)>,
}

impl PublishedDevice<'_> {
    /// A fully qualified attribute (`domain/name`); the driver's own domain
    /// may also be written without the domain in the slice.
    pub fn attribute(&self, qualified: &str) -> Option<AttributeValue> {
        let attrs = self.device.attributes.as_ref()?;
        if let Some(a) = attrs.get(qualified) {
            return AttributeValue::from_api(a);
        }
        let (domain, name) = split_attribute_name(&self.id.driver, qualified);
        if domain == self.id.driver {
            return attrs.get(name).and_then(AttributeValue::from_api);
        }
        None
    }

    /// Counters consumed: (counter set, counter) → amount.
    pub fn consumption(&self) -> Vec<(String, String, Quantity)> {
        let mut out = Vec::new();
        for c in self.device.consumes_counters.iter().flatten() {
            for (name, counter) in &c.counters {
                if let Ok(q) = Quantity::parse(&counter.value.0) {
                    out.push((c.counter_set.clone(), name.clone(), q));
                }
            }
        }
        out
    }
}

/// Counter key: driver, pool, counter set, counter.
pub type CounterKey = (String, String, String, String);

pub struct World<'a> {
    pub env: Environment,
    pub devices: Vec<PublishedDevice<'a>>,
    /// Device → claims (namespace/name) whose allocation holds it.
    pub holders: HashMap<DeviceId, Vec<String>>,
    /// Device → claims allocated with admin access (they hold nothing:
    /// the scheduler lets other claims have the device too).
    pub admin_holders: HashMap<DeviceId, Vec<String>>,
    /// What is left of each shared counter after every allocated claim.
    pub counters_left: HashMap<CounterKey, Quantity>,
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
    pub fn new(inventory: &'a Inventory) -> World<'a> {
        // Highest generation and slice count per pool.
        let mut pools: HashMap<(&str, &str), (i64, i64, usize)> = HashMap::new();
        for slice in &inventory.slices {
            let key = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
            let entry = pools.entry(key).or_insert((i64::MIN, 0, 0));
            let generation = slice.spec.pool.generation;
            if generation > entry.0 {
                *entry = (generation, slice.spec.pool.resource_slice_count, 1);
            } else if generation == entry.0 {
                entry.2 += 1;
            }
        }
        let mut devices = Vec::new();
        let mut counters_left: HashMap<CounterKey, Quantity> = HashMap::new();
        for slice in &inventory.slices {
            let spec = &slice.spec;
            let Some(&(generation, want, have)) =
                pools.get(&(spec.driver.as_str(), spec.pool.name.as_str()))
            else {
                continue;
            };
            if spec.pool.generation < generation {
                continue; // superseded: the scheduler ignores it
            }
            let pool_problem = (usize::try_from(want).unwrap_or(0) > have).then(|| {
                format!(
                    "pool {} of {} is incomplete ({have} of {want} slices of generation {generation})",
                    spec.pool.name, spec.driver
                )
            });
            for set in spec.shared_counters.iter().flatten() {
                for (name, counter) in &set.counters {
                    if let Ok(q) = Quantity::parse(&counter.value.0) {
                        counters_left.insert(
                            (
                                spec.driver.clone(),
                                spec.pool.name.clone(),
                                set.name.clone(),
                                name.clone(),
                            ),
                            q,
                        );
                    }
                }
            }
            let slice_name = slice.metadata.name.as_deref().unwrap_or("");
            for device in spec.devices.iter().flatten() {
                let node = spec.node_name.as_deref().or(device.node_name.as_deref());
                devices.push(PublishedDevice {
                    id: DeviceId {
                        driver: spec.driver.clone(),
                        pool: spec.pool.name.clone(),
                        device: device.name.clone(),
                    },
                    slice: slice_name,
                    node,
                    device,
                    value: DeviceValue::new(&spec.driver, device),
                    pool_problem: pool_problem.clone(),
                    rule_taints: inventory
                        .taint_rules
                        .iter()
                        .filter(|r| r.selects(&spec.driver, &spec.pool.name, &device.name))
                        .map(|r| (r.name.clone(), r.taint.clone()))
                        .collect(),
                });
            }
        }
        let mut holders: HashMap<DeviceId, Vec<String>> = HashMap::new();
        let mut admin_holders: HashMap<DeviceId, Vec<String>> = HashMap::new();
        let by_id: HashMap<&DeviceId, usize> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (&d.id, i))
            .collect();
        let mut consumed: Vec<(CounterKey, Quantity)> = Vec::new();
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
                    for (set, counter, q) in devices[i].consumption() {
                        consumed.push(((id.driver.clone(), id.pool.clone(), set, counter), q));
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
            holders,
            admin_holders,
            counters_left,
            inventory,
        }
    }

    /// Node names that publish devices, sorted.
    pub fn nodes(&self) -> Vec<&'a str> {
        let mut nodes: Vec<&str> = self.devices.iter().filter_map(|d| d.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }

    pub fn counters_snapshot(&self) -> BTreeMap<CounterKey, Quantity> {
        self.counters_left
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }
}
