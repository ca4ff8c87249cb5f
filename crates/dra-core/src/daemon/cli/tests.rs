use super::*;
use crate::publish::desired::desired_slices;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

const DRIVER: &str = "efa.networking.k8s.aws";

/// Every environment variable the CLI reads.
const ENV_TWINS: [&str; 18] = [
    "SYSFS_ROOT",
    "DEV_ROOT",
    "NODE_NAME",
    "DRIVER_NAME",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "KUBELET_REGISTRAR_DIRECTORY_PATH",
    "KUBELET_PLUGINS_DIRECTORY_PATH",
    "CDI_ROOT",
    "POD_UID",
    "METRICS_ADDRESS",
    "KUBECONFIG",
    "ALLOW_DEVICE_PLUGIN_COEXISTENCE",
    "RESCAN_INTERVAL_SECONDS",
    "DEVICE_RELEASE_WAIT_SECONDS",
    "DEVICE_ATTRIBUTES_FILES",
    "DEVICE_ATTRIBUTES_ROOT",
    "OUTPUT_FORMAT",
];
const CHILD_MARKER: &str = "DRA_CORE_CLI_ENV_CHILD";

fn parse(args: &[&str]) -> Result<DriverCli, clap::Error> {
    DriverCli::try_parse_for("efa-driver", "0.1.0", DRIVER, args)
}

/// A driver's own flags sit next to the shared ones on `run` and
/// `discover`, with the same implicit `run` and default driver name.
#[test]
fn driver_specific_flags() {
    #[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
    struct Extra {
        #[arg(long, default_value = "auto")]
        partitions: String,
    }
    let parse = |args: &[&str]| -> Result<DriverCli<Extra>, clap::Error> {
        DriverCli::try_parse_for("efa-driver", "0.1.0", DRIVER, args)
    };
    let cli = parse(&["efa-driver", "--node-name", "n1", "--partitions", "cores"]).unwrap();
    let DriverCommand::Run(run) = cli.command else {
        panic!("run is implied")
    };
    assert_eq!(run.extra.partitions, "cores");
    assert_eq!(run.common.driver_name, DRIVER);
    let cli = parse(&["efa-driver", "run", "--node-name", "n1"]).unwrap();
    let DriverCommand::Run(run) = cli.command else {
        panic!("run")
    };
    assert_eq!(run.extra.partitions, "auto");
    let cli = parse(&[
        "efa-driver",
        "discover",
        "--node-name",
        "n1",
        "--partitions",
        "chips",
    ])
    .unwrap();
    let DriverCommand::Discover(discover) = cli.command else {
        panic!("discover")
    };
    assert_eq!(discover.extra.partitions, "chips");
}

/// `--rescan-interval` is `run`'s, for every driver: at least one second,
/// 10 by default, and not a `discover` flag.
#[test]
fn rescan_interval_flag() {
    let r = run_of(parse(&["x", "--node-name", "n1"]).expect("parse"));
    assert_eq!(r.run.rescan_interval, 10);
    assert_eq!(r.rescan_config().interval, Duration::from_secs(10));
    let r =
        run_of(parse(&["x", "run", "--node-name", "n1", "--rescan-interval", "5"]).expect("parse"));
    assert_eq!(r.rescan_config().interval, Duration::from_secs(5));
    for bad in ["0", "-1", "soon"] {
        assert!(
            parse(&["x", "run", "--node-name", "n1", "--rescan-interval", bad]).is_err(),
            "{bad}"
        );
    }
    assert!(
        parse(&[
            "x",
            "discover",
            "--node-name",
            "n",
            "--rescan-interval",
            "5"
        ])
        .is_err()
    );
}

/// `--device-release-wait`: 30 s by default, 0 allowed (refuse at once).
#[test]
fn device_release_wait_flag() {
    let r = run_of(parse(&["x", "--node-name", "n1"]).expect("parse"));
    let o = r.runtime_options(&[], Registry::new());
    assert_eq!(o.device_release_wait, Duration::from_secs(30));
    for (arg, want) in [("0", 0), ("3", 3)] {
        let r = run_of(
            parse(&["x", "--node-name", "n1", "--device-release-wait", arg]).expect("parse"),
        );
        let o = r.runtime_options(&[], Registry::new());
        assert_eq!(o.device_release_wait, Duration::from_secs(want));
    }
    assert!(parse(&["x", "--node-name", "n1", "--device-release-wait", "-1"]).is_err());
}

