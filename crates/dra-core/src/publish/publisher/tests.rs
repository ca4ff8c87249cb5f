use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use prometheus::Registry;

use super::api::NODE_EVENT_NAMESPACE;
use super::clash_report::{CLASH_EVENT_REASON, ClashReport, clash_event};
use super::config::{PublishMetrics, PublisherConfig, PublisherConfigError};
use crate::publish::clash::Withheld;
use crate::publish::clash::{ClashSource, FOREIGN_PUBLISHERS, find_clashes};
use crate::publish::desired::{NodeOwner, PoolContent};
use crate::publish::reconcile::reconcile;

#[test]
fn config_checks_names_and_builds_selector() {
    let reg = Registry::new();
    let metrics = PublishMetrics::register(&reg).expect("register");
    let c = PublisherConfig::new(
        "efa.networking.k8s.aws",
        "ip-10-0-0-1.ec2.internal",
        None,
        metrics.clone(),
    )
    .expect("valid");
    // Every driver on the node: ours to reconcile, the others for clashes.
    assert_eq!(c.field_selector(), "spec.nodeName=ip-10-0-0-1.ec2.internal");
    let watch = c.watch_config();
    assert_eq!(
        watch.field_selector.as_deref(),
        Some("spec.nodeName=ip-10-0-0-1.ec2.internal")
    );
    // Lists from the watch cache, never a quorum read from etcd: the
    // request carries resourceVersion=0 only without a limit.
    assert_eq!(watch.list_semantic, watcher::ListSemantic::Any);
    assert_eq!(watch.page_size, None);
    let list = |limit| {
        let params = kube::api::ListParams {
            resource_version: Some("0".into()),
            limit,
            ..Default::default()
        };
        kube::core::Request::new("/apis/resource.k8s.io/v1/resourceslices")
            .list(&params)
            .expect("list request")
            .uri()
            .to_string()
    };
    assert!(list(None).contains("resourceVersion=0"), "{}", list(None));
    assert!(
        !list(Some(500)).contains("resourceVersion"),
        "{}",
        list(Some(500))
    );
    assert!(matches!(
        PublisherConfig::new("Bad_Driver", "n", None, metrics.clone()),
        Err(PublisherConfigError::InvalidDriverName(d)) if d == "Bad_Driver"
    ));
    assert!(matches!(
        PublisherConfig::new(
            &format!("{}.io", "a".repeat(61)),
            "n",
            None,
            metrics.clone()
        ),
        Err(PublisherConfigError::InvalidDriverName(_))
    ));
    assert!(matches!(
        PublisherConfig::new("d.io", "Node_1", None, metrics),
        Err(PublisherConfigError::InvalidNodeName(_))
    ));
    // Registering twice in one registry is refused, not silently shared.
    assert!(PublishMetrics::register(&reg).is_err());
}

#[test]
fn desired_counts_validation_issues() {
    let reg = Registry::new();
    let metrics = PublishMetrics::register(&reg).expect("register");
    let c = PublisherConfig::new("d.io", "n", None, metrics.clone()).expect("valid");
    let pool = c.desired(
        &PoolContent::devices(vec![
            Device {
                name: "BAD".into(),
                ..Default::default()
            },
            Device {
                name: "ok".into(),
                ..Default::default()
            },
        ]),
        true,
        &Withheld::default(),
    );
    assert_eq!(pool.device_count, 1);
    assert_eq!(
        metrics
            .validation_issues
            .with_label_values(&["device_dropped", "invalid_device_name"])
            .get(),
        1
    );
}

fn efa_device(name: &str, bdf: &str) -> Device {
    use k8s_openapi::api::resource::v1::DeviceAttribute;
    Device {
        name: name.into(),
        attributes: Some(
            [(
                crate::publish::clash::PCI_BUS_ID.to_string(),
                DeviceAttribute {
                    string: Some(bdf.into()),
                    ..Default::default()
                },
            )]
            .into(),
        ),
        ..Default::default()
    }
}

#[test]
fn withheld_devices_leave_the_pool_and_a_withdrawn_pool_has_no_slice() {
    let reg = Registry::new();
    let metrics = PublishMetrics::register(&reg).expect("register");
    let c = PublisherConfig::new("efa.networking.k8s.aws", "n", None, metrics).expect("valid");
    let content = PoolContent::devices(vec![
        efa_device("efa-a", "0000:10:1b.0"),
        efa_device("efa-b", "0000:20:1b.0"),
    ]);
    let some = Withheld {
        pool: false,
        devices: BTreeSet::from(["efa-a".to_string()]),
    };
    let pool = c.desired(&content, true, &some);
    let names: Vec<&str> = pool
        .slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["efa-b"]);
    assert_eq!(pool.device_count, 1);
    // Every device withheld but the pool ours: an empty pool, one slice.
    let all = Withheld {
        pool: false,
        devices: BTreeSet::from(["efa-a".to_string(), "efa-b".to_string()]),
    };
    assert_eq!(c.desired(&content, true, &all).slices.len(), 1);
    let withdrawn = Withheld {
        pool: true,
        devices: all.devices.clone(),
    };
    let pool = c.desired(&content, true, &withdrawn);
    assert!(pool.slices.is_empty());
    // ... which reconcile turns into deleting our slices, and only ours.
    let ours = c.desired(&content, true, &Withheld::default()).slices;
    let actions = reconcile(&ours, &pool.slices);
    assert!(actions.iter().all(|a| a.verb() == "delete"));
    assert_eq!(actions.len(), ours.len());
}

