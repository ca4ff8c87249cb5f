//! The two drivers' templates of one instance type (`discover
//! --instance-type`, docs/autoscaling.md) agree with each other: an EFA and
//! a Neuron chip carry the same stand-in for `pcieRoot` or a device-group id
//! exactly where, on that type's fixture, the two drivers' scans give them
//! the same value. The `group` keys of `attributeBindings` are a hash of
//! attribute and stand-in, so merging the two drivers' bindings pairs EFAs
//! with chips as a node does. Each driver's own tests hold its template
//! against its `discover`; this is the part neither crate can check alone.

use std::collections::BTreeSet;

use dra_core::attributes::PCIE_ROOT;
use dra_core::{DeviceInventory, HostPaths};
use k8s_openapi::api::resource::v1::Device;
use neuron_driver::bdf::StaticBdf;

/// The attributes EFAs and chips share on a node.
const SHARED: [&str; 5] = [
    PCIE_ROOT,
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
];

/// `(attribute, EFA's place in name order, chip device)` for every EFA and
/// chip with the same value of a [`SHARED`] attribute.
fn pairs(mut efas: Vec<Device>, chips: &[Device]) -> BTreeSet<(&'static str, usize, String)> {
    efas.sort_by(|a, b| a.name.cmp(&b.name));
    let value = |d: &Device, a: &str| d.attributes.as_ref().and_then(|m| m.get(a)).cloned();
    let mut out = BTreeSet::new();
    for attribute in SHARED {
        for (k, efa) in efas.iter().enumerate() {
            for chip in chips {
                if value(efa, attribute).is_some()
                    && value(efa, attribute) == value(chip, attribute)
                {
                    out.insert((attribute, k, chip.name.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn efa_and_neuron_templates_pair_as_the_fixtures_do() {
    let mut checked = 0;
    for model in topology::catalog::INSTANCE_MODELS {
        if model.efas().is_empty() || model.chips().is_empty() {
            continue;
        }
        let it = model.instance_type;
        let dir = tempfile::tempdir().unwrap();
        let fx = sysfs_fixtures::generate(it, dir.path()).unwrap();
        let host = HostPaths {
            sysfs_root: fx.sys.clone(),
            dev_root: fx.dev.clone(),
        };
        let real_efas = efa_driver::EfaInventory::new(&host, None).scan().unwrap();
        let bdf = StaticBdf {
            answers: fx
                .neuron_chips
                .iter()
                .map(|c| {
                    let node = fx.dev.join(format!("neuron{}", c.index));
                    (node, Ok(c.bdf.parse().unwrap()))
                })
                .collect(),
        };
        let real_chips = neuron_driver::NeuronInventory::new(&host, Box::new(bdf))
            .scan()
            .unwrap();
        let real = pairs(
            real_efas
                .into_iter()
                .map(|s| std::sync::Arc::unwrap_or_clone(s.device))
                .collect(),
            &real_chips
                .into_iter()
                .map(|s| std::sync::Arc::unwrap_or_clone(s.device))
                .collect::<Vec<_>>(),
        );
        let efas = efa_driver::template::devices(it, &Default::default()).unwrap();
        let (chips, _) = neuron_driver::template::devices(it, &Default::default()).unwrap();
        assert!(!real.is_empty(), "{it}: no EFA shares a value with a chip");
        assert_eq!(pairs(efas, &chips), real, "{it}");
        checked += 1;
    }
    assert_eq!(checked, 4, "trn1, trn1n, trn2, trn2u");
}
