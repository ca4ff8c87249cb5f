//! What a rendering of a driver chart must contain, given the values it was
//! rendered with: one [`Expect`] per values file the checks use (defaults,
//! `ci/nondefault-values.yaml`, the kind e2e values). Kept apart from the
//! assertions so that the expectations read as a table of the values files.

use anyhow::Result;
use e2e::kind_host::FIXTURE_MOUNT;

use crate::charts::specs::{ChartSpec, EFA};

/// The release name and namespace the checks render with (and the defaults
/// of `cargo xtask charts render`).
pub const RELEASE: &str = "dra";
pub const NAMESPACE: &str = "aws-dra";

/// What a rendering must contain, given the values it was rendered with.
#[derive(Debug, Clone)]
pub struct Expect {
    pub fullname: String,
    /// The ClusterRole's verbs on nodes ([`ChartSpec::node_verbs`]).
    pub node_verbs: &'static [&'static str],
    pub service_account: String,
    pub registrar_dir: String,
    pub plugins_dir: String,
    pub cdi_root: String,
    /// `deviceAttributesFiles` (the files' directory is not set in any
    /// values file: it sits beside the CDI root).
    pub device_attributes_files: bool,
    pub sysfs_root: String,
    pub dev_root: String,
    pub privileged: bool,
    pub metrics_port: u16,
    pub rbac: bool,
    pub vap: bool,
    pub service: bool,
    pub service_monitor: bool,
    pub priority_class: Option<String>,
    pub instance_type_affinity: bool,
    /// `nodeAffinity.excludeComputeTypes`: the compute types no driver pod
    /// may land on.
    pub exclude_compute_types: Vec<String>,
    /// The keys of each required node selector term given in the
    /// `affinity` value (the chart adds its own requirements to each);
    /// empty: the chart's requirements form the only term.
    pub user_node_terms: Vec<Vec<String>>,
    /// Preferred node terms given in the `affinity` value.
    pub preferred_node_terms: usize,
    /// The container's image reference, when the values fix it.
    pub image: Option<String>,
    /// `securityContext.seLinuxOptions.type` given in values.
    pub se_linux_type: Option<String>,
    /// `podSecurityContext.supplementalGroups` given in values.
    pub supplemental_groups: Vec<i64>,
    pub network_policy: bool,
    /// Peers of `networkPolicy.metricsFrom` (0: any source; the default
    /// is one, the namespace `monitoring`).
    pub metrics_from: usize,
    pub host_network: bool,
    /// `(name, value)` of `extraEnv` entries.
    pub extra_env: Vec<(String, String)>,
    pub device_classes: Vec<String>,
    /// Args that must be present besides the ones every rendering has.
    pub extra_args: Vec<String>,
    /// (DeviceClass, substring of one of its CEL selectors).
    pub cel: Vec<(String, String)>,
    /// (DeviceClass, opaque parameter kind).
    pub class_config: Vec<(String, String)>,
    /// (DeviceClass, `extendedResourceName`) of the classes serving the
    /// device plugins' resource names.
    pub extended: Vec<(String, String)>,
}

/// The chart's classes for the device plugins' resource names, in the
/// order the chart renders them (after the default and extra classes), on
/// a release that serves `extendedResourceName` (1.36+).
pub fn extended_classes(spec: &ChartSpec) -> Vec<(String, String)> {
    let pairs: &[(&str, &str)] = if spec.name == EFA.name {
        &[("efa.efa.networking.k8s.aws", "vpc.amazonaws.com/efa")]
    } else {
        &[
            ("neuron.neuron.aws.com", "aws.amazon.com/neuron"),
            ("neurondevice.neuron.aws.com", "aws.amazon.com/neurondevice"),
            ("neuroncore.neuron.aws.com", "aws.amazon.com/neuroncore"),
        ]
    };
    pairs
        .iter()
        .map(|(c, r)| ((*c).to_owned(), (*r).to_owned()))
        .collect()
}

