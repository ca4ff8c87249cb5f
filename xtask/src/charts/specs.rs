//! The two driver charts: what differs between them, and the Helm values the
//! kind e2e installs them with.
//!
//! Both the chart checks (which render the charts with the kind values) and
//! the kind bring-up read these; keeping them here, apart from either, is
//! what keeps those two modules from importing each other.

use anyhow::{Context, Result};
use e2e::DriverKind;
use e2e::chart_testbed::values::{release_name, release_values};
use serde_json::Value;

/// What differs between the two driver charts.
pub struct ChartSpec {
    /// Directory under `charts/`, also the chart name.
    pub name: &'static str,
    pub driver: &'static str,
    pub binary: &'static str,
    /// Part of the device directory the DaemonSet mounts ("" = all of it).
    pub dev_sub_path: &'static str,
    /// What the driver may do to Nodes: `get` its own (owner reference);
    /// the Neuron driver also `patch`es its UltraServer labels.
    pub node_verbs: &'static [&'static str],
}

pub const EFA: ChartSpec = ChartSpec {
    name: "efa-dra-driver",
    driver: "efa.networking.k8s.aws",
    binary: "efa-driver",
    dev_sub_path: "infiniband",
    node_verbs: &["get"],
};

pub const NEURON: ChartSpec = ChartSpec {
    name: "neuron-dra-driver",
    driver: "neuron.aws.com",
    binary: "neuron-driver",
    dev_sub_path: "",
    node_verbs: &["get", "patch"],
};

pub const CHARTS: [&ChartSpec; 2] = [&EFA, &NEURON];

impl ChartSpec {
    /// The driver this chart deploys.
    pub fn driver_kind(&self) -> Result<DriverKind> {
        DriverKind::ALL
            .into_iter()
            .find(|k| k.driver_name() == self.driver)
            .with_context(|| format!("no driver named {}", self.driver))
    }
}

/// Helm values for one driver chart on the kind cluster: exactly what the
/// scenarios' testbed installs there (`e2e::chart_testbed::values::release_values`
/// with the kind host's deployment and paths).
pub fn kind_helm_values(spec: &ChartSpec) -> Result<String> {
    let kind = spec.driver_kind()?;
    let values = release_values(
        &e2e::kind_host::deployment(),
        kind,
        &release_name(kind, None),
        None,
        &e2e::kind_host::host_paths(),
        true,
        8080,
    );
    to_yaml(&values)
}

fn to_yaml(v: &Value) -> Result<String> {
    serde_saphyr::to_string(v).map_err(|e| anyhow::anyhow!("serializing YAML: {e}"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use e2e::kind_host::{FIXTURE_MOUNT, IMAGE_REPOSITORY};

    use super::*;

    #[test]
    fn kind_helm_values_point_the_drivers_at_the_fixture_mount() {
        assert_eq!(FIXTURE_MOUNT, "/opt/aws-dra/fixture");
        for spec in CHARTS {
            let v: Value = serde_saphyr::from_str(&kind_helm_values(spec).unwrap()).unwrap();
            assert_eq!(v["hostPaths"]["sysfsRoot"], "/opt/aws-dra/fixture/sys");
            assert_eq!(v["hostPaths"]["devRoot"], "/opt/aws-dra/fixture/dev");
            assert_eq!(v["hostPaths"]["kubeletRoot"], "/var/lib/kubelet");
            assert_eq!(v["image"]["pullPolicy"], "Never");
            assert_eq!(v["image"]["repository"], IMAGE_REPOSITORY);
            assert_eq!(v["hostNetwork"], false);
            let kind = spec.driver_kind().unwrap();
            assert_eq!(
                v["nodeSelector"][format!("e2e.aws-dra.dev/{}", kind.binary())],
                "run"
            );
            assert_eq!(v["serviceAccount"]["name"], kind.service_account().1);
            // Every key must exist in the chart's values.yaml (the schema
            // refuses unknown keys; `charts check` renders with these too).
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let defaults: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(root.join("charts").join(spec.name).join("values.yaml"))
                    .unwrap(),
            )
            .unwrap();
            for (k, sub) in v.as_object().unwrap() {
                assert!(
                    defaults.get(k).is_some(),
                    "{k} is not a value of {}",
                    spec.name
                );
                if let (Some(sub), Some(d)) = (sub.as_object(), defaults[k].as_object())
                    && k != "nodeSelector"
                    && k != "podLabels"
                {
                    for k2 in sub.keys() {
                        assert!(
                            d.contains_key(k2),
                            "{k}.{k2} is not a value of {}",
                            spec.name
                        );
                    }
                }
            }
        }
    }

    /// The instance types of a chart's default node selection.
    fn default_instance_types(spec: &ChartSpec) -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join("charts").join(spec.name).join("values.yaml"))
            .unwrap();
        let v: Value = serde_saphyr::from_str(&text).unwrap();
        v["nodeAffinity"]["instanceTypes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect()
    }

    /// Every instance type we model with EFAs (resp. Neuron chips), and
    /// every type of AWS's device-group table (EFA-enabled Trainium), is
    /// in the default node selection of the chart that serves it.
    #[test]
    fn default_node_selection_covers_every_known_type() {
        use sysfs_fixtures::{DeviceKind, Node};
        fn kinds(nodes: &[Node], out: &mut Vec<DeviceKind>) {
            for n in nodes {
                match n {
                    Node::Bridge { children, .. } => kinds(children, out),
                    Node::Device { kind, .. } => out.push(kind.clone()),
                }
            }
        }
        let efa = default_instance_types(&EFA);
        let neuron = default_instance_types(&crate::charts::specs::NEURON);
        for t in sysfs_fixtures::instance_types() {
            let spec = sysfs_fixtures::spec(t).unwrap();
            let mut found = Vec::new();
            for root in &spec.roots {
                kinds(&root.children, &mut found);
            }
            let has_efa = found.iter().any(|k| matches!(k, DeviceKind::Efa { .. }));
            let has_neuron = spec.neuron.is_some()
                || found.iter().any(|k| matches!(k, DeviceKind::Neuron { .. }));
            assert_eq!(
                efa.iter().any(|e| e == t),
                has_efa,
                "{t} in the EFA chart's list"
            );
            assert_eq!(
                neuron.iter().any(|e| e == t),
                has_neuron,
                "{t} in the Neuron chart's list"
            );
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let table: serde_json::Map<String, Value> = serde_json::from_str(
            &std::fs::read_to_string(root.join("crates/topology/data/efa-enabled-instances.json"))
                .unwrap(),
        )
        .unwrap();
        assert!(table.len() >= 10);
        for t in table.keys() {
            assert!(
                efa.contains(t),
                "{t} (AWS's table) missing from the EFA chart"
            );
            assert!(
                neuron.contains(t),
                "{t} (AWS's table) missing from the Neuron chart"
            );
        }
        // The families the issue found uncovered: HPC, c*n, g5/g6, Graviton.
        for t in [
            "hpc7g.16xlarge",
            "hpc6a.48xlarge",
            "c5n.18xlarge",
            "c7gn.16xlarge",
            "g5.48xlarge",
            "g6.48xlarge",
        ] {
            assert!(efa.iter().any(|e| e == t), "{t}");
        }
        for list in [&efa, &neuron] {
            let mut sorted = list.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "duplicate instance types");
        }
    }

    #[test]
    fn each_chart_names_a_known_driver() {
        for spec in CHARTS {
            assert_eq!(spec.driver_kind().unwrap().driver_name(), spec.driver);
        }
    }
}
