//! The driver against generated hardware trees: every attribute is checked
//! against the fixture's own description, device groups against the EFA side
//! of `topology`, LNC through `dra-core`'s config resolution, and the binary's
//! `discover` output.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use dra_core::testing::{PoolId, RescanConfig, Rescanner, Trigger};
use dra_core::{AllocatedDevice, ClaimRef, Driver};
use dra_core::{DeviceInventory, HostPaths};
use dra_core::{config_for_request, decode_allocation_configs};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAllocationConfiguration, DeviceAttribute, OpaqueDeviceConfiguration,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use neuron_driver::NeuronInventory;
use neuron_driver::bdf::{BdfError, BdfSource, NeuronIoctl, StaticBdf};
use neuron_driver::discovery::{BdfCache, NodeInventory, discover};
use neuron_driver::prepare::{ENV_LNC, ENV_VISIBLE_CORES, claim_edits};
use neuron_driver::{DRIVER_NAME, NeuronConfig, NeuronDriver, devices};
use sysfs_fixtures::{ChipTopology, DeviceNodes, Fixture, generate, generate_spec, spec};
use topology::{InstanceType, PciAddress, SysfsRoot};

const NEURON_TYPES: [&str; 4] = [
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "inf2.48xlarge",
];

fn fixture(instance: &str) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let fx = generate(instance, dir.path()).unwrap();
    (dir, fx)
}

/// Answers the BDF ioctl as the fixture says the kernel would.
fn fixture_bdf(fx: &Fixture) -> StaticBdf {
    StaticBdf {
        answers: fx
            .neuron_chips
            .iter()
            .map(|c| {
                (
                    fx.dev.join(format!("neuron{}", c.index)),
                    Ok(c.bdf.parse::<PciAddress>().unwrap()),
                )
            })
            .collect(),
    }
}

fn scan(fx: &Fixture, bdf: &dyn BdfSource) -> NodeInventory {
    discover(
        &SysfsRoot::new(&fx.sys),
        &fx.dev,
        bdf,
        &mut BdfCache::default(),
    )
    .unwrap()
}

fn attr<'a>(d: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    d.attributes.as_ref().unwrap().get(name)
}
fn s<'a>(d: &'a Device, name: &str) -> Option<&'a str> {
    attr(d, name).map(|a| a.string.as_deref().expect(name))
}
fn i(d: &Device, name: &str) -> Option<i64> {
    attr(d, name).map(|a| a.int.expect(name))
}

const GROUP_ATTRS: [&str; 4] = [
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
];

/// Device memory per chip from AWS's instance table.
fn memory(instance: &str) -> &'static str {
    match instance {
        "trn2.48xlarge" => "96Gi",
        _ => "32Gi",
    }
}

