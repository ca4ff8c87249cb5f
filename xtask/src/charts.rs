//! `cargo xtask charts check|render`: the Helm charts, checked with real Helm.
//!
//! `check` builds (or reuses) Helm, vendors the shared library chart into
//! each driver chart, runs `helm lint --strict` and `helm template` with the
//! default values, the chart's `ci/*-values.yaml` and the kind e2e values,
//! and asserts concrete properties of the rendered objects (security
//! context, host mounts at identical paths, flags and env, RBAC verbs, the
//! admission policy expression, DeviceClass CEL). It also checks that values
//! the schema must refuse are refused. Limits: it does not talk to an API
//! server; applying the rendered objects server-side is the e2e's job (use
//! [`render`] to get them).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::helm::{self, Helm};
use crate::manifests::{self, of_kind, one};

/// What differs between the two driver charts.
pub struct ChartSpec {
    /// Directory under `charts/`, also the chart name.
    pub name: &'static str,
    pub driver: &'static str,
    pub binary: &'static str,
    /// Part of the device directory the DaemonSet mounts ("" = all of it).
    pub dev_sub_path: &'static str,
}

pub const EFA: ChartSpec = ChartSpec {
    name: "efa-dra-driver",
    driver: "efa.networking.k8s.aws",
    binary: "efa-driver",
    dev_sub_path: "infiniband",
};

pub const NEURON: ChartSpec = ChartSpec {
    name: "neuron-dra-driver",
    driver: "neuron.aws.com",
    binary: "neuron-driver",
    dev_sub_path: "",
};

pub const CHARTS: [&ChartSpec; 2] = [&EFA, &NEURON];

/// The release name and namespace used by the checks.
const RELEASE: &str = "dra";
const NAMESPACE: &str = "aws-dra";

#[derive(clap::Args)]
pub struct ChartsArgs {
    #[command(subcommand)]
    command: ChartsCommand,
}

#[derive(clap::Subcommand)]
enum ChartsCommand {
    /// helm lint --strict + helm template (default and non-default values) + assertions.
    Check,
    /// Print the rendered manifests of one chart (for `kubectl apply`).
    Render {
        /// efa-dra-driver or neuron-dra-driver
        chart: String,
        /// Extra values files, as `helm template -f`.
        #[arg(short = 'f', long = "values")]
        values: Vec<PathBuf>,
        #[arg(long, default_value = NAMESPACE)]
        namespace: String,
        #[arg(long, default_value = RELEASE)]
        release: String,
    },
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn run(args: ChartsArgs) -> Result<()> {
    let root = repo_root();
    let helm = helm::ensure(&root)?;
    match args.command {
        ChartsCommand::Check => check(&helm, &root),
        ChartsCommand::Render {
            chart,
            values,
            namespace,
            release,
        } => {
            let spec = CHARTS
                .into_iter()
                .find(|c| c.name == chart)
                .with_context(|| {
                    format!("unknown chart {chart}: efa-dra-driver or neuron-dra-driver")
                })?;
            print!(
                "{}",
                render(&helm, &root, spec, &release, &namespace, &values)?
            );
            Ok(())
        }
    }
}

/// Vendors the library chart into `charts/<chart>/charts/` (idempotent).
pub fn build_dependencies(helm: &Helm, root: &Path, spec: &ChartSpec) -> Result<()> {
    let dir = root.join("charts").join(spec.name);
    helm.output(&["dependency", "build", path_str(&dir)?])?;
    Ok(())
}

/// `helm template` of one chart: the YAML stream.
pub fn render(
    helm: &Helm,
    root: &Path,
    spec: &ChartSpec,
    release: &str,
    namespace: &str,
    values: &[PathBuf],
) -> Result<String> {
    build_dependencies(helm, root, spec)?;
    let dir = root.join("charts").join(spec.name);
    let mut args = vec![
        "template",
        release,
        path_str(&dir)?,
        "--namespace",
        namespace,
    ];
    for v in values {
        args.extend(["-f", path_str(v)?]);
    }
    helm.output(&args)
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("path is not UTF-8: {}", p.display()))
}

