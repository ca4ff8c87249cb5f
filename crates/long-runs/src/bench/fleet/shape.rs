//! What one simulated node publishes: the pools of its instance type's
//! drivers, taken from what our drivers' `discover` prints for the
//! instance's fixture, so the fleet publishes byte for byte what real nodes
//! would (attributes, capacities, counter sets, chunking into slices).
//!
//! A trn2 node runs two drivers, so it has two pools under two driver
//! names, each published by a publisher of its own (two processes on a real
//! node, so two API clients here too).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use dra_core::testing::PoolContent;
use k8s_openapi::api::resource::v1::ResourceSlice;
use local_cluster::error::{Error, Result};
use serde::Serialize;

/// The simulated EFA driver's name.
pub const EFA_DRIVER: &str = "efa.fleet.bench.aws-dra.dev";
/// The simulated Neuron driver's name.
pub const NEURON_DRIVER: &str = "neuron.fleet.bench.aws-dra.dev";

/// An instance type and how its drivers are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetShape {
    /// p5.48xlarge: 32 EFAs, one slice.
    P5,
    /// trn2.48xlarge with NeuronCore partitions (`--partitions cores`):
    /// 16 chips and their 128 cores on 16 counter sets, and 16 EFAs.
    Trn2Cores,
    /// trn2.48xlarge with whole chips only: 16 chips and 16 EFAs.
    Trn2Chips,
}

impl FleetShape {
    pub const ALL: [FleetShape; 3] = [FleetShape::P5, FleetShape::Trn2Cores, FleetShape::Trn2Chips];

    pub fn name(self) -> &'static str {
        match self {
            FleetShape::P5 => "p5",
            FleetShape::Trn2Cores => "trn2-cores",
            FleetShape::Trn2Chips => "trn2-chips",
        }
    }

    fn instance_type(self) -> &'static str {
        match self {
            FleetShape::P5 => "p5.48xlarge",
            FleetShape::Trn2Cores | FleetShape::Trn2Chips => "trn2.48xlarge",
        }
    }

    /// `NEURON_PARTITIONS` for the Neuron driver; `None`: no Neuron pool.
    fn neuron_partitions(self) -> Option<&'static str> {
        match self {
            FleetShape::P5 => None,
            FleetShape::Trn2Cores => Some("cores"),
            FleetShape::Trn2Chips => Some("chips"),
        }
    }
}

impl fmt::Display for FleetShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FleetShape {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        FleetShape::ALL
            .into_iter()
            .find(|shape| shape.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = FleetShape::ALL.iter().map(|s| s.name()).collect();
                format!("unknown node shape {s:?} (one of {})", names.join(", "))
            })
    }
}

/// One pool every simulated node of a shape publishes.
#[derive(Debug, Clone)]
pub struct NodePool {
    pub driver: &'static str,
    pub content: PoolContent,
    /// Slices the driver's `discover` cut the pool into.
    pub slices: usize,
}

/// A pool's size, for the report.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct PoolSize {
    pub driver: String,
    pub devices: usize,
    pub counter_sets: usize,
    pub slices: usize,
    /// The pool's slices as JSON, bytes (what each node stores in etcd).
    pub json_bytes: usize,
}

impl NodePool {
    fn size(&self, json_bytes: usize) -> PoolSize {
        PoolSize {
            driver: self.driver.to_string(),
            devices: self.content.devices.len(),
            counter_sets: self.content.counter_sets.len(),
            slices: self.slices,
            json_bytes,
        }
    }
}

/// The pools of `shape`, from `efa-driver discover` and `neuron-driver
/// discover` of its fixture (written under `run_dir`).
pub fn node_pools(
    shape: FleetShape,
    efa_driver: &Path,
    neuron_driver: &Path,
    run_dir: &Path,
) -> Result<Vec<(NodePool, PoolSize)>> {
    let fixture = sysfs_fixtures::generate(
        shape.instance_type(),
        &run_dir.join(format!("fleet-fixture-{shape}")),
    )?;
    let mut drivers = vec![(EFA_DRIVER, efa_driver, None)];
    if let Some(partitions) = shape.neuron_partitions() {
        drivers.push((NEURON_DRIVER, neuron_driver, Some(partitions)));
    }
    let mut pools = Vec::new();
    for (driver, binary, partitions) in drivers {
        let env: Vec<(&str, &str)> = partitions
            .map(|p| ("NEURON_PARTITIONS", p))
            .into_iter()
            .collect();
        let out = run_dir.join(format!("fleet-slices-{shape}-{driver}.json"));
        crate::bench::refdriver::discover_devices(
            binary,
            &env,
            &fixture.sys,
            &fixture.dev,
            "template",
            &out,
        )?;
        let text =
            std::fs::read_to_string(&out).map_err(local_cluster::error::io("reading", &out))?;
        let (content, slices) = pool_from_discover(&text, &out.display().to_string())?;
        let pool = NodePool {
            driver,
            content,
            slices,
        };
        let size = pool.size(text.len());
        pools.push((pool, size));
    }
    Ok(pools)
}

/// The devices and counter sets of a `discover --output json` slice list,
/// and how many slices it has.
pub fn pool_from_discover(text: &str, what: &str) -> Result<(PoolContent, usize)> {
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<ResourceSlice>,
    }
    let list: List = serde_json::from_str(text).map_err(|source| Error::Json {
        what: what.to_string(),
        source,
    })?;
    let slices = list.items.len();
    let mut content = PoolContent::default();
    for slice in list.items {
        content
            .devices
            .extend(slice.spec.devices.unwrap_or_default());
        content
            .counter_sets
            .extend(slice.spec.shared_counters.unwrap_or_default());
    }
    if content.devices.is_empty() {
        return Err(Error::Testbed(format!("{what}: no devices")));
    }
    Ok((content, slices))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shape_names_round_trip_and_unknown_ones_are_refused() {
        for shape in FleetShape::ALL {
            assert_eq!(shape.name().parse::<FleetShape>(), Ok(shape));
        }
        let err = "trn1".parse::<FleetShape>().unwrap_err();
        assert!(err.contains("p5, trn2-cores, trn2-chips"), "{err}");
    }

    #[test]
    fn discover_output_gives_devices_and_counter_sets_of_every_slice() {
        let slice = |devices: serde_json::Value, counters: serde_json::Value| {
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "s"},
                "spec": {
                    "driver": "d", "nodeName": "template",
                    "pool": {"name": "template", "generation": 1, "resourceSliceCount": 3},
                    "devices": devices, "sharedCounters": counters,
                },
            })
        };
        let list = json!({"items": [
            slice(json!([{"name": "a"}, {"name": "b"}]), json!(null)),
            slice(json!([{"name": "c"}]), json!(null)),
            slice(json!(null), json!([{"name": "chip-0", "counters": {}}])),
        ]});
        let (content, slices) = pool_from_discover(&list.to_string(), "list").unwrap();
        assert_eq!(slices, 3);
        let names: Vec<&str> = content.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(content.counter_sets.len(), 1);
        assert_eq!(content.counter_sets[0].name, "chip-0");

        let empty = json!({"items": [slice(json!(null), json!(null))]});
        assert!(pool_from_discover(&empty.to_string(), "empty").is_err());
        assert!(pool_from_discover("{", "broken").is_err());
    }
}