/// `(class, CEL substring)` that keep each Neuron class to its kind of
/// device: whole chips and whole UltraServer nodes for the default class
/// (what AWS's class of the same name offers: every device of a driver
/// that publishes no cores), whole chips for the chip names, cores for
/// `neuroncore`.
fn neuron_kind_selectors(default_class: Option<&str>) -> Vec<(String, String)> {
    let chip = r#"device.attributes["neuron.aws.com"].resourceType == "neuron_device""#;
    let core = r#"device.attributes["neuron.aws.com"].resourceType == "neuron_core""#;
    let not_core =
        r#"device.attributes["neuron.aws.com"].resourceType in ["neuron_device", "neuron_node"]"#;
    default_class
        .into_iter()
        .map(|c| (c.to_owned(), not_core.to_owned()))
        .chain([
            ("neuron.neuron.aws.com".to_owned(), chip.to_owned()),
            ("neurondevice.neuron.aws.com".to_owned(), chip.to_owned()),
            ("neuroncore.neuron.aws.com".to_owned(), core.to_owned()),
        ])
        .collect()
}

impl Expect {
    pub fn defaults(spec: &ChartSpec) -> Expect {
        Expect {
            fullname: format!("{RELEASE}-{}", spec.name),
            node_verbs: spec.node_verbs,
            service_account: format!("{RELEASE}-{}", spec.name),
            registrar_dir: "/var/lib/kubelet/plugins_registry".into(),
            plugins_dir: "/var/lib/kubelet/plugins".into(),
            cdi_root: "/var/run/cdi".into(),
            device_attributes_files: true,
            sysfs_root: "/sys".into(),
            dev_root: "/dev".into(),
            privileged: false,
            metrics_port: 8080,
            rbac: true,
            vap: true,
            service: true,
            service_monitor: false,
            priority_class: Some("system-node-critical".into()),
            instance_type_affinity: true,
            exclude_compute_types: ["auto", "fargate", "hybrid"].map(String::from).to_vec(),
            user_node_terms: vec![],
            preferred_node_terms: 0,
            image: Some("ghcr.io/aws-dra/aws-dra-drivers:0.1.0".into()),
            se_linux_type: None,
            supplemental_groups: vec![],
            network_policy: true,
            metrics_from: 1,
            host_network: false,
            extra_env: vec![],
            device_classes: std::iter::once(spec.driver.to_owned())
                .chain(extended_classes(spec).into_iter().map(|(c, _)| c))
                .collect(),
            extra_args: std::iter::once("--log-format=json".to_string())
                .chain(neuron_only(spec, "--partitions=chips"))
                .chain(efa_only(spec, "--sharing=exclusive"))
                .collect(),
            cel: if spec.name == EFA.name {
                vec![]
            } else {
                neuron_kind_selectors(Some(spec.driver))
            },
            class_config: vec![],
            extended: extended_classes(spec),
        }
    }

    /// Defaults rendered for a 1.34 cluster: no extended-resource classes.
    pub fn defaults_before_extended_resources(spec: &ChartSpec) -> Expect {
        let d = Expect::defaults(spec);
        Expect {
            device_classes: vec![spec.driver.into()],
            cel: d
                .cel
                .iter()
                .filter(|(c, _)| c == spec.driver)
                .cloned()
                .collect(),
            extended: vec![],
            ..d
        }
    }

