//! What one shadow node of each shape publishes: the ResourceSlices our
//! drivers' own `discover` prints for a fixture (never hand-written), or,
//! for AWS's shape, those slices cut down to what AWS's drivers publish
//! (`shared/reference/aws-drivers.md`); the DeviceClasses each shape's
//! claims go through; and the copy of a node's slices for another node.
//!
//! Slices are kept as raw JSON so that fields newer than our API types
//! (counter sets, `consumesCounters`) reach the API server unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Map, Value, json};

use super::claims::{ClaimKind, EFA_DRIVER, NEURON_DRIVER};
use local_cluster::error::{Error, Result};

/// The label of every object the bench creates cluster-wide.
pub const LABEL: &str = "bench.aws-dra.dev/scheduler";
/// The node name the templates are discovered under (replaced per node).
const TEMPLATE_NODE: &str = "template";

/// DRANET's driver name: AWS's EFA DeviceClass selects its devices.
pub const DRANET_DRIVER: &str = "dra.net";

/// A node shape under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// p5.48xlarge: our EFA slice and the test GPU driver's GPUs.
    P5,
    /// trn2.48xlarge, NeuronCores published as partitions of their chips.
    Trn2Cores,
    /// trn2.48xlarge, whole chips only.
    Trn2Chips,
    /// trn2.48xlarge as AWS's Neuron driver and DRANET publish it.
    Trn2Aws,
    /// A trn2u.48xlarge UltraServer member, whole chips and the whole-node device.
    Trn2u,
}

impl Shape {
    pub const ALL: [Shape; 5] = [
        Shape::P5,
        Shape::Trn2Cores,
        Shape::Trn2Chips,
        Shape::Trn2Aws,
        Shape::Trn2u,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::P5 => "p5",
            Shape::Trn2Cores => "trn2-cores",
            Shape::Trn2Chips => "trn2-chips",
            Shape::Trn2Aws => "trn2-aws",
            Shape::Trn2u => "trn2u",
        }
    }

    pub fn parse(name: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The fixture its slices are discovered from.
    pub fn fixture(self) -> &'static str {
        match self {
            Shape::P5 => "p5.48xlarge",
            Shape::Trn2Cores | Shape::Trn2Chips | Shape::Trn2Aws => "trn2.48xlarge",
            Shape::Trn2u => "trn2u.48xlarge",
        }
    }

    /// The claims its pods make, one phase each.
    pub fn claims(self) -> Vec<ClaimKind> {
        match self {
            Shape::P5 => vec![ClaimKind::GpuWithEfas { efas: 4 }],
            Shape::Trn2Cores | Shape::Trn2Chips | Shape::Trn2Aws => [1, 4, 8, 16]
                .into_iter()
                .map(|chips| ClaimKind::NeuronWithEfas { chips, efas: chips })
                .collect(),
            Shape::Trn2u => vec![ClaimKind::UltraServerNode],
        }
    }

    /// Whether the scheduler's CPU is profiled while this shape's pods are
    /// scheduled (the two shapes the partition default is decided between).
    pub fn profiled(self) -> bool {
        matches!(self, Shape::Trn2Cores | Shape::Trn2Chips)
    }
}

/// The driver binaries whose `discover` gives the slices.
#[derive(Debug, Clone)]
pub struct DriverBinaries {
    pub efa: PathBuf,
    pub neuron: PathBuf,
    /// `gpu-test-driver` (crates/e2e), the stand-in for NVIDIA's driver.
    pub gpu: PathBuf,
}

/// The DeviceClasses of each driver, as their charts render them.
#[derive(Debug, Clone, Default)]
pub struct ChartClasses {
    pub efa: Vec<Value>,
    pub neuron: Vec<Value>,
    pub gpu: Vec<Value>,
}

/// One node's slices and the classes its claims use.
#[derive(Debug, Clone)]
pub struct NodeTemplate {
    pub shape: Shape,
    pub slices: Vec<Value>,
    pub classes: Vec<Value>,
}