#[test]
fn every_attribute_on_every_neuron_fixture() {
    for instance in NEURON_TYPES {
        let (_dir, fx) = fixture(instance);
        let inv = scan(&fx, &fixture_bdf(&fx));
        let devs = devices(&inv);
        let it: InstanceType = instance.parse().unwrap();
        let version = std::fs::read_to_string(fx.sys.join("module/neuron/version")).unwrap();
        let neuron = fx.spec.neuron.as_ref().unwrap();
        let torus = neuron.topology == ChipTopology::Torus4x4;
        let efa_enabled = !fx.efas.is_empty();
        assert_eq!(devs.len(), fx.neuron_chips.len(), "{instance}");
        for (chip, d) in fx.neuron_chips.iter().zip(&devs) {
            let ctx = format!("{instance} chip {}", chip.index);
            assert_eq!(d.name, format!("neurondevice{}", chip.index), "{ctx}");
            assert_eq!(i(d, "deviceId"), Some(chip.index.into()), "{ctx}");
            assert_eq!(s(d, "instanceType"), Some(instance), "{ctx}");
            assert_eq!(s(d, "neuronDriverVersion"), Some(version.trim()), "{ctx}");
            assert_eq!(
                attr(d, "draDriverVersion").unwrap().version.as_deref(),
                Some(env!("CARGO_PKG_VERSION")),
                "{ctx}"
            );
            assert_eq!(s(d, "resourceType"), Some("neuron_device"), "{ctx}");
            assert_eq!(i(d, "coreCount"), Some(chip.core_count.into()), "{ctx}");
            let (x, y) = if torus {
                (
                    Some(i64::from(chip.index / 4)),
                    Some(i64::from(chip.index % 4)),
                )
            } else {
                (None, None)
            };
            assert_eq!((i(d, "topology_x"), i(d, "topology_y")), (x, y), "{ctx}");
            // AWS's names for the row (group of 4) and the pair of rows.
            assert_eq!(i(d, "topology4_id"), x, "{ctx}");
            assert_eq!(
                i(d, "topology8_id"),
                torus.then(|| i64::from(chip.index / 8)),
                "{ctx}"
            );
            assert_eq!(
                s(d, "resource.kubernetes.io/pciBusID"),
                Some(chip.bdf.as_str()),
                "{ctx}"
            );
            assert_eq!(
                s(d, "resource.kubernetes.io/pcieRoot"),
                Some(chip.pcie_root.as_str()),
                "{ctx}"
            );
            assert_eq!(
                i(d, "resource.kubernetes.io/numaNode"),
                chip.numa_node.map(i64::from),
                "{ctx}"
            );

            let mut expected: BTreeSet<&str> = [
                "deviceId",
                "instanceType",
                "neuronDriverVersion",
                "draDriverVersion",
                "resourceType",
                "coreCount",
                "resource.kubernetes.io/pciBusID",
                "resource.kubernetes.io/pcieRoot",
            ]
            .into();
            if chip.numa_node.is_some() {
                expected.insert("resource.kubernetes.io/numaNode");
            }
            if torus {
                expected.extend(["topology_x", "topology_y", "topology4_id", "topology8_id"]);
            }
            if efa_enabled {
                expected.extend(GROUP_ATTRS);
                // The chip's EFA (devicegroup1_id) is one of the fixture's
                // EFAs, and the EFA side computes the same four values for it.
                let efa = s(d, GROUP_ATTRS[0]).unwrap();
                assert!(fx.efa(efa).is_some(), "{ctx}: {efa} is not an EFA");
                let efa_groups =
                    topology::device_groups_for_efa(&it, efa.parse().unwrap()).unwrap();
                for (name, value) in efa_groups.attributes() {
                    assert_eq!(
                        s(d, &format!("resource.aws.com/{name}")),
                        Some(value),
                        "{ctx}: {name}"
                    );
                }
            }
            let got: BTreeSet<&str> = d
                .attributes
                .as_ref()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(got, expected, "{ctx}: attribute set");

            let cap = d.capacity.as_ref().unwrap();
            assert_eq!(cap["cores"].value.0, chip.core_count.to_string(), "{ctx}");
            assert_eq!(cap["memory"].value.0, memory(instance), "{ctx}");
            assert_eq!(cap.len(), 2, "{ctx}");
        }
    }
}

#[test]
fn trn2_chips_share_a_switch_with_their_group1_efa() {
    // Independent of the table: on trn2 the fixture puts each chip below the
    // same PCIe switch as its EFA, so devicegroup1_id must name that EFA.
    let (_dir, fx) = fixture("trn2.48xlarge");
    let devs = devices(&scan(&fx, &fixture_bdf(&fx)));
    for (chip, d) in fx.neuron_chips.iter().zip(&devs) {
        let switch = &chip.bridges[..chip.bridges.len() - 1];
        let mates: Vec<&str> = fx
            .efas
            .iter()
            .filter(|e| e.bridges.starts_with(switch))
            .map(|e| e.bdf.as_str())
            .collect();
        assert_eq!(
            mates,
            [s(d, GROUP_ATTRS[0]).unwrap()],
            "chip {}",
            chip.index
        );
    }
}

