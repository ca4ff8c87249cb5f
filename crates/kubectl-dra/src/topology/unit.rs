//! One published device as the picture sees it: what kind it is, the
//! detail a person recognises it by, its taints and holders. Read from the
//! attributes the drivers publish, never from device names.

use std::collections::BTreeMap;

use super::model::{TaintMark, Unit, UnitKind};
use crate::world::{AttributeValue, PublishedDevice, World};

pub(super) const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
pub(super) const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
const NEURON_DRIVER: &str = "neuron.aws.com";
/// The device-group sizes shown as labels (`4A`, `8B`, `16A`); group 1 is
/// the chip itself and tells nothing a picture needs.
pub(super) const GROUP_SIZES: [u8; 3] = [4, 8, 16];

pub(super) fn int_attr(d: &PublishedDevice, name: &str) -> Option<i64> {
    match d.attribute(name)? {
        AttributeValue::Int(i) => Some(i),
        AttributeValue::String(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn str_attr(d: &PublishedDevice, name: &str) -> Option<String> {
    d.attribute(name).map(|v| v.plain())
}

pub(super) fn kind_of(d: &PublishedDevice) -> UnitKind {
    let driver = d.id.driver.as_str();
    if driver == NEURON_DRIVER || driver.ends_with(".neuron.aws.com") {
        return match str_attr(d, &format!("{driver}/resourceType")).as_deref() {
            Some("neuron_core") => UnitKind::NeuronCore,
            Some("neuron_node") => UnitKind::NeuronNode,
            _ => UnitKind::NeuronChip,
        };
    }
    if driver.starts_with("efa.") || str_attr(d, &format!("{driver}/rdmaDevice")).is_some() {
        return UnitKind::Efa;
    }
    if driver == "gpu.nvidia.com"
        && str_attr(d, &format!("{driver}/type")).is_none_or(|t| t == "gpu")
    {
        return UnitKind::Gpu;
    }
    UnitKind::Other
}

pub(super) fn detail_of(d: &PublishedDevice, kind: UnitKind) -> String {
    let driver = d.id.driver.as_str();
    let attr = |n: &str| str_attr(d, &format!("{driver}/{n}"));
    match kind {
        UnitKind::Gpu => attr("productName").unwrap_or_default(),
        UnitKind::Efa => attr("rdmaDevice").unwrap_or_default(),
        UnitKind::NeuronChip => attr("deviceId")
            .map(|i| format!("/dev/neuron{i}"))
            .unwrap_or_default(),
        UnitKind::NeuronCore => attr("coreId")
            .map(|i| format!("core {i}"))
            .unwrap_or_default(),
        UnitKind::NeuronNode | UnitKind::Other => driver.to_string(),
    }
}

pub(super) fn taints_of(d: &PublishedDevice) -> Vec<TaintMark> {
    let mark = |t: &k8s_openapi::api::resource::v1::DeviceTaint, rule: Option<&String>| {
        let (domain, short) = t.key.split_once('/').unwrap_or(("", t.key.as_str()));
        TaintMark {
            taint: format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            ),
            short: short.to_string(),
            unhealthy: rule.is_none() && domain == d.id.driver,
            rule: rule.cloned(),
        }
    };
    d.device
        .taints
        .iter()
        .map(|t| mark(t, None))
        .chain(d.rule_taints.iter().map(|(r, t)| mark(t, Some(r))))
        .collect()
}

pub(super) fn unit(
    world: &World,
    d: &PublishedDevice,
    labels: &BTreeMap<(u8, String), String>,
) -> Unit {
    let kind = kind_of(d);
    let groups = GROUP_SIZES
        .iter()
        .filter_map(|&size| {
            let value = str_attr(d, &group_attribute(size))?;
            labels.get(&(size, value)).cloned()
        })
        .collect();
    Unit {
        id: d.id.clone(),
        kind,
        detail: detail_of(d, kind),
        pci_bus_id: str_attr(d, PCI_BUS_ID),
        groups,
        holders: world.holders_of(&d.id),
        taints: taints_of(d),
        pool_problem: d.pool_problem.clone(),
    }
}

pub(super) fn group_attribute(size: u8) -> String {
    format!("resource.aws.com/devicegroup{size}_id")
}