    /// Mirrors `charts/<chart>/ci/nondefault-values.yaml`.
    pub fn nondefault(spec: &ChartSpec) -> Expect {
        let d = Expect::defaults(spec);
        if spec.name == EFA.name {
            Expect {
                service_account: "efa-driver".into(),
                registrar_dir: "/data/kubelet/plugins_registry".into(),
                plugins_dir: "/data/kubelet/plugins".into(),
                cdi_root: "/etc/cdi".into(),
                device_attributes_files: false,
                sysfs_root: "/opt/aws-dra/fixtures/p5/sys".into(),
                dev_root: "/opt/aws-dra/fixtures/p5/dev".into(),
                metrics_port: 9400,
                service_monitor: true,
                instance_type_affinity: false,
                user_node_terms: vec![
                    vec!["topology.kubernetes.io/zone".into()],
                    vec!["example.com/efa-pool".into()],
                ],
                preferred_node_terms: 1,
                image: Some(format!(
                    "registry.example.internal/aws-dra-drivers@sha256:{}",
                    "0123456789abcdef".repeat(4)
                )),
                se_linux_type: Some("super_t".into()),
                supplemental_groups: vec![1000],
                metrics_from: 0,
                device_classes: vec![
                    "efa.example.com".into(),
                    "efa-numa0.networking.k8s.aws".into(),
                    "efa-rdma.networking.k8s.aws".into(),
                    "efa.efa.networking.k8s.aws".into(),
                ],
                extra_args: vec![
                    "--log-format=text".into(),
                    "--allow-device-plugin-coexistence".into(),
                    "--sharing=capacity".into(),
                ],
                cel: vec![
                    (
                        "efa-numa0.networking.k8s.aws".into(),
                        r#"has(device.attributes["resource.kubernetes.io"].numaNode) && device.attributes["resource.kubernetes.io"].numaNode == 0"#.into(),
                    ),
                    (
                        "efa-numa0.networking.k8s.aws".into(),
                        r#"device.attributes["efa.networking.k8s.aws"].instanceType == "p5.48xlarge""#.into(),
                    ),
                    (
                        "efa-rdma.networking.k8s.aws".into(),
                        r#".rdmaDevice.startsWith("rdmap")"#.into(),
                    ),
                ],
                class_config: vec![("efa-rdma.networking.k8s.aws".into(), "EfaConfig".into())],
                ..d
            }
        } else {
            Expect {
                fullname: "neuron".into(),
                service_account: "existing-neuron-sa".into(),
                registrar_dir: "/var/lib/kubelet/plugins_registry_custom".into(),
                plugins_dir: "/var/lib/kubelet/dra-plugins".into(),
                sysfs_root: "/opt/aws-dra/fixtures/trn2/sys".into(),
                dev_root: "/opt/aws-dra/fixtures/trn2/dev".into(),
                privileged: true,
                host_network: true,
                exclude_compute_types: vec![],
                network_policy: false,
                extra_env: vec![("KUBERNETES_SERVICE_HOST".into(), "10.1.2.3".into())],
                rbac: false,
                vap: false,
                service: false,
                priority_class: None,
                device_classes: vec![
                    "trn2.neuron.aws.com".into(),
                    "lnc1.neuron.aws.com".into(),
                    "neuron.neuron.aws.com".into(),
                    "neurondevice.neuron.aws.com".into(),
                    "neuroncore.neuron.aws.com".into(),
                ],
                extra_args: vec!["--log-format=text".into(), "--partitions=auto".into()],
                cel: [
                    (
                        "trn2.neuron.aws.com".into(),
                        r#"device.attributes["neuron.aws.com"].instanceType == "trn2.48xlarge""#
                            .into(),
                    ),
                    (
                        "lnc1.neuron.aws.com".into(),
                        r#"device.attributes["neuron.aws.com"].coreCount == 8"#.into(),
                    ),
                ]
                .into_iter()
                .chain(neuron_kind_selectors(None))
                .collect(),
                class_config: vec![("lnc1.neuron.aws.com".into(), "NeuronConfig".into())],
                ..d
            }
        }
    }

    /// Mirrors [`crate::charts::specs::kind_helm_values`].
    pub fn kind(spec: &ChartSpec) -> Result<Expect> {
        let kind = spec.driver_kind()?;
        Ok(Expect {
            fullname: e2e::chart_testbed::values::release_name(kind, None),
            sysfs_root: format!("{FIXTURE_MOUNT}/sys"),
            image: None,
            dev_root: format!("{FIXTURE_MOUNT}/dev"),
            // The kind testbed opts in to NeuronCores, as every testbed.
            extra_args: std::iter::once("--log-format=text".to_string())
                .chain(neuron_only(
                    spec,
                    &format!("--partitions={}", e2e::testbed::TESTBED_PARTITIONS),
                ))
                .chain(efa_only(spec, "--sharing=exclusive"))
                .collect(),
            // The kind testbed's extraEnv (the short rescan interval the
            // health scenarios rely on), exactly as the testbed sets it.
            extra_env: e2e::kind_host::deployment().extra_env,
            // Any source: the harness reads /metrics through the API
            // server's pod proxy (`networkPolicy.metricsFrom: []`).
            metrics_from: 0,
            ..Expect::defaults(spec)
        })
    }
}

/// `arg` for the Neuron chart, nothing for the EFA chart.
fn neuron_only(spec: &ChartSpec, arg: &str) -> Option<String> {
    (spec.name != EFA.name).then(|| arg.to_string())
}

/// `arg` for the EFA chart, nothing for the Neuron chart.
fn efa_only(spec: &ChartSpec, arg: &str) -> Option<String> {
    (spec.name == EFA.name).then(|| arg.to_string())
}