impl NodeTemplate {
    /// Discovers `shape`'s slices on its fixture, written under `scratch`.
    pub fn discover(
        shape: Shape,
        drivers: &DriverBinaries,
        classes: &ChartClasses,
        scratch: &Path,
    ) -> Result<NodeTemplate> {
        let fixture = sysfs_fixtures::generate(shape.fixture(), &scratch.join(shape.name()))?;
        let run = |binary: &Path, extra: &[&str]| {
            discover(binary, &fixture.sys, &fixture.dev, TEMPLATE_NODE, extra)
        };
        let mut slices = Vec::new();
        let class_list = match shape {
            Shape::P5 => {
                slices.extend(run(&drivers.efa, &[])?);
                slices.extend(run(&drivers.gpu, &[])?);
                [classes.efa.clone(), classes.gpu.clone()].concat()
            }
            Shape::Trn2Cores | Shape::Trn2Chips | Shape::Trn2u => {
                let partitions = if shape == Shape::Trn2Cores {
                    "cores"
                } else {
                    "chips"
                };
                slices.extend(run(&drivers.neuron, &["--partitions", partitions])?);
                slices.extend(run(&drivers.efa, &[])?);
                [classes.neuron.clone(), classes.efa.clone()].concat()
            }
            Shape::Trn2Aws => {
                let chips = run(&drivers.neuron, &["--partitions", "chips"])?;
                slices.extend(aws_neuron_slices(&chips));
                let efas = run(&drivers.efa, &[])?;
                slices.extend(dranet_slices(&efas));
                aws_classes()
            }
        };
        if slices.is_empty() {
            return Err(Error::Testbed(format!(
                "{}: discover printed no slices",
                shape.name()
            )));
        }
        Ok(NodeTemplate {
            shape,
            slices,
            classes: class_list,
        })
    }

    /// Devices over all slices.
    pub fn devices(&self) -> usize {
        self.slices.iter().map(|s| devices(s).len()).sum()
    }

    /// Shared counter sets over all slices.
    pub fn counter_sets(&self) -> usize {
        self.slices
            .iter()
            .map(|s| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len))
            .sum()
    }

    /// The JSON size of the slices' specs: what each node adds to what the
    /// scheduler and every watcher of slices hold.
    pub fn spec_bytes(&self) -> usize {
        self.slices
            .iter()
            .map(|s| serde_json::to_vec(&s["spec"]).map_or(0, |v| v.len()))
            .sum()
    }

    /// The slices of node `node` (its UID for the owner reference).
    pub fn for_node(&self, node: &str, node_uid: &str) -> Vec<Value> {
        self.slices
            .iter()
            .enumerate()
            .map(|(i, s)| slice_for_node(s, i, node, node_uid))
            .collect()
    }
}

