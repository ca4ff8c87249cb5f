//! NeuronCores as partitions of their chip, on generated hardware trees:
//! the devices and counter sets `--partitions cores` publishes, what
//! `discover` prints in each mode, and what a container gets for cores.

use std::collections::{BTreeMap, BTreeSet};

use dra_core::AllocatedDevice;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use neuron_driver::NeuronConfig;
use neuron_driver::bdf::StaticBdf;
use neuron_driver::discovery::{BdfCache, NodeInventory, discover};
use neuron_driver::partitions::{PartitionMode, counter_sets, devices};
use neuron_driver::prepare::{ENV_LNC, ENV_VISIBLE_CORES, claim_edits};
use sysfs_fixtures::{Fixture, generate};
use topology::SysfsRoot;

fn fixture(instance: &str) -> (tempfile::TempDir, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let fx = generate(instance, dir.path()).unwrap();
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

fn s(d: &Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}
fn i(d: &Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

#[test]
fn trn2_cores_mode_publishes_chips_cores_and_one_counter_set_per_chip() {
    let (_d, fx) = fixture("trn2.48xlarge");
    let inv = scan(&fx);
    let devs = devices(&inv, PartitionMode::Cores);
    assert_eq!(devs.len(), 16 + 16 * 8);
    let sets = counter_sets(&inv, PartitionMode::Cores);
    assert_eq!(sets.len(), 16);
    for set in &sets {
        let names: BTreeSet<&str> = set.counters.keys().map(String::as_str).collect();
        let want: BTreeSet<String> = (0..8).map(|k| format!("core-{k}")).collect();
        assert_eq!(
            names,
            want.iter().map(String::as_str).collect(),
            "{}",
            set.name
        );
        assert!(set.counters.values().all(|c| c.value.0 == "1"));
    }
    let by_name: BTreeMap<&str, &Device> = devs.iter().map(|d| (d.name.as_str(), d)).collect();
    for chip in 0..16u32 {
        let whole = by_name[format!("neurondevice{chip}").as_str()];
        assert_eq!(s(whole, "resourceType").as_deref(), Some("neuron_device"));
        let consumed = whole.consumes_counters.as_ref().unwrap();
        assert_eq!(consumed.len(), 1);
        assert_eq!(consumed[0].counter_set, format!("neurondevice{chip}"));
        assert_eq!(
            consumed[0].counters.len(),
            8,
            "the whole chip takes every core"
        );
        for core in 0..8u32 {
            let d = by_name[format!("neurondevice{chip}-core-{core}").as_str()];
            assert_eq!(s(d, "resourceType").as_deref(), Some("neuron_core"));
            assert_eq!(i(d, "deviceId"), Some(chip as i64));
            assert_eq!(i(d, "coreId"), Some((chip * 8 + core) as i64));
            assert_eq!(i(d, "lnc2CoreId"), Some((chip * 4 + core / 2) as i64));
            assert_eq!(i(d, "coreCount"), None);
            // A core is where its chip is: same device groups.
            for g in ["devicegroup1_id", "devicegroup4_id", "devicegroup16_id"] {
                let key = format!("resource.aws.com/{g}");
                assert_eq!(s(d, &key), s(whole, &key), "{key}");
                assert!(s(d, &key).is_some());
            }
            let c = d.consumes_counters.as_ref().unwrap();
            assert_eq!(c[0].counter_set, format!("neurondevice{chip}"));
            assert_eq!(
                c[0].counters.keys().collect::<Vec<_>>(),
                [&format!("core-{core}")]
            );
            assert_eq!(
                d.capacity.as_ref().unwrap()["cores"].value.0,
                "1",
                "{}",
                d.name
            );
        }
    }
    // Chips mode is what every release gets: no cores, no counters.
    let chips = devices(&inv, PartitionMode::Chips);
    assert_eq!(chips.len(), 16);
    assert!(chips.iter().all(|d| d.consumes_counters.is_none()));
    assert!(counter_sets(&inv, PartitionMode::Chips).is_empty());
}

#[test]
fn inf2_cores_have_no_lnc2_index() {
    let (_d, fx) = fixture("inf2.48xlarge");
    let inv = scan(&fx);
    let devs = devices(&inv, PartitionMode::Cores);
    assert_eq!(devs.len(), 12 + 12 * 2);
    let core = devs
        .iter()
        .find(|d| d.name == "neurondevice11-core-1")
        .unwrap();
    assert_eq!(i(core, "coreId"), Some(23));
    assert_eq!(i(core, "lnc2CoreId"), None, "inf2 runs LNC=1 only");
}

fn discover_slices(fx: &Fixture, extra: &[&str]) -> Vec<ResourceSlice> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_neuron-driver"))
        .arg("discover")
        .arg("--sysfs-root")
        .arg(&fx.sys)
        .arg("--dev-root")
        .arg(&fx.dev)
        .args(["--node-name", "node-a", "-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(list["items"].clone()).unwrap()
}

#[test]
fn discover_takes_the_partitions_flag() {
    let (_d, fx) = fixture("trn2.48xlarge");
    // auto without an API server: whole chips, as on every release.
    for extra in [
        &[][..],
        &["--partitions", "auto"],
        &["--partitions", "chips"],
    ] {
        let slices = discover_slices(&fx, extra);
        assert_eq!(slices.len(), 1, "{extra:?}");
        assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 16);
        assert!(slices[0].spec.shared_counters.is_none());
    }
    let slices = discover_slices(&fx, &["--partitions", "cores"]);
    let shape: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| {
            (
                s.spec.devices.as_ref().map_or(0, Vec::len),
                s.spec.shared_counters.as_ref().map_or(0, Vec::len),
            )
        })
        .collect();
    // 144 devices at 64 per slice (they consume counters), then 16 counter
    // sets at 8 per slice, never devices and counters in one slice.
    assert_eq!(shape, vec![(64, 0), (64, 0), (16, 0), (0, 8), (0, 8)]);
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 5));
}