fn dranet_slice(name: &str, bdfs: &[&str]) -> ResourceSlice {
    use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSliceSpec};
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: "dra.net".into(),
            node_name: Some("n".into()),
            devices: Some(
                bdfs.iter()
                    .map(|b| Device {
                        name: format!("pci-{}", b.replace([':', '.'], "-")),
                        attributes: Some(
                            [(
                                "dra.net/pciAddress".to_string(),
                                DeviceAttribute {
                                    string: Some((*b).into()),
                                    ..Default::default()
                                },
                            )]
                            .into(),
                        ),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    }
}

#[test]
fn each_clash_is_reported_once_and_the_gauge_clears() {
    let reg = Registry::new();
    let metrics = PublishMetrics::register(&reg).expect("register");
    let c =
        PublisherConfig::new("efa.networking.k8s.aws", "n", None, metrics.clone()).expect("valid");
    let ours = vec![
        efa_device("efa-a", "0000:10:1b.0"),
        efa_device("efa-b", "0000:20:1b.0"),
    ];
    let gauge = || {
        metrics
            .withheld_devices
            .with_label_values(&["dra.net"])
            .get()
    };
    let mut report = ClashReport::default();
    let clashes = |slices: &[ResourceSlice]| {
        let refs: Vec<&ResourceSlice> = slices.iter().collect();
        find_clashes(
            c.driver_name.as_str(),
            "n",
            &refs,
            &ours,
            FOREIGN_PUBLISHERS,
        )
    };
    // (slices on the node, clashes reported as started, gauge after)
    let steps: Vec<(Vec<ResourceSlice>, usize, i64)> = vec![
        (vec![], 0, 0),
        (vec![dranet_slice("d", &["0000:10:1b.0"])], 1, 1),
        // The same clash again (any watch event): not reported again.
        (vec![dranet_slice("d", &["0000:10:1b.0"])], 0, 1),
        // It takes one more device of ours: reported, with both.
        (
            vec![dranet_slice("d", &["0000:10:1b.0", "0000:20:1b.0"])],
            1,
            2,
        ),
        // Shrinks: nothing new to say.
        (vec![dranet_slice("d", &["0000:20:1b.0"])], 0, 1),
        // Gone: the gauge reads 0, not a stale value.
        (vec![], 0, 0),
        // Back: a new clash.
        (vec![dranet_slice("d", &["0000:20:1b.0"])], 1, 1),
    ];
    for (i, (slices, want_started, want_gauge)) in steps.into_iter().enumerate() {
        let started = report.update(&clashes(&slices), &c);
        assert_eq!(started.len(), want_started, "step {i}");
        assert_eq!(gauge(), want_gauge, "step {i}");
    }
    let text = {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&reg.gather(), &mut buf)
            .expect("encode");
        String::from_utf8(buf).expect("utf8")
    };
    assert!(
        text.contains("aws_dra_publish_withheld_devices{other_driver=\"dra.net\"} 1"),
        "{text}"
    );
}

#[test]
fn the_node_event_names_the_other_driver_and_the_devices() {
    let reg = Registry::new();
    let metrics = PublishMetrics::register(&reg).expect("register");
    let owner = NodeOwner {
        name: "n".into(),
        uid: "node-uid".into(),
    };
    let c =
        PublisherConfig::new("efa.networking.k8s.aws", "n", Some(owner), metrics).expect("valid");
    let source = ClashSource {
        driver: "dra.net".into(),
        slice: "n-dra.net-abcde".into(),
    };
    let devices: BTreeSet<String> = (0..20).map(|i| format!("efa-{i:02}")).collect();
    let e = clash_event(&c, &source, &devices, false, Timestamp::UNIX_EPOCH);
    assert_eq!(e.reason.as_deref(), Some(CLASH_EVENT_REASON));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.metadata.namespace.as_deref(), Some(NODE_EVENT_NAMESPACE));
    assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(e.involved_object.name.as_deref(), Some("n"));
    assert_eq!(e.involved_object.uid.as_deref(), Some("node-uid"));
    let message = e.message.unwrap_or_default();
    assert!(
        message.contains("dra.net")
            && message.contains("n-dra.net-abcde")
            && message.contains("efa-00")
            && message.contains("efa-15")
            && !message.contains("efa-16")
            && message.contains("and 4 more"),
        "{message}"
    );
    let withdrawn = clash_event(&c, &source, &devices, true, Timestamp::UNIX_EPOCH);
    assert!(
        withdrawn
            .message
            .unwrap_or_default()
            .contains("all efa.networking.k8s.aws devices")
    );
}