fn check(helm: &Helm, root: &Path) -> Result<()> {
    let started = Instant::now();
    let mut rendered = 0;
    let schemas: Vec<String> = CHARTS
        .iter()
        .map(|c| {
            std::fs::read_to_string(root.join("charts").join(c.name).join("values.schema.json"))
        })
        .collect::<std::io::Result<_>>()?;
    ensure!(
        schemas[0] == schemas[1],
        "charts/*/values.schema.json differ: the two charts share one values layout, keep the files identical"
    );
    let tmp = tempfile::tempdir()?;
    for spec in CHARTS {
        let dir = root.join("charts").join(spec.name);
        build_dependencies(helm, root, spec)?;
        let ci_values = dir.join("ci").join("nondefault-values.yaml");
        let kind_values = tmp.path().join(format!("{}-kind.yaml", spec.name));
        std::fs::write(&kind_values, crate::kind::helm_values(spec)?)?;
        for values in [None, Some(&ci_values), Some(&kind_values)] {
            let mut args = vec!["lint", "--strict", path_str(&dir)?];
            if let Some(v) = values {
                args.extend(["-f", path_str(v)?]);
            }
            helm.output(&args)
                .with_context(|| format!("helm lint of {}", spec.name))?;
        }
        let variants: [(&str, Vec<PathBuf>, Expect); 3] = [
            ("defaults", vec![], Expect::defaults(spec)),
            (
                "ci/nondefault-values.yaml",
                vec![ci_values],
                Expect::nondefault(spec),
            ),
            ("kind e2e values", vec![kind_values], Expect::kind(spec)),
        ];
        for (label, values, expect) in variants {
            let yaml = render(helm, root, spec, RELEASE, NAMESPACE, &values)?;
            let objs = manifests::parse(&yaml)
                .with_context(|| format!("{} ({label}) rendered invalid YAML", spec.name))?;
            check_rendered(spec, &expect, &objs)
                .with_context(|| format!("{} rendered with {label}", spec.name))?;
            eprintln!(
                "==> charts: {} with {label}: {} objects ok",
                spec.name,
                objs.len()
            );
            rendered += 1;
        }
        for (bad, why) in [
            ("bogusKey=1", "an unknown top-level key"),
            ("hostPaths.cdiRoot=relative/dir", "a relative host path"),
            ("logFormat=xml", "an unknown log format"),
            (
                "deviceClasses.extra[0].name=Bad_Name",
                "a DeviceClass name that is not a DNS subdomain",
            ),
        ] {
            let out = helm
                .command()
                .args(["lint", "--strict", path_str(&dir)?, "--set", bad])
                .output()?;
            ensure!(
                !out.status.success(),
                "{}: helm lint accepted {why} ({bad}): values.schema.json is too loose",
                spec.name
            );
        }
    }
    eprintln!(
        "==> charts: helm {} lint + {rendered} renders checked in {:.0}s",
        helm.version,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What a rendering must contain, given the values it was rendered with.
#[derive(Debug, Clone)]
pub struct Expect {
    pub fullname: String,
    pub service_account: String,
    pub registrar_dir: String,
    pub plugins_dir: String,
    pub cdi_root: String,
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
}

impl Expect {
    pub fn defaults(spec: &ChartSpec) -> Expect {
        Expect {
            fullname: format!("{RELEASE}-{}", spec.name),
            service_account: format!("{RELEASE}-{}", spec.name),
            registrar_dir: "/var/lib/kubelet/plugins_registry".into(),
            plugins_dir: "/var/lib/kubelet/plugins".into(),
            cdi_root: "/var/run/cdi".into(),
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
            host_network: false,
            extra_env: vec![],
            device_classes: vec![spec.driver.into()],
            extra_args: vec!["--log-format=json".into()],
            cel: vec![],
            class_config: vec![],
        }
    }

    /// Mirrors `charts/<chart>/ci/nondefault-values.yaml`.
    fn nondefault(spec: &ChartSpec) -> Expect {
        let d = Expect::defaults(spec);
        if spec.name == EFA.name {
            Expect {
                service_account: "efa-driver".into(),
                registrar_dir: "/data/kubelet/plugins_registry".into(),
                plugins_dir: "/data/kubelet/plugins".into(),
                cdi_root: "/etc/cdi".into(),
                sysfs_root: "/opt/aws-dra/fixtures/p5/sys".into(),
                dev_root: "/opt/aws-dra/fixtures/p5/dev".into(),
                metrics_port: 9400,
                service_monitor: true,
                instance_type_affinity: false,
                device_classes: vec![
                    "efa.example.com".into(),
                    "efa-numa0.networking.k8s.aws".into(),
                    "efa-rdma.networking.k8s.aws".into(),
                ],
                extra_args: vec![
                    "--log-format=text".into(),
                    "--allow-device-plugin-coexistence".into(),
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
                extra_env: vec![("KUBERNETES_SERVICE_HOST".into(), "10.1.2.3".into())],
                rbac: false,
                vap: false,
                service: false,
                priority_class: None,
                device_classes: vec!["trn2.neuron.aws.com".into(), "lnc1.neuron.aws.com".into()],
                extra_args: vec!["--log-format=text".into()],
                cel: vec![
                    (
                        "trn2.neuron.aws.com".into(),
                        r#"device.attributes["neuron.aws.com"].instanceType == "trn2.48xlarge""#
                            .into(),
                    ),
                    (
                        "lnc1.neuron.aws.com".into(),
                        r#"device.attributes["neuron.aws.com"].coreCount == 8"#.into(),
                    ),
                ],
                class_config: vec![("lnc1.neuron.aws.com".into(), "NeuronConfig".into())],
                ..d
            }
        }
    }

    /// Mirrors [`crate::kind::helm_values`].
    fn kind(spec: &ChartSpec) -> Expect {
        let kind = crate::kind::driver_kind(spec).expect("chart of a known driver");
        Expect {
            fullname: e2e::chart_testbed::values::release_name(kind, None),
            sysfs_root: format!("{}/sys", crate::kind::FIXTURE_MOUNT),
            dev_root: format!("{}/dev", crate::kind::FIXTURE_MOUNT),
            extra_args: vec!["--log-format=text".into()],
            ..Expect::defaults(spec)
        }
    }
}

fn str_list(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// Asserts everything `expect` says about a rendering of `spec`.
pub fn check_rendered(spec: &ChartSpec, expect: &Expect, objs: &[Value]) -> Result<()> {
    for obj in objs {
        manifests::check_typed(obj)?;
        let ns_scoped = !matches!(
            obj["kind"].as_str(),
            Some(
                "ClusterRole"
                    | "ClusterRoleBinding"
                    | "DeviceClass"
                    | "ValidatingAdmissionPolicy"
                    | "ValidatingAdmissionPolicyBinding"
            )
        );
        ensure!(
            !ns_scoped || obj["metadata"]["namespace"] == NAMESPACE,
            "{} is not in the release namespace",
            manifests::id(obj)
        );
    }
    check_daemonset(
        spec,
        expect,
        one(objs, "DaemonSet", Some(&expect.fullname))?,
    )?;

    ensure!(
        of_kind(objs, "ServiceAccount").len() == usize::from(expect.rbac),
        "ServiceAccount rendered: {}, want {}",
        of_kind(objs, "ServiceAccount").len(),
        expect.rbac
    );
    if expect.rbac {
        one(objs, "ServiceAccount", Some(&expect.service_account))?;
        check_rbac(expect, objs)?;
    } else {
        ensure!(
            of_kind(objs, "ClusterRole").is_empty(),
            "rbac.create=false still renders a ClusterRole"
        );
    }
    if expect.vap {
        check_vap(spec, expect, objs)?;
    } else {
        ensure!(
            of_kind(objs, "ValidatingAdmissionPolicy").is_empty(),
            "validatingAdmissionPolicy.enabled=false still renders the policy"
        );
    }
    ensure!(
        of_kind(objs, "Service").len() == usize::from(expect.service),
        "metrics Service rendered: {}",
        of_kind(objs, "Service").len()
    );
    if expect.service {
        let svc = one(objs, "Service", None)?;
        ensure!(
            svc["spec"]["clusterIP"] == "None",
            "metrics Service should be headless"
        );
        ensure!(
            svc["spec"]["ports"][0]["port"] == expect.metrics_port,
            "metrics Service port"
        );
        ensure!(
            svc["spec"]["ports"][0]["targetPort"] == "metrics",
            "metrics Service targetPort"
        );
    }
    ensure!(
        of_kind(objs, "ServiceMonitor").len() == usize::from(expect.service_monitor),
        "ServiceMonitor rendered: {}",
        of_kind(objs, "ServiceMonitor").len()
    );
    if expect.service_monitor {
        let sm = one(objs, "ServiceMonitor", None)?;
        ensure!(
            sm["spec"]["endpoints"][0]["port"] == "metrics",
            "ServiceMonitor port"
        );
        ensure!(
            sm["spec"]["endpoints"][0]["path"] == "/metrics",
            "ServiceMonitor path"
        );
    }
    check_device_classes(spec, expect, objs)
}

fn check_daemonset(spec: &ChartSpec, expect: &Expect, ds: &Value) -> Result<()> {
    let strategy = &ds["spec"]["updateStrategy"];
    ensure!(
        strategy["type"] == "RollingUpdate"
            && strategy["rollingUpdate"]["maxSurge"] == 1
            && strategy["rollingUpdate"]["maxUnavailable"] == 0,
        "updateStrategy must be RollingUpdate maxSurge 1 maxUnavailable 0 (seamless upgrade), got {strategy}"
    );
    let pod = &ds["spec"]["template"]["spec"];
    ensure!(
        pod["priorityClassName"].as_str() == expect.priority_class.as_deref(),
        "priorityClassName {}",
        pod["priorityClassName"]
    );
    ensure!(
        pod["serviceAccountName"] == expect.service_account.as_str(),
        "serviceAccountName {}",
        pod["serviceAccountName"]
    );
    ensure!(
        pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault",
        "pod seccompProfile"
    );
    let affinity = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    if expect.instance_type_affinity {
        ensure!(
            affinity["key"] == "node.kubernetes.io/instance-type"
                && affinity["operator"] == "In"
                && !str_list(&affinity["values"]).is_empty(),
            "node affinity on instance types missing: {affinity}"
        );
    } else {
        ensure!(
            pod["affinity"].is_null(),
            "empty instanceTypes must drop the affinity"
        );
    }
    if expect.host_network {
        ensure!(
            pod["hostNetwork"] == true && pod["dnsPolicy"] == "ClusterFirstWithHostNet",
            "hostNetwork: true must render with dnsPolicy ClusterFirstWithHostNet: {} {}",
            pod["hostNetwork"],
            pod["dnsPolicy"]
        );
    } else {
        ensure!(
            pod["hostNetwork"].is_null() && pod["dnsPolicy"].is_null(),
            "hostNetwork must be off by default"
        );
    }
    let tolerated = pod["tolerations"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if expect.priority_class.is_some() {
        for key in [
            "nvidia.com/gpu",
            "aws.amazon.com/neuron",
            "aws.amazon.com/efa",
            "CriticalAddonsOnly",
        ] {
            ensure!(
                tolerated.contains(&key),
                "no toleration for {key}: {tolerated:?}"
            );
        }
    }

    let containers = pod["containers"].as_array().context("no containers")?;
    ensure!(containers.len() == 1, "one container expected");
    let c = &containers[0];
    ensure!(
        str_list(&c["command"]) == [format!("/usr/local/bin/{}", spec.binary)],
        "command {}",
        c["command"]
    );
    let args = str_list(&c["args"]);
    let mut want_args = vec![
        "run".to_owned(),
        format!("--driver-name={}", spec.driver),
        format!("--sysfs-root={}", expect.sysfs_root),
        format!("--dev-root={}", expect.dev_root),
    ];
    want_args.extend(expect.extra_args.iter().cloned());
    for a in &want_args {
        ensure!(args.contains(&a.as_str()), "missing arg {a}: {args:?}");
    }
    ensure!(args[0] == "run", "`run` must be the first argument");
    if !want_args
        .iter()
        .any(|a| a == "--allow-device-plugin-coexistence")
    {
        ensure!(
            !args.contains(&"--allow-device-plugin-coexistence"),
            "device plugin coexistence must be off by default"
        );
    }

    for (name, field) in [("NODE_NAME", "spec.nodeName"), ("POD_UID", "metadata.uid")] {
        let e = env_value(c, name).with_context(|| format!("env {name} missing"))?;
        ensure!(
            e["valueFrom"]["fieldRef"]["fieldPath"] == field,
            "{name} must come from the downward API field {field}: {e}"
        );
    }
    for (name, want) in [
        (
            "KUBELET_REGISTRAR_DIRECTORY_PATH",
            expect.registrar_dir.clone(),
        ),
        ("KUBELET_PLUGINS_DIRECTORY_PATH", expect.plugins_dir.clone()),
        ("CDI_ROOT", expect.cdi_root.clone()),
        (
            "METRICS_ADDRESS",
            format!("0.0.0.0:{}", expect.metrics_port),
        ),
    ] {
        let e = env_value(c, name).with_context(|| format!("env {name} missing"))?;
        ensure!(
            e["value"] == want.as_str(),
            "env {name} = {}, want {want}",
            e["value"]
        );
    }
    for (name, want) in &expect.extra_env {
        let e = env_value(c, name).with_context(|| format!("extraEnv {name} missing"))?;
        ensure!(
            e["value"] == want.as_str(),
            "extraEnv {name} = {}",
            e["value"]
        );
    }
    let env_names = c["env"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|v| v["name"].as_str())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    ensure!(
        env_names.len() == 7 + expect.extra_env.len(),
        "unexpected env entries: {env_names:?}"
    );
    ensure!(
        c["ports"][0]["name"] == "metrics" && c["ports"][0]["containerPort"] == expect.metrics_port,
        "metrics port {}",
        c["ports"]
    );
    let probe = &c["livenessProbe"]["httpGet"];
    ensure!(
        probe["path"] == "/healthz" && probe["port"] == "metrics",
        "liveness probe must GET /healthz on the metrics port: {probe}"
    );
    ensure!(
        c["resources"]["requests"]["memory"].is_string()
            && c["resources"]["limits"]["memory"].is_string(),
        "memory request and limit must be set"
    );

    let sc = &c["securityContext"];
    ensure!(
        sc["readOnlyRootFilesystem"] == true,
        "readOnlyRootFilesystem must be true"
    );
    ensure!(
        sc["seccompProfile"]["type"] == "RuntimeDefault",
        "container seccompProfile"
    );
    if expect.privileged {
        ensure!(sc["privileged"] == true, "privileged=true not applied");
        // The API server rejects privileged with allowPrivilegeEscalation=false.
        ensure!(
            sc["allowPrivilegeEscalation"].is_null(),
            "privileged containers must not set allowPrivilegeEscalation"
        );
    } else {
        ensure!(sc["privileged"] == false, "privileged must be false");
        ensure!(
            sc["allowPrivilegeEscalation"] == false,
            "allowPrivilegeEscalation must be false"
        );
        ensure!(
            str_list(&sc["capabilities"]["drop"]) == ["ALL"] && sc["capabilities"]["add"].is_null(),
            "capabilities must drop ALL and add none: {}",
            sc["capabilities"]
        );
    }

    // Every host directory at the same path inside the container.
    let volumes = pod["volumes"].as_array().context("no volumes")?;
    let mounts = c["volumeMounts"].as_array().context("no volumeMounts")?;
    let host_path = |name: &str| -> Result<(&str, bool)> {
        let m = mounts
            .iter()
            .find(|m| m["name"] == name)
            .with_context(|| format!("no volumeMount {name}"))?;
        let v = volumes
            .iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("no volume {name}"))?;
        let path = v["hostPath"]["path"]
            .as_str()
            .with_context(|| format!("volume {name} is not a hostPath"))?;
        ensure!(
            m["mountPath"] == path,
            "volume {name}: host {path} mounted at {}: must be the same path",
            m["mountPath"]
        );
        Ok((path, m["readOnly"] == true))
    };
    let dev_mount = if spec.dev_sub_path.is_empty() {
        expect.dev_root.clone()
    } else {
        format!("{}/{}", expect.dev_root, spec.dev_sub_path)
    };
    for (name, want, read_only) in [
        ("plugins-registry", expect.registrar_dir.clone(), false),
        (
            "plugin-dir",
            format!("{}/{}", expect.plugins_dir, spec.driver),
            false,
        ),
        ("cdi", expect.cdi_root.clone(), false),
        ("sys", expect.sysfs_root.clone(), true),
        ("dev", dev_mount.clone(), true),
    ] {
        let (path, ro) = host_path(name)?;
        ensure!(path == want, "volume {name} at {path}, want {want}");
        ensure!(
            ro == read_only,
            "volume {name}: readOnly {ro}, want {read_only}"
        );
    }
    ensure!(
        mounts.len() == 5,
        "unexpected extra mounts: {}",
        mounts.len()
    );
    if dev_mount == expect.dev_root {
        ensure!(
            c["terminationMessagePath"]
                .as_str()
                .is_some_and(|p| !p.starts_with(&format!("{}/", expect.dev_root))),
            "with the whole device dir mounted read-only, the termination log must live elsewhere"
        );
    }
    Ok(())
}

fn check_rbac(expect: &Expect, objs: &[Value]) -> Result<()> {
    let role = one(objs, "ClusterRole", Some(&expect.fullname))?;
    let mut got: Vec<(String, String, Vec<String>)> = Vec::new();
    for rule in role["rules"]
        .as_array()
        .context("ClusterRole without rules")?
    {
        for group in str_list(&rule["apiGroups"]) {
            for res in str_list(&rule["resources"]) {
                got.push((
                    group.to_owned(),
                    res.to_owned(),
                    str_list(&rule["verbs"])
                        .into_iter()
                        .map(str::to_owned)
                        .collect(),
                ));
            }
        }
    }
    got.sort();
    let want: Vec<(String, String, Vec<String>)> = [
        ("", "nodes", vec!["get"]),
        ("resource.k8s.io", "resourceclaims", vec!["get"]),
        (
            "resource.k8s.io",
            "resourceslices",
            vec![
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
    ]
    .into_iter()
    .map(|(g, r, v)| {
        (
            g.to_owned(),
            r.to_owned(),
            v.into_iter().map(str::to_owned).collect(),
        )
    })
    .collect();
    ensure!(
        got == want,
        "ClusterRole rules are not least-privilege:\n got {got:?}\nwant {want:?}"
    );
    let binding = one(objs, "ClusterRoleBinding", Some(&expect.fullname))?;
    ensure!(
        binding["subjects"][0]["kind"] == "ServiceAccount"
            && binding["subjects"][0]["name"] == expect.service_account.as_str()
            && binding["subjects"][0]["namespace"] == NAMESPACE
            && binding["roleRef"]["name"] == expect.fullname.as_str(),
        "ClusterRoleBinding does not bind the driver's service account: {binding}"
    );
    Ok(())
}

fn check_vap(spec: &ChartSpec, expect: &Expect, objs: &[Value]) -> Result<()> {
    let policy = one(objs, "ValidatingAdmissionPolicy", None)?;
    let p = &policy["spec"];
    ensure!(p["failurePolicy"] == "Fail", "policy must fail closed");
    let rule = &p["matchConstraints"]["resourceRules"][0];
    ensure!(
        str_list(&rule["resources"]) == ["resourceslices"]
            && str_list(&rule["apiGroups"]) == ["resource.k8s.io"]
            && str_list(&rule["operations"]) == ["CREATE", "UPDATE", "DELETE"]
            && str_list(&rule["apiVersions"]) == ["*"],
        "policy must match create/update/delete of resourceslices in every version: {rule}"
    );
    let user = format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        expect.service_account
    );
    let cond = p["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        cond.contains(&format!("request.userInfo.username == \"{user}\"")),
        "policy must apply to the driver's service account only: {cond}"
    );
    let text = serde_json::to_string(p)?;
    for needle in [
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0]",
        "request.operation == 'DELETE' ? oldObject : object",
        "variables.slice.spec.?nodeName",
        "variables.userNodeName == variables.sliceNodeName",
        &format!("variables.slice.spec.driver == \\\"{}\\\"", spec.driver),
    ] {
        ensure!(text.contains(needle), "policy lacks `{needle}`");
    }
    let binding = one(objs, "ValidatingAdmissionPolicyBinding", None)?;
    ensure!(
        binding["spec"]["policyName"] == policy["metadata"]["name"]
            && str_list(&binding["spec"]["validationActions"]) == ["Deny"],
        "policy binding must Deny with the policy: {binding}"
    );
    Ok(())
}

fn check_device_classes(spec: &ChartSpec, expect: &Expect, objs: &[Value]) -> Result<()> {
    let classes = of_kind(objs, "DeviceClass");
    let names: Vec<&str> = classes
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    ensure!(
        names == expect.device_classes,
        "DeviceClasses {names:?}, want {:?}",
        expect.device_classes
    );
    let own = format!("device.driver == \"{}\"", spec.driver);
    for class in &classes {
        let exprs: Vec<&str> = class["spec"]["selectors"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|s| s["cel"]["expression"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        ensure!(
            exprs.first() == Some(&own.as_str()),
            "{}: first selector must be `{own}`: {exprs:?}",
            manifests::id(class)
        );
    }
    for (class, needle) in &expect.cel {
        let c = one(objs, "DeviceClass", Some(class))?;
        let text = serde_json::to_string(&c["spec"]["selectors"])?;
        let json_needle = serde_json::to_string(needle)?;
        let json_needle = json_needle.trim_matches('"');
        ensure!(
            text.contains(json_needle),
            "{class}: no selector containing {needle}: {text}"
        );
    }
    for (class, kind) in &expect.class_config {
        let c = one(objs, "DeviceClass", Some(class))?;
        let opaque = &c["spec"]["config"][0]["opaque"];
        ensure!(
            opaque["driver"] == spec.driver && opaque["parameters"]["kind"] == kind.as_str(),
            "{class}: config must be opaque {kind} for {}: {opaque}",
            spec.driver
        );
    }
    if expect.device_classes.is_empty() {
        bail!("a rendering without any DeviceClass is never expected here");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rendering of the EFA chart as the templates produce it, by hand, so
    /// that the assertions can be shown to pass on it and fail on each flaw.
    fn good_rendering() -> Vec<Value> {
        let yaml = include_str!("testdata/efa-rendered-defaults.yaml");
        manifests::parse(yaml).unwrap()
    }

    fn ds_container(objs: &mut [Value]) -> &mut Value {
        objs.iter_mut()
            .find(|o| o["kind"] == "DaemonSet")
            .map(|d| &mut d["spec"]["template"]["spec"]["containers"][0])
            .unwrap()
    }

    #[test]
    fn a_correct_rendering_passes() {
        check_rendered(&EFA, &Expect::defaults(&EFA), &good_rendering()).unwrap();
    }

    #[test]
    fn each_flaw_is_caught() {
        type Mutation = fn(&mut Vec<Value>);
        let table: [(&str, Mutation); 9] = [
            ("added capability", |o| {
                ds_container(o)["securityContext"]["capabilities"]["add"] =
                    serde_json::json!(["SYS_ADMIN"])
            }),
            ("writable root fs", |o| {
                ds_container(o)["securityContext"]["readOnlyRootFilesystem"] = false.into()
            }),
            ("sysfs writable", |o| {
                ds_container(o)["volumeMounts"][3]["readOnly"] = false.into()
            }),
            ("mount path differs from host path", |o| {
                ds_container(o)["volumeMounts"][0]["mountPath"] = "/registry".into()
            }),
            ("POD_UID not from the downward API", |o| {
                let env = ds_container(o)["env"].as_array_mut().unwrap();
                env.retain(|e| e["name"] != "POD_UID");
            }),
            ("maxUnavailable 1", |o| {
                let ds = o.iter_mut().find(|d| d["kind"] == "DaemonSet").unwrap();
                ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = 1.into();
            }),
            ("VAP without the DELETE case", |o| {
                let p = o
                    .iter_mut()
                    .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
                    .unwrap();
                p["spec"]["variables"][1]["expression"] = "object".into();
            }),
            ("list on claims", |o| {
                let r = o.iter_mut().find(|d| d["kind"] == "ClusterRole").unwrap();
                r["rules"][0]["verbs"] = serde_json::json!(["get", "list"]);
            }),
            ("misspelt field", |o| {
                ds_container(o)["livenessProbes"] = serde_json::json!({})
            }),
        ];
        for (flaw, mutate) in table {
            let mut objs = good_rendering();
            mutate(&mut objs);
            assert!(
                check_rendered(&EFA, &Expect::defaults(&EFA), &objs).is_err(),
                "not caught: {flaw}"
            );
        }
    }
}
