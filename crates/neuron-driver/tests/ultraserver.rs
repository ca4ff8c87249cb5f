//! Trn2 UltraServer nodes on generated trn2u trees: the whole-node device
//! and its counters, the ids of the 4 nodes of one UltraServer, the
//! election (`busy`) and non-UltraServer forms, `UltraServerConfig` at
//! prepare, the Node labels, and what `discover` prints.

use std::collections::{BTreeMap, BTreeSet};

use dra_core::{AllocatedDevice, DeviceInventory, Driver, HostPaths, NodeDriver};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{BdfCache, NodeInventory, discover};
use neuron_driver::partitions::{Layout, PartitionMode, counter_sets, devices};
use neuron_driver::prepare::{ENV_LNC, ENV_VISIBLE_CORES, claim_edits};
use neuron_driver::ultraserver::{
    ENV_GLOBAL_TOPOID, ENV_MODE, ENV_NODE_ID, ENV_SERVER_ID, LABEL_MODE, LABEL_NODE_ID_2,
    LABEL_NODE_ID_4, LABEL_SERVER_ID_2, LABEL_SERVER_ID_4, UltraServer,
};
use neuron_driver::{NeuronConfig, NeuronDriver, NeuronInventory};
use sysfs_fixtures::{Fixture, UltraServerSpec, generate_spec, trn2u, ultraserver_ids};
use topology::SysfsRoot;

fn member(node: u32, modes: &'static str) -> UltraServerSpec {
    UltraServerSpec::Member {
        server: 0,
        node,
        modes,
    }
}

fn fixture(state: UltraServerSpec) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let fx = generate_spec(trn2u(state), dir.path(), None).unwrap();
    (dir, fx)
}

fn scan(fx: &Fixture) -> NodeInventory {
    let bdf = StaticBdf {
        answers: Vec::new(),
    };
    discover(
        &SysfsRoot::new(&fx.sys),
        &fx.dev,
        &bdf,
        &mut BdfCache::default(),
    )
    .unwrap()
}