#[test]
fn check_value_through_published_attributes() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    let devs = devices(&scan(&fx, &fixture_bdf(&fx)));
    let chip0 = devs.iter().find(|d| d.name == "neurondevice0").unwrap();
    let got: Vec<&str> = GROUP_ATTRS.iter().map(|a| s(chip0, a).unwrap()).collect();
    assert_eq!(
        got,
        [
            "0000:c9:00.0",
            "13713e551cd37c19",
            "3593812b8066a078",
            "821d14afaf11327d"
        ]
    );
    // And chip 0's own PCI function is where the kernel numbers it.
    assert_eq!(
        s(chip0, "resource.kubernetes.io/pciBusID"),
        Some("0000:cc:00.0")
    );
}

#[test]
fn no_accelerator_node_publishes_an_empty_pool() {
    let (_dir, fx) = fixture("m5.8xlarge");
    let inv = scan(&fx, &fixture_bdf(&fx));
    assert!(inv.chips.is_empty());
    assert_eq!(inv.instance_type.unwrap().as_str(), "m5.8xlarge");
    let devs = devices(&scan(&fx, &fixture_bdf(&fx)));
    assert!(devs.is_empty());
    let slices = dra_core::testing::desired_slices(DRIVER_NAME, "n1", None, &devs);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.devices, None);
    assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
}

/// Counts lookups, answering like the kernel would.
struct Counting(StaticBdf, AtomicUsize);
impl BdfSource for Counting {
    fn chip_address(&self, node: &Path) -> Result<PciAddress, BdfError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.chip_address(node)
    }
}

#[test]
fn real_ioctl_falls_back_on_plain_files_and_char_devices() {
    for nodes in [DeviceNodes::PlainFiles, DeviceNodes::CharDevices] {
        let dir = tempfile::tempdir().unwrap();
        let fx = generate_spec(spec("trn2.48xlarge").unwrap(), dir.path(), Some(nodes)).unwrap();
        let with_pci = devices(&scan(&fx, &fixture_bdf(&fx)));
        let without = devices(&scan(&fx, &NeuronIoctl));
        assert_eq!(without.len(), 16, "{nodes:?}");
        for (a, b) in with_pci.iter().zip(&without) {
            let mut a_attrs = a.attributes.clone().unwrap();
            for k in [
                "resource.kubernetes.io/pciBusID",
                "resource.kubernetes.io/pcieRoot",
                "resource.kubernetes.io/numaNode",
            ] {
                assert!(a_attrs.remove(k).is_some(), "{nodes:?} {k}");
            }
            // Everything else, device groups included, is still published.
            assert_eq!(b.attributes.as_ref().unwrap(), &a_attrs, "{nodes:?}");
            assert_eq!(a.capacity, b.capacity);
        }
    }
}

#[test]
fn rescans_look_chips_up_once_and_feed_prepare() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    let counter = Arc::new(Counting(fixture_bdf(&fx), AtomicUsize::new(0)));
    struct Shared(Arc<Counting>);
    impl BdfSource for Shared {
        fn chip_address(&self, node: &Path) -> Result<PciAddress, BdfError> {
            self.0.chip_address(node)
        }
    }
    let mut inventory = NeuronInventory::new(&host(&fx), Box::new(Shared(counter.clone())));
    let shared = inventory.shared().clone();
    let lookups = || counter.1.load(Ordering::SeqCst);
    let names = |found: &[dra_core::ScannedDevice]| -> Vec<String> {
        found.iter().map(|s| s.device.name.clone()).collect()
    };

    let first = inventory.scan().unwrap();
    assert_eq!((first.len(), lookups()), (16, 16));
    assert!(first.iter().all(|s| s.health.conditions.is_empty()));
    assert_eq!(inventory.scan().unwrap(), first, "unchanged");
    assert_eq!(lookups(), 16, "no ioctl on a rescan");

    let chip5 = &fx.neuron_chips[5];
    fx.unbind_driver(&chip5.bdf).unwrap();
    let found = inventory.scan().unwrap();
    assert_eq!(found.len(), 15);
    assert!(!names(&found).contains(&"neurondevice5".to_owned()));
    assert!(
        shared.read().unwrap().chip(5).is_none(),
        "prepare sees the scan"
    );

    fx.bind_driver(&chip5.bdf).unwrap();
    assert_eq!(inventory.scan().unwrap().len(), 16);
    assert!(shared.read().unwrap().chip(5).is_some());
    assert_eq!(lookups(), 17, "a chip that came back is looked up again");
}