/// `--api-request-timeout`: 30 s by default; 0 is refused (no request
/// may go unbounded).
#[test]
fn api_request_timeout_flag() {
    let r = run_of(parse(&["x", "--node-name", "n1"]).expect("parse"));
    let o = r.runtime_options(&[], Registry::new());
    assert_eq!(o.api_request_timeout, Duration::from_secs(30));
    let r =
        run_of(parse(&["x", "--node-name", "n1", "--api-request-timeout", "5"]).expect("parse"));
    let o = r.runtime_options(&[], Registry::new());
    assert_eq!(o.api_request_timeout, Duration::from_secs(5));
    assert!(parse(&["x", "--node-name", "n1", "--api-request-timeout", "0"]).is_err());
}

#[test]
fn runtime_options_from_flags() {
    let r = run_of(
        parse(&[
            "x",
            "run",
            "--node-name",
            "n1",
            "--pod-uid",
            "",
            "--kubeconfig",
            "/k",
        ])
        .expect("parse"),
    );
    let o = r.runtime_options(&["vpc.amazonaws.com/efa"], Registry::new());
    assert_eq!(o.node_name, "n1");
    assert_eq!(o.driver_name, DRIVER);
    assert_eq!(o.pod_uid, None, "an empty POD_UID means plain socket names");
    assert_eq!(o.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!(o.device_plugin_resources, ["vpc.amazonaws.com/efa"]);
    let r = run_of(parse(&["x", "--node-name", "n1", "--pod-uid", "abc"]).expect("parse"));
    assert_eq!(
        r.runtime_options(&[], Registry::new()).pod_uid.as_deref(),
        Some("abc")
    );
}

/// Parses `args` in a child process (this test binary) whose environment
/// holds exactly `env` among the twins: env mutation is `unsafe` in Rust
/// 2024 and racy in a threaded test binary, a child process is neither.
fn parse_in_child(test: &str, args: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for v in ENV_TWINS {
        cmd.env_remove(v);
    }
    cmd.env(CHILD_MARKER, args).envs(env.iter().copied());
    let out = cmd.output().expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.split_once("PARSED: ").map(|(_, parsed)| parsed))
        .unwrap_or_else(|| {
            panic!(
                "child printed no result: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned()
}

/// In the child: parse the marker's arguments with the inherited
/// environment and print the result. Returns true when in the child.
fn child_mode() -> bool {
    let Some(args) = std::env::var_os(CHILD_MARKER) else {
        return false;
    };
    let args = args.to_string_lossy().into_owned();
    let argv: Vec<&str> = args.split(' ').collect();
    println!("PARSED: {:?}", parse(&argv).map_err(|e| e.kind()));
    true
}

#[test]
fn env_twins_set_every_flag() {
    if child_mode() {
        return;
    }
    let env = [
        ("SYSFS_ROOT", "/e/sys"),
        ("DEV_ROOT", "/e/dev"),
        ("NODE_NAME", "node-e"),
        ("DRIVER_NAME", "neuron.aws.com"),
        ("LOG_FORMAT", "json"),
        ("LOG_LEVEL", "dra_core=debug"),
        ("KUBELET_REGISTRAR_DIRECTORY_PATH", "/e/reg"),
        ("KUBELET_PLUGINS_DIRECTORY_PATH", "/e/plug"),
        ("CDI_ROOT", "/e/cdi"),
        ("POD_UID", "pod-1"),
        ("METRICS_ADDRESS", "127.0.0.1:9999"),
        ("KUBECONFIG", "/e/kubeconfig"),
        ("ALLOW_DEVICE_PLUGIN_COEXISTENCE", "true"),
        ("RESCAN_INTERVAL_SECONDS", "7"),
        ("DEVICE_RELEASE_WAIT_SECONDS", "3"),
        ("API_REQUEST_TIMEOUT_SECONDS", "9"),
        ("DEVICE_ATTRIBUTES_FILES", "false"),
        ("DEVICE_ATTRIBUTES_ROOT", "/e/attrs"),
    ];
    let want = DriverCli {
        command: DriverCommand::Run(RunCommand {
            common: CommonArgs {
                sysfs_root: "/e/sys".into(),
                dev_root: "/e/dev".into(),
                node_name: "node-e".into(),
                driver_name: "neuron.aws.com".into(),
                log_format: LogFormat::Json,
                log_level: "dra_core=debug".into(),
                verbose: 0,
            },
            run: RunArgs {
                kubelet_registrar_dir: "/e/reg".into(),
                kubelet_plugins_dir: "/e/plug".into(),
                cdi_root: "/e/cdi".into(),
                pod_uid: Some("pod-1".into()),
                metrics_address: "127.0.0.1:9999".parse().expect("addr"),
                kubeconfig: Some("/e/kubeconfig".into()),
                allow_device_plugin_coexistence: true,
                rescan_interval: 7,
                device_release_wait: 3,
                api_request_timeout: 9,
                device_attributes_files: false,
                device_attributes_root: Some("/e/attrs".into()),
            },
            extra: NoExtraArgs {},
        }),
    };
    // The test's name as libtest knows it: its module path without the crate.
    let test = &format!(
        "{}::env_twins_set_every_flag",
        module_path!().split_once("::").unwrap().1
    );
    assert_eq!(
        parse_in_child(test, "efa-driver", &env),
        format!("{:?}", Ok::<_, ()>(want.clone()))
    );

    // A flag beats its twin; "false" turns a boolean twin off.
    let mut flag_wins = want.clone();
    let DriverCommand::Run(r) = &mut flag_wins.command else {
        unreachable!()
    };
    r.common.node_name = "from-flag".into();
    r.run.allow_device_plugin_coexistence = false;
    let mut env2 = env.to_vec();
    env2.retain(|(k, _)| *k != "ALLOW_DEVICE_PLUGIN_COEXISTENCE");
    env2.push(("ALLOW_DEVICE_PLUGIN_COEXISTENCE", "false"));
    assert_eq!(
        parse_in_child(test, "efa-driver run --node-name from-flag", &env2),
        format!("{:?}", Ok::<_, ()>(flag_wins))
    );

    // discover's own twin.
    let out = parse_in_child(
        test,
        "efa-driver discover",
        &[("NODE_NAME", "n"), ("OUTPUT_FORMAT", "yaml")],
    );
    assert!(
        out.contains("output: Yaml") && out.contains("node_name: \"n\""),
        "{out}"
    );

    // Without NODE_NAME nor the flag, parsing fails.
    let out = parse_in_child(test, "efa-driver run", &[]);
    assert_eq!(out, "Err(MissingRequiredArgument)");
}

fn run_of(cli: DriverCli) -> RunCommand {
    match cli.command {
        DriverCommand::Run(r) => r,
        other => panic!("expected run, got {other:?}"),
    }
}

#[test]
fn run_defaults() {
    let r = run_of(parse(&["efa-driver", "--node-name", "n1"]).expect("parse"));
    assert_eq!(r.common.sysfs_root, PathBuf::from("/sys"));
    assert_eq!(r.common.dev_root, PathBuf::from("/dev"));
    assert_eq!(r.common.node_name, "n1");
    assert_eq!(r.common.driver_name, DRIVER);
    assert_eq!(r.common.log_format, LogFormat::Text);
    assert_eq!(r.common.log_filter(), "info");
    assert_eq!(
        r.run.kubelet_registrar_dir,
        PathBuf::from("/var/lib/kubelet/plugins_registry")
    );
    assert_eq!(
        r.run.kubelet_plugins_dir,
        PathBuf::from("/var/lib/kubelet/plugins")
    );
    assert_eq!(r.run.cdi_root, PathBuf::from("/var/run/cdi"));
    assert_eq!(r.run.pod_uid, None);
    assert_eq!(r.run.metrics_address, "0.0.0.0:8080".parse().expect("addr"));
    assert_eq!(r.run.kubeconfig, None);
    assert!(!r.run.allow_device_plugin_coexistence);
}

#[test]
fn explicit_run_and_flags() {
    let r = run_of(
        parse(&[
            "efa-driver",
            "run",
            "--node-name",
            "n1",
            "--driver-name",
            "x.example.com",
            "--sysfs-root",
            "/f/sys",
            "--dev-root",
            "/f/dev",
            "--log-format",
            "json",
            "-vv",
            "--kubelet-registrar-dir",
            "/r",
            "--kubelet-plugins-dir",
            "/p",
            "--cdi-root",
            "/c",
            "--pod-uid",
            "abc",
            "--metrics-address",
            "127.0.0.1:9",
            "--kubeconfig",
            "/k",
            "--allow-device-plugin-coexistence",
        ])
        .expect("parse"),
    );
    assert_eq!(r.common.driver_name, "x.example.com");
    assert_eq!(r.common.sysfs_root, PathBuf::from("/f/sys"));
    assert_eq!(r.common.log_format, LogFormat::Json);
    assert_eq!(r.common.log_filter(), "trace");
    assert_eq!(r.run.kubelet_registrar_dir, PathBuf::from("/r"));
    assert_eq!(r.run.pod_uid.as_deref(), Some("abc"));
    assert_eq!(r.run.metrics_address, "127.0.0.1:9".parse().expect("addr"));
    assert_eq!(r.run.kubeconfig, Some(PathBuf::from("/k")));
    assert!(r.run.allow_device_plugin_coexistence);
}

#[test]
fn discover_and_errors() {
    let cli = parse(&[
        "neuron-driver",
        "discover",
        "--node-name",
        "n",
        "-o",
        "yaml",
    ])
    .expect("parse");
    let DriverCommand::Discover(d) = cli.command else {
        panic!("discover expected")
    };
    assert_eq!(d.discover.output, OutputFormat::Yaml);
    assert_eq!(d.common.driver_name, DRIVER);
    // discover does not take run flags
    assert!(parse(&["x", "discover", "--node-name", "n", "--cdi-root", "/c"]).is_err());
    assert!(parse(&["x", "discover", "--node-name", "n", "-o", "xml"]).is_err());
    assert!(parse(&["x", "run", "--node-name", "n", "--metrics-address", "nope"]).is_err());
    assert!(parse(&["x", "run", "--node-name", "n", "--log-format", "xml"]).is_err());
}

fn sample_slices() -> Vec<ResourceSlice> {
    let devices: Vec<Device> = (0..130)
        .map(|i| Device {
            name: format!("efa-0000-{i:02x}-00-0"),
            attributes: Some(
                [
                    (
                        "rdmaDevice".to_string(),
                        DeviceAttribute {
                            string: Some(format!("rdmap{i}s0")),
                            ..Default::default()
                        },
                    ),
                    (
                        "resource.kubernetes.io/numaNode".to_string(),
                        DeviceAttribute {
                            int: Some(i % 2),
                            ..Default::default()
                        },
                    ),
                    (
                        "yes".to_string(),
                        DeviceAttribute {
                            bool: Some(true),
                            ..Default::default()
                        },
                    ),
                    (
                        "draDriverVersion".to_string(),
                        DeviceAttribute {
                            version: Some("0.1.0".into()),
                            ..Default::default()
                        },
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        })
        .collect();
    desired_slices(DRIVER, "ip-10-0-0-1.ec2.internal", None, &devices)
}

#[test]
fn render_round_trips_in_both_formats() {
    let slices = sample_slices();
    assert_eq!(slices.len(), 2);
    for format in [OutputFormat::Json, OutputFormat::Yaml] {
        let text = render_list(&slices, format).expect("render");
        let value: serde_json::Value = match format {
            OutputFormat::Json => serde_json::from_str(&text).expect("json parses"),
            OutputFormat::Yaml => serde_saphyr::from_str(&text).expect("yaml parses"),
        };
        assert_eq!(value["apiVersion"], "v1", "{format:?}");
        assert_eq!(value["kind"], "List", "{format:?}");
        let items = value["items"].as_array().expect("items");
        assert_eq!(items.len(), 2);
        for item in items {
            assert_eq!(item["apiVersion"], "resource.k8s.io/v1");
            assert_eq!(item["kind"], "ResourceSlice");
        }
        let back: Vec<ResourceSlice> =
            serde_json::from_value(value["items"].clone()).expect("items are ResourceSlices");
        assert_eq!(back, slices, "{format:?} round trip");
        assert!(text.ends_with('\n'));
    }
}

#[test]
fn render_empty_pool() {
    let slices = desired_slices(DRIVER, "n", None, &[]);
    let text = render_list(&slices, OutputFormat::Json).expect("render");
    let value: serde_json::Value = serde_json::from_str(&text).expect("parses");
    assert_eq!(value["items"][0]["spec"]["pool"]["resourceSliceCount"], 1);
    assert_eq!(value["items"][0]["spec"].get("devices"), None);
}

/// Device attributes files: on by default, `--device-attributes-files=false`
/// (or the bare flag, `true`) and a host directory of its own.
#[test]
fn device_attributes_flags() {
    let o = run_of(parse(&["x", "--node-name", "n1"]).expect("parse"))
        .runtime_options(&[], Registry::new());
    assert!(o.device_attributes.enabled);
    assert_eq!(o.device_attributes.host_dir, None);
    let cases = [
        (vec!["--device-attributes-files=false"], false),
        (vec!["--device-attributes-files", "false"], false),
        (vec!["--device-attributes-files"], true),
    ];
    for (flags, want) in cases {
        let mut args = vec!["x", "--node-name", "n1"];
        args.extend(&flags);
        let o = run_of(parse(&args).expect("parse")).runtime_options(&[], Registry::new());
        assert_eq!(o.device_attributes.enabled, want, "{flags:?}");
    }
    let o = run_of(
        parse(&["x", "--node-name", "n1", "--device-attributes-root", "/a"]).expect("parse"),
    )
    .runtime_options(&[], Registry::new());
    assert_eq!(o.device_attributes.host_dir, Some(PathBuf::from("/a")));
}