fn attr_s(d: &Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}
fn attr_i(d: &Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

fn node_device(devs: &[Device]) -> Option<&Device> {
    devs.iter().find(|d| d.name == "neuronnode")
}

#[test]
fn the_four_nodes_of_one_ultraserver_publish_consistent_ids() {
    let mut seen_4 = BTreeSet::new();
    let mut pairs: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for node in 0..4 {
        let (_d, fx) = fixture(member(node, "1,2,3,4"));
        let inv = scan(&fx);
        let devs = devices(&inv, PartitionMode::Chips);
        assert_eq!(devs.len(), 17, "16 chips and the whole node");
        let n = node_device(&devs).expect("whole-node device");
        assert_eq!(attr_s(n, "resourceType").as_deref(), Some("neuron_node"));
        assert_eq!(attr_s(n, "instanceType").as_deref(), Some("trn2u.48xlarge"));
        assert_eq!(attr_i(n, "deviceCount"), Some(16));
        assert_eq!(attr_i(n, "coreCount"), Some(128));
        assert_eq!(attr_s(n, "ultraserverMode").as_deref(), Some("1_2_4"));
        let (id2, id4) = ultraserver_ids(0, node);
        assert_eq!(attr_s(n, "ultraserverServerId4"), Some(id4.clone()));
        assert_eq!(attr_s(n, "ultraserverServerId2"), Some(id2.clone()));
        assert_eq!(attr_i(n, "ultraserverNodeId4"), Some(i64::from(node)));
        assert_eq!(attr_i(n, "ultraserverNodeId2"), Some(i64::from(node % 2)));
        seen_4.insert(id4);
        pairs
            .entry(id2)
            .or_default()
            .insert(attr_i(n, "ultraserverNodeId2").unwrap());
        // Chips keep AWS's grid attributes.
        let chip5 = devs.iter().find(|d| d.name == "neurondevice5").unwrap();
        assert_eq!(attr_i(chip5, "topology4_id"), Some(1));
        assert_eq!(attr_i(chip5, "topology8_id"), Some(0));
        assert_eq!(
            attr_s(chip5, "resourceType").as_deref(),
            Some("neuron_device")
        );
    }
    assert_eq!(seen_4.len(), 1, "one 4-node set");
    assert_eq!(pairs.len(), 2, "two 2-node sets");
    assert!(
        pairs.values().all(|ids| *ids == BTreeSet::from([0, 1])),
        "{pairs:?}"
    );
}

/// The whole node and any chip or core of it never fit together: every
/// counter of the node set is taken whole by the node device, and each
/// chip and core takes from it.
#[test]
fn the_whole_node_device_shares_counters_with_every_chip_and_core() {
    let (_d, fx) = fixture(member(2, "1,2,3,4"));
    let inv = scan(&fx);
    for mode in [PartitionMode::Chips, PartitionMode::Cores] {
        let devs = devices(&inv, mode);
        let sets = counter_sets(&inv, mode);
        let node_set = sets
            .iter()
            .find(|s| s.name == "neuronnode")
            .expect("node set");
        assert_eq!(node_set.counters.len(), 16);
        assert!(node_set.counters.values().all(|c| c.value.0 == "8"));
        let node = node_device(&devs).unwrap();
        let consumed = node.consumes_counters.as_ref().unwrap();
        assert_eq!(consumed.len(), 1);
        assert_eq!(consumed[0].counters, node_set.counters, "{mode}");
        for d in devs.iter().filter(|d| d.name != "neuronnode") {
            let consumes = d.consumes_counters.as_ref().expect(&d.name);
            assert!(consumes.len() <= 2, "{}: at most two counter sets", d.name);
            let from_node = consumes
                .iter()
                .find(|c| c.counter_set == "neuronnode")
                .unwrap_or_else(|| panic!("{} takes nothing from the node set", d.name));
            assert_eq!(from_node.counters.len(), 1, "{}", d.name);
            let want = if d.name.contains("-core-") { "1" } else { "8" };
            assert!(
                from_node.counters.values().all(|c| c.value.0 == want),
                "{}",
                d.name
            );
        }
        let total: usize = devs
            .iter()
            .flat_map(|d| d.consumes_counters.iter().flatten())
            .map(|c| c.counters.len())
            .sum();
        assert!(total <= 1024, "{mode}: {total} counters consumed in all");
    }
    // Where the API server drops counters, no whole-node device.
    let devs = devices(
        &inv,
        Layout {
            mode: PartitionMode::Chips,
            whole_node: false,
        },
    );
    assert!(node_device(&devs).is_none());
    assert!(devs.iter().all(|d| d.consumes_counters.is_none()));
}

#[test]
fn election_and_non_ultraserver_forms_publish_no_whole_node_device() {
    for (state, busy) in [
        (UltraServerSpec::Busy, true),
        (UltraServerSpec::NotMember, false),
        (UltraServerSpec::Absent, false),
    ] {
        let (_d, fx) = fixture(state);
        let inv = scan(&fx);
        assert_eq!(
            matches!(inv.ultraserver, UltraServer::Electing { .. }),
            busy,
            "{state:?}: {:?}",
            inv.ultraserver
        );
        let devs = devices(&inv, PartitionMode::Cores);
        assert!(node_device(&devs).is_none(), "{state:?}");
        assert_eq!(devs.len(), 16 + 128, "{state:?}");
        assert!(
            counter_sets(&inv, PartitionMode::Cores)
                .iter()
                .all(|s| s.name != "neuronnode")
        );
    }
}

fn allocated(device: &str, config: Option<NeuronConfig>) -> AllocatedDevice<NeuronConfig> {
    AllocatedDevice {
        request: "node".into(),
        pool: "n1".into(),
        device: device.into(),
        admin_access: false,
        config,
    }
}

fn us(mode: u32) -> Option<NeuronConfig> {
    Some(NeuronConfig {
        logical_neuron_core: None,
        ultraserver_mode: Some(mode),
    })
}

#[test]
fn prepare_gives_the_runtime_its_ultraserver_variables() {
    let (_d, fx) = fixture(member(3, "1,2,3,4"));
    let inv = scan(&fx);
    let (id2, id4) = ultraserver_ids(0, 3);
    for (mode, rt_mode, server, node) in [
        (4, "1", id4.clone(), "3"),
        (2, "3", id2.clone(), "1"),
        (1, "4", id4.clone(), "0"),
    ] {
        let edits = claim_edits(&inv, &[allocated("neuronnode", us(mode))]).unwrap();
        assert_eq!(edits.len(), 1, "one entry for the one allocated device");
        let e = &edits[0];
        assert_eq!(e.device, "neuronnode");
        let nodes: BTreeSet<&str> = e
            .edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes.len(), 16, "every chip");
        assert!(nodes.contains("/dev/neuron15"));
        let env = &e.edits.env;
        assert_eq!(env[ENV_MODE], rt_mode, "mode {mode}");
        assert_eq!(env[ENV_SERVER_ID], server, "mode {mode}");
        assert_eq!(env[ENV_NODE_ID], node, "mode {mode}");
        assert_eq!(env[ENV_GLOBAL_TOPOID], node, "mode {mode}");
        assert_eq!(env[ENV_LNC], "2", "trn2's default LNC");
        assert_eq!(env[ENV_VISIBLE_CORES], "0-63");
    }
    // LNC and UltraServer mode merged on one request.
    let both = NeuronConfig {
        logical_neuron_core: Some(1),
        ultraserver_mode: Some(4),
    };
    let edits = claim_edits(&inv, &[allocated("neuronnode", Some(both))]).unwrap();
    assert_eq!(edits[0].edits.env[ENV_LNC], "1");
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "0-127");
    assert_eq!(edits[0].edits.env[ENV_MODE], "1");
    // Without an UltraServerConfig: no UltraServer variables.
    let edits = claim_edits(&inv, &[allocated("neuronnode", None)]).unwrap();
    assert!(!edits[0].edits.env.contains_key(ENV_MODE));
}