fn host(fx: &Fixture) -> HostPaths {
    HostPaths {
        sysfs_root: fx.sys.clone(),
        dev_root: fx.dev.clone(),
    }
}

/// A uevent makes the watcher rescan at once, long before its periodic
/// rescan (1 hour here) would: the chip set follows unbind and bind.
#[test]
fn a_uevent_triggers_a_rescan() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let inventory = NeuronInventory::new(&host(&fx), Box::new(fixture_bdf(&fx)));
        let (rescanner, feeds) = Rescanner::new(
            inventory,
            PoolId {
                driver: "neuron.aws.com",
                pool: "node",
            },
            None,
            None,
        );
        rescanner.rescan(Trigger::Start).await.unwrap();
        let mut rx = feeds.devices.clone();
        let (uevent_tx, uevent_rx) = tokio::sync::mpsc::channel(1);
        let config = RescanConfig {
            interval: std::time::Duration::from_secs(3600),
            settle: std::time::Duration::from_millis(20),
        };
        tokio::spawn(rescanner.run(uevent_rx, config));
        let wait_for = |rx: &mut tokio::sync::watch::Receiver<dra_core::testing::PoolContent>,
                        n: usize| {
            let mut rx = rx.clone();
            async move {
                tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    rx.wait_for(|d: &dra_core::testing::PoolContent| d.devices.len() == n),
                )
                .await
                .map(|r| r.is_ok())
                .unwrap_or(false)
            }
        };
        assert!(wait_for(&mut rx, 16).await, "initial scan");

        fx.unbind_driver(&fx.neuron_chips[3].bdf).unwrap();
        uevent_tx.send(Trigger::Uevent).await.unwrap();
        assert!(wait_for(&mut rx, 15).await, "unbind seen after the uevent");
        assert!(!rx.borrow().iter().any(|d| d.name == "neurondevice3"));

        fx.bind_driver(&fx.neuron_chips[3].bdf).unwrap();
        uevent_tx.send(Trigger::Uevent).await.unwrap();
        assert!(wait_for(&mut rx, 16).await, "bind seen after the uevent");
    });
}

fn entry(source: &str, lnc: Option<u32>) -> DeviceAllocationConfiguration {
    let mut params = serde_json::json!({"apiVersion": "neuron.aws.com/v1", "kind": "NeuronConfig"});
    if let Some(v) = lnc {
        params["logicalNeuronCore"] = v.into();
    }
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: None,
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER_NAME.into(),
            parameters: RawExtension(params),
        }),
    }
}

fn allocated(
    chips: &[u32],
    request: &str,
    config: Option<NeuronConfig>,
) -> Vec<AllocatedDevice<NeuronConfig>> {
    chips
        .iter()
        .map(|c| AllocatedDevice {
            request: request.into(),
            pool: "n1".into(),
            device: format!("neurondevice{c}"),
            admin_access: false,
            config: config.clone(),
        })
        .collect()
}