/// `<binary> discover` of a fixture: the slices it would publish.
fn discover(
    binary: &Path,
    sys: &Path,
    dev: &Path,
    node: &str,
    extra: &[&str],
) -> Result<Vec<Value>> {
    let command = format!("{} discover {}", binary.display(), extra.join(" "));
    let output = Command::new(binary)
        .arg("discover")
        .arg("--sysfs-root")
        .arg(sys)
        .arg("--dev-root")
        .arg(dev)
        .arg("--node-name")
        .arg(node)
        .args(["--output", "json"])
        .args(extra)
        .output()
        .map_err(|source| Error::Spawn {
            command: command.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::CommandFailed {
            command,
            status: output.status.to_string(),
            output_tail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let list: Value = serde_json::from_slice(&output.stdout).map_err(|source| Error::Json {
        what: format!("{command} output"),
        source,
    })?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn devices(slice: &Value) -> &[Value] {
    slice["spec"]["devices"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// A template slice for node `node`: named after the node and its index,
/// on the node, in the node's pool, owned by the node (deleting the node
/// lets the garbage collector take its slices).
pub fn slice_for_node(template: &Value, index: usize, node: &str, node_uid: &str) -> Value {
    let mut spec = template["spec"].clone();
    if spec.get("nodeName").is_some() {
        spec["nodeName"] = json!(node);
    }
    spec["pool"]["name"] = json!(node);
    let driver = spec["driver"].as_str().unwrap_or("driver");
    let short = driver.split('.').next().unwrap_or(driver);
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {
            "name": format!("{node}-{short}-{index}"),
            "labels": {LABEL: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": spec,
    })
}

/// The attributes AWS's Neuron driver publishes on a chip (its domain's
/// names unqualified, as in our slices), and the qualified ones it shares.
const AWS_NEURON_ATTRIBUTES: &[&str] = &[
    "deviceId",
    "instanceType",
    "neuronDriverVersion",
    "draDriverVersion",
    "resourceType",
    "networkNodeLayer1",
    "networkNodeLayer2",
    "networkNodeLayer3",
    "topology_x",
    "topology_y",
    "topology4_id",
    "topology8_id",
    "capacityBlockId",
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
];

/// Our chips-only Neuron slices as AWS's driver publishes them: the chips
/// (`neurondeviceN`) with AWS's attributes only, no capacity, no counters.
pub fn aws_neuron_slices(ours: &[Value]) -> Vec<Value> {
    let chips: Vec<Value> = ours
        .iter()
        .flat_map(devices)
        .filter(|d| d["attributes"]["resourceType"]["string"] == "neuron_device")
        .map(|d| {
            let attributes: Map<String, Value> = d["attributes"]
                .as_object()
                .map(|a| {
                    a.iter()
                        .filter(|(k, _)| AWS_NEURON_ATTRIBUTES.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            json!({"name": d["name"], "attributes": attributes})
        })
        .collect();
    let Some(first) = ours.first() else {
        return Vec::new();
    };
    let mut spec = json!({
        "driver": NEURON_DRIVER,
        "pool": {"name": first["spec"]["pool"]["name"], "generation": 1, "resourceSliceCount": 1},
        "nodeName": first["spec"]["nodeName"],
        "devices": chips,
    });
    if spec["nodeName"].is_null() {
        spec["nodeName"] = json!(TEMPLATE_NODE);
    }
    vec![json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": spec})]
}

/// `DDDD:BB:DD.F` as DRANET names a PCI device: `pci-dddd-bb-dd-f`.
pub fn dranet_device_name(bdf: &str) -> String {
    format!("pci-{}", bdf.to_ascii_lowercase().replace([':', '.'], "-"))
}

/// Our EFA slices as DRANET publishes the same EFAs (driver `dra.net`,
/// its attribute names, the standard and device-group attributes kept).
pub fn dranet_slices(ours: &[Value]) -> Vec<Value> {
    let efas: Vec<Value> = ours
        .iter()
        .flat_map(devices)
        .filter_map(|d| {
            let a = &d["attributes"];
            let bdf = a["resource.kubernetes.io/pciBusID"]["string"].as_str()?;
            let mut attributes = Map::new();
            let mut put = |k: &str, v: Value| {
                attributes.insert(k.to_owned(), v);
            };
            put("dra.net/pciAddress", json!({"string": bdf}));
            put(
                "dra.net/pciDevice",
                json!({"string": "Elastic Fabric Adapter (EFA)"}),
            );
            put("dra.net/pciVendor", json!({"string": "Amazon.com, Inc."}));
            put(
                "dra.net/pciSubsystem",
                json!({"string": "Elastic Fabric Adapter (EFA)"}),
            );
            put("dra.net/rdma", json!({"bool": true}));
            if let Some(rdma) = a["rdmaDevice"].get("string") {
                put("dra.net/rdmaDevice", json!({"string": rdma}));
            }
            if let Some(numa) = a["resource.kubernetes.io/numaNode"].get("int") {
                put("dra.net/numaNode", json!({"int": numa}));
                put("resource.kubernetes.io/numaNode", json!({"int": numa}));
            }
            if let Some(attrs) = a.as_object() {
                for (k, v) in attrs {
                    if k == "resource.kubernetes.io/pcieRoot"
                        || k.starts_with("resource.aws.com/devicegroup")
                    {
                        put(k, v.clone());
                    }
                }
            }
            Some(json!({"name": dranet_device_name(bdf), "attributes": attributes}))
        })
        .collect();
    let Some(first) = ours.first() else {
        return Vec::new();
    };
    vec![json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "spec": {
            "driver": DRANET_DRIVER,
            "pool": {"name": first["spec"]["pool"]["name"], "generation": 1, "resourceSliceCount": 1},
            "nodeName": first["spec"]["nodeName"],
            "devices": efas,
        },
    })]
}

fn class(name: &str, expression: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    })
}

/// AWS's DeviceClasses of the same names as ours: `neuron.aws.com`
/// selecting the driver, and `efa.networking.k8s.aws` selecting DRANET's EFAs.
pub fn aws_classes() -> Vec<Value> {
    vec![
        class(
            NEURON_DRIVER,
            &format!("device.driver == \"{NEURON_DRIVER}\""),
        ),
        class(
            EFA_DRIVER,
            &format!(
                "device.driver == \"{DRANET_DRIVER}\" && device.attributes[\"{DRANET_DRIVER}\"].pciDevice == 'Elastic Fabric Adapter (EFA)'"
            ),
        ),
    ]
}

#[cfg(test)]
#[path = "shapes_tests.rs"]
mod tests;