#[test]
fn unsupported_modes_and_non_ultraserver_nodes_are_refused_clearly() {
    let (_d, fx) = fixture(member(0, "1,4"));
    let inv = scan(&fx);
    let err = claim_edits(&inv, &[allocated("neuronnode", us(2))])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ultraserverMode 2: a set of 2 nodes is not supported on this node")
            && err.contains("supported here: 1, 4"),
        "{err}"
    );
    let (_d, fx) = fixture(UltraServerSpec::Busy);
    let inv = scan(&fx);
    let err = claim_edits(&inv, &[allocated("neuronnode", us(4))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("neuronnode") && err.contains("trn2u"), "{err}");
    let err = claim_edits(&inv, &[allocated("neurondevice0", us(4))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ids are not known yet"), "{err}");
}

fn host(fx: &Fixture) -> HostPaths {
    HostPaths {
        sysfs_root: fx.sys.clone(),
        dev_root: fx.dev.clone(),
    }
}

#[test]
fn node_labels_follow_the_election() {
    let (_d, fx) = fixture(member(1, "1,2,3,4"));
    let mut inventory = NeuronInventory::new(
        &host(&fx),
        Box::new(StaticBdf {
            answers: Vec::new(),
        }),
    );
    inventory.set_node_labels(
        &[
            ("topology.k8s.aws/network-node-layer-1", "nn-a"),
            ("topology.k8s.aws/network-node-layer-2", "nn-b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    let scanned = inventory.scan().unwrap();
    let node = scanned
        .iter()
        .find(|s| s.device.name == "neuronnode")
        .unwrap();
    assert_eq!(
        attr_s(&node.device, "networkNodeLayer2").as_deref(),
        Some("nn-b")
    );
    let chip = scanned
        .iter()
        .find(|s| s.device.name == "neurondevice0")
        .unwrap();
    assert_eq!(
        attr_s(&chip.device, "networkNodeLayer1").as_deref(),
        Some("nn-a")
    );
    let labels = inventory.node_labels();
    let (id2, id4) = ultraserver_ids(0, 1);
    assert_eq!(labels[LABEL_MODE], "1_2_4");
    assert_eq!(labels[LABEL_SERVER_ID_2], id2);
    assert_eq!(labels[LABEL_SERVER_ID_4], id4);
    assert_eq!(labels[LABEL_NODE_ID_2], "1");
    assert_eq!(labels[LABEL_NODE_ID_4], "1");
    assert_eq!(
        NeuronInventory::NODE_LABELS.len(),
        5,
        "every label is managed"
    );

    // The election starts again (a NeuronLink re-election): no labels, no
    // whole-node device, until it settles.
    for (name, value) in [("ultraserver_mode", "busy"), ("node_id_4", "busy")] {
        std::fs::write(
            fx.sys.join("class/neuron_device").join(name),
            format!("{value}\n"),
        )
        .unwrap();
    }
    let scanned = inventory.scan().unwrap();
    assert!(scanned.iter().all(|s| s.device.name != "neuronnode"));
    assert!(inventory.node_labels().is_empty());
}

/// A claim prepared under a name of before the rename keeps its chip (and
/// the chip's cores, and the whole node) from other claims.
#[test]
fn legacy_names_occupy_the_same_hardware() {
    let (_d, fx) = fixture(member(0, "1,2,3,4"));
    let mut inventory = NeuronInventory::new(
        &host(&fx),
        Box::new(StaticBdf {
            answers: Vec::new(),
        }),
    );
    inventory.scan().unwrap();
    let driver: NeuronDriver = inventory.driver();
    let pieces = |d: &str| driver.occupies(d).into_iter().collect::<BTreeSet<_>>();
    let old = pieces("neuron-device-3");
    assert_eq!(old, pieces("neurondevice3"));
    assert_eq!(old.len(), 9, "the chip and its 8 cores");
    assert!(!old.is_disjoint(&pieces("neurondevice3-core-5")));
    assert!(!old.is_disjoint(&pieces("neuron-device-3-core-0")));
    assert!(old.is_disjoint(&pieces("neurondevice4")));
    assert!(pieces("neurondevice3-core-1").is_disjoint(&pieces("neurondevice3-core-2")));
    assert!(!pieces("neuronnode").is_disjoint(&old));
    assert_eq!(pieces("neuronnode").len(), 16 * 9);
}

fn discover_bin(fx: &Fixture) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_neuron-driver"))
        .args([
            "discover",
            "--node-name",
            "n1",
            "-o",
            "json",
            "--sysfs-root",
        ])
        .arg(&fx.sys)
        .arg("--dev-root")
        .arg(&fx.dev)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn discover_prints_the_whole_node_device_or_says_why_not() {
    let (_d, fx) = fixture(member(2, "1,2,3,4"));
    let (stdout, _) = discover_bin(&fx);
    let list: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let slices: Vec<ResourceSlice> = serde_json::from_value(list["items"].clone()).unwrap();
    let devices: Vec<&Device> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    let node = devices
        .iter()
        .find(|d| d.name == "neuronnode")
        .expect("whole-node device");
    assert_eq!(attr_i(node, "ultraserverNodeId4"), Some(2));
    assert!(
        slices
            .iter()
            .flat_map(|s| s.spec.shared_counters.iter().flatten())
            .any(|c| c.name == "neuronnode"),
        "the node's counter set is printed"
    );

    let (_d, fx) = fixture(UltraServerSpec::Busy);
    let (stdout, stderr) = discover_bin(&fx);
    assert!(!stdout.contains("neuronnode"));
    assert!(stdout.contains("neurondevice15"));
    assert!(
        stderr.contains("UltraServer ids not known yet") && stderr.contains("busy"),
        "{stderr}"
    );
}