#[test]
fn lnc_matrix_class_and_claim() {
    let choices = [None, Some(1), Some(2)];
    for instance in ["trn1.32xlarge", "trn2.48xlarge"] {
        let (_dir, fx) = fixture(instance);
        let inv = scan(&fx, &fixture_bdf(&fx));
        let cores = fx.neuron_chips[0].core_count;
        let default = if cores == 8 { 2 } else { 1 };
        for class in choices {
            for claim in choices {
                let ctx = format!("{instance} class={class:?} claim={claim:?}");
                // Claim entries listed first: dra-core must still put the
                // class entry before them.
                let mut entries = Vec::new();
                if let Some(v) = claim {
                    entries.push(entry("FromClaim", Some(v)));
                }
                if let Some(v) = class {
                    entries.push(entry("FromClass", Some(v)));
                }
                let resolved =
                    decode_allocation_configs::<NeuronConfig>(DRIVER_NAME, &entries).unwrap();
                let config = config_for_request(&resolved, "neurons");
                let result = claim_edits(&inv, &allocated(&[2, 3], "neurons", config));
                let want = claim.or(class).unwrap_or(default);
                if want == 2 && cores != 8 {
                    let e = result.unwrap_err().to_string();
                    assert_eq!(
                        e,
                        "NeuronConfig logicalNeuronCore: 2 is not supported on chip 2 (Trainium, 2 physical cores); allowed on this chip: 1",
                        "{ctx}"
                    );
                    continue;
                }
                let edits = result.unwrap();
                let per = cores / want;
                let visible = format!("{}-{}", 2 * per, 4 * per - 1);
                assert_eq!(edits.len(), 2, "{ctx}");
                for (e, chip) in edits.iter().zip([2u32, 3]) {
                    assert_eq!(e.device, format!("neurondevice{chip}"), "{ctx}");
                    let env: BTreeMap<&str, &str> = e
                        .edits
                        .env
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    assert_eq!(
                        env,
                        BTreeMap::from([
                            (ENV_VISIBLE_CORES, visible.as_str()),
                            (ENV_LNC, want.to_string().as_str())
                        ]),
                        "{ctx}"
                    );
                    assert_eq!(e.edits.device_nodes.len(), 1);
                    let node = &e.edits.device_nodes[0];
                    assert_eq!(node.path, format!("/dev/neuron{chip}"));
                    assert_eq!(
                        node.host_path.as_deref(),
                        Some(fx.dev.join(format!("neuron{chip}")).to_str().unwrap())
                    );
                }
            }
        }
    }
}

#[test]
fn visible_cores_of_scattered_chips_and_mixed_lnc() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    let inv = scan(&fx, &fixture_bdf(&fx));
    let edits = claim_edits(&inv, &allocated(&[2, 0], "n", None)).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "0-3,8-11");
    let one = Some(NeuronConfig {
        logical_neuron_core: Some(1),
        ultraserver_mode: None,
    });
    let edits = claim_edits(&inv, &allocated(&[15], "n", one.clone())).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "120-127");
    assert_eq!(edits[0].edits.env[ENV_LNC], "1");

    let mut mixed = allocated(&[0], "a", one);
    mixed.extend(allocated(&[1], "b", None));
    let e = claim_edits(&inv, &mixed).unwrap_err().to_string();
    assert!(
        e.contains("neurondevice0 (request a): 1") && e.contains("neurondevice1 (request b): 2"),
        "{e}"
    );
    let e = claim_edits(&inv, &allocated(&[16], "n", None))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "chip 16 (neurondevice16) is not on this node: no such chip in the current inventory (it was removed after the claim was allocated, or the claim names a chip this node never published)"
    );
    let e = claim_edits(&inv, &allocated(&[], "n", None))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "no devices allocated");
}

#[tokio::test]
async fn driver_prepare_and_unprepare() {
    let (_dir, fx) = fixture("inf2.48xlarge");
    let inv = scan(&fx, &fixture_bdf(&fx));
    let driver = NeuronDriver::new(Arc::new(RwLock::new(inv)));
    let claim = ClaimRef {
        namespace: "ml".into(),
        name: "c".into(),
        uid: "u1".into(),
    };
    let edits = driver
        .prepare(&claim, &allocated(&[11], "n", None))
        .await
        .unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "22-23");
    assert_eq!(edits[0].edits.env[ENV_LNC], "1");
    let two = Some(NeuronConfig {
        logical_neuron_core: Some(2),
        ultraserver_mode: None,
    });
    let e = driver
        .prepare(&claim, &allocated(&[0], "n", two))
        .await
        .unwrap_err();
    assert!(e.message.contains("Inferentia2"), "{}", e.message);
    driver.unprepare(&claim, &[]).await.unwrap();
}