fn cores(list: &[(u32, u32)], config: Option<NeuronConfig>) -> Vec<AllocatedDevice<NeuronConfig>> {
    list.iter()
        .map(|(chip, core)| AllocatedDevice {
            request: "cores".into(),
            pool: "n1".into(),
            device: format!("neurondevice{chip}-core-{core}"),
            admin_access: false,
            config: config.clone(),
        })
        .collect()
}

fn lnc(v: u32) -> Option<NeuronConfig> {
    Some(NeuronConfig {
        logical_neuron_core: Some(v),
        ultraserver_mode: None,
    })
}

#[test]
fn prepare_gives_cores_their_indices_and_the_chip_device_node() {
    let (_d, fx) = fixture("trn2.48xlarge");
    let inv = scan(&fx);
    // Two cores of chip 3 at the default LNC of a core (1).
    let edits = claim_edits(&inv, &cores(&[(3, 0), (3, 1)], None)).unwrap();
    assert_eq!(edits.len(), 2);
    for e in &edits {
        assert_eq!(e.edits.env[ENV_VISIBLE_CORES], "24-25");
        assert_eq!(e.edits.env[ENV_LNC], "1");
        assert_eq!(e.edits.device_nodes.len(), 1);
        assert_eq!(e.edits.device_nodes[0].path, "/dev/neuron3");
    }
    // Cores of two chips.
    let edits = claim_edits(&inv, &cores(&[(0, 7), (15, 0)], None)).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "7,120");
    let nodes: BTreeSet<String> = edits
        .iter()
        .map(|e| e.edits.device_nodes[0].path.clone())
        .collect();
    assert_eq!(
        nodes,
        BTreeSet::from(["/dev/neuron0".into(), "/dev/neuron15".into()])
    );
    // LNC 2 on a whole pair: one logical core, numbered as at LNC 2.
    let edits = claim_edits(&inv, &cores(&[(1, 2), (1, 3)], lnc(2))).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "5");
    assert_eq!(edits[0].edits.env[ENV_LNC], "2");
    // LNC 2 on cores that do not pair up.
    let e = claim_edits(&inv, &cores(&[(1, 1), (1, 2)], lnc(2)))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "logicalNeuronCore 2 fuses the physical cores of a chip in pairs (0+1, 2+3, ...), but the claim has core 1 of chip 1 without core 0; ask for whole pairs (count 2 with matchAttribute neuron.aws.com/lnc2CoreId) or set logicalNeuronCore: 1"
    );
    // A core the chip does not have.
    let e = claim_edits(&inv, &cores(&[(1, 8)], None))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "device neurondevice1-core-8: chip 1 has 8 physical cores, there is no core 8"
    );
    // A whole chip (default LNC 2 on trn2) and a core (default 1) differ.
    let mut mixed = cores(&[(2, 0)], None);
    mixed.push(AllocatedDevice {
        request: "chip".into(),
        pool: "n1".into(),
        device: "neurondevice4".into(),
        admin_access: false,
        config: None,
    });
    let e = claim_edits(&inv, &mixed).unwrap_err().to_string();
    assert!(e.contains("different logicalNeuronCore values"), "{e}");
    // ...and agree once the claim says which LNC it runs.
    for d in &mut mixed {
        d.config = lnc(1);
    }
    let edits = claim_edits(&inv, &mixed).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "16,32-39");
}

#[test]
fn lnc2_is_refused_on_cores_of_chips_without_it() {
    let (_d, fx) = fixture("trn1.32xlarge");
    let inv = scan(&fx);
    let e = claim_edits(&inv, &cores(&[(0, 0), (0, 1)], lnc(2)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not supported on chip 0"), "{e}");
    let edits = claim_edits(&inv, &cores(&[(5, 1)], None)).unwrap();
    assert_eq!(edits[0].edits.env[ENV_VISIBLE_CORES], "11");
}