fn discover_bin(fx: &Fixture, extra: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_neuron-driver"))
        .arg("discover")
        .arg("--sysfs-root")
        .arg(&fx.sys)
        .arg("--dev-root")
        .arg(&fx.dev)
        .args(["--node-name", "node-a"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn discover_binary_on_trn2_prints_four_groups_of_four() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    let out: serde_json::Value = serde_json::from_str(&discover_bin(&fx, &[])).unwrap();
    assert_eq!(out["kind"], "List");
    let items = out["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["spec"]["driver"], DRIVER_NAME);
    assert_eq!(items[0]["spec"]["nodeName"], "node-a");
    let devs = items[0]["spec"]["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 16);
    let mut groups: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for d in devs {
        let a = &d["attributes"];
        let id = a["deviceId"]["int"].as_i64().unwrap();
        let g = a["resource.aws.com/devicegroup4_id"]["string"]
            .as_str()
            .unwrap();
        groups.entry(g.to_owned()).or_default().insert(id);
    }
    let members: Vec<BTreeSet<i64>> = groups.values().cloned().collect();
    let mut want: Vec<BTreeSet<i64>> = (0..4).map(|g| (g * 4..g * 4 + 4).collect()).collect();
    want.sort();
    let mut got = members;
    got.sort();
    assert_eq!(got, want);
    // The EFA side of the same fixture has exactly these four values.
    let it: InstanceType = "trn2.48xlarge".parse().unwrap();
    let efa_side: BTreeSet<String> = fx
        .efas
        .iter()
        .map(|e| {
            topology::device_groups_for_efa(&it, e.bdf.parse().unwrap())
                .unwrap()
                .group4
                .to_string()
        })
        .collect();
    assert_eq!(efa_side, groups.keys().cloned().collect::<BTreeSet<_>>());

    let yaml = discover_bin(&fx, &["-o", "yaml"]);
    assert!(yaml.starts_with("apiVersion: v1"), "{yaml}");
}

#[test]
fn discover_binary_on_a_node_without_chips() {
    let (_dir, fx) = fixture("m5.8xlarge");
    let out: serde_json::Value = serde_json::from_str(&discover_bin(&fx, &[])).unwrap();
    let items = out["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert!(items[0]["spec"].get("devices").is_none());
}

/// `(device, key, effect)` of every taint `discover` printed.
fn discover_taints(fx: &Fixture) -> Vec<(String, String, String)> {
    let out: serde_json::Value = serde_json::from_str(&discover_bin(fx, &[])).unwrap();
    let mut got = Vec::new();
    for item in out["items"].as_array().unwrap() {
        for d in item["spec"]["devices"].as_array().into_iter().flatten() {
            for t in d["taints"].as_array().into_iter().flatten() {
                got.push((
                    d["name"].as_str().unwrap().to_owned(),
                    t["key"].as_str().unwrap().to_owned(),
                    t["effect"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    got
}

#[test]
fn discover_taints_only_the_chip_with_uncorrected_sram_ecc() {
    let (_dir, fx) = fixture("trn2.48xlarge");
    assert_eq!(discover_taints(&fx), vec![], "healthy fixture: no taints");
    sysfs_fixtures::health::inject(
        &fx.sys,
        &sysfs_fixtures::health::Fault::NeuronSramUncorrected { chip: 6 },
    )
    .unwrap();
    let got = discover_taints(&fx);
    assert_eq!(got.len(), 1, "{got:?}");
    let (device, key, effect) = &got[0];
    assert_eq!(device, "neurondevice6");
    assert!(key.starts_with("neuron.aws.com/"), "{key}");
    assert_eq!(key, "neuron.aws.com/sram-ecc-uncorrected");
    assert_eq!(effect, "NoSchedule");
}

#[test]
fn discover_repairable_hbm_gets_its_own_no_schedule_key() {
    let (_dir, fx) = fixture("inf2.48xlarge");
    sysfs_fixtures::health::inject(
        &fx.sys,
        &sysfs_fixtures::health::Fault::NeuronHbmRepairable { chip: 0 },
    )
    .unwrap();
    assert_eq!(
        discover_taints(&fx),
        vec![(
            "neurondevice0".to_owned(),
            "neuron.aws.com/hbm-ecc-repairable".to_owned(),
            "NoSchedule".to_owned()
        )]
    );
}
