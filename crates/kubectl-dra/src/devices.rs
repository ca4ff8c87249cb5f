//! `kubectl dra devices`: one row per published device with the attributes
//! people pair devices on (PCIe root, device group, NUMA node), who holds
//! it, and its taints.

use serde::Serialize;

use crate::world::{AttributeValue, World};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRow {
    pub node: String,
    pub driver: String,
    pub pool: String,
    pub slice: String,
    pub device: String,
    pub pcie_root: Option<String>,
    /// `resource.aws.com/devicegroup4_id`, the group most claims pair on.
    pub device_group: Option<String>,
    pub numa_node: Option<String>,
    pub claims: Vec<String>,
    pub taints: Vec<String>,
    /// Every attribute, `name=value`, for `-o wide`/json/yaml.
    pub attributes: Vec<String>,
    pub capacity: Vec<String>,
    pub pool_problem: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub node: Option<String>,
    pub driver: Option<String>,
}

pub fn rows(world: &World, filter: &Filter) -> Vec<DeviceRow> {
    let all: Vec<usize>;
    let indices: &[usize] = match filter.node.as_deref() {
        Some(n) => world.on_node(n),
        None => {
            all = (0..world.devices.len()).collect();
            &all
        }
    };
    let mut out: Vec<DeviceRow> = indices
        .iter()
        .map(|&i| &world.devices[i])
        .filter(|d| filter.driver.as_deref().is_none_or(|dr| d.id.driver == dr))
        .map(|d| DeviceRow {
            node: d.node.unwrap_or("(any)").to_string(),
            driver: d.id.driver.clone(),
            pool: d.id.pool.clone(),
            slice: d.slice.to_string(),
            device: d.id.device.clone(),
            pcie_root: d
                .attribute("resource.kubernetes.io/pcieRoot")
                .map(|v| v.plain()),
            device_group: d
                .attribute("resource.aws.com/devicegroup4_id")
                .map(|v| v.plain()),
            numa_node: d
                .attribute("resource.kubernetes.io/numaNode")
                .map(|v| v.plain()),
            claims: world.holders_of(&d.id),
            taints: d
                .device
                .taints
                .iter()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t.key,
                        t.value.as_deref().unwrap_or(""),
                        t.effect
                    )
                })
                .collect(),
            attributes: d
                .device
                .attributes
                .iter()
                // `d.attribute(k)` of a name as stored is its own value.
                .filter_map(|(k, v)| {
                    v.as_ref()
                        .map(|v| format!("{k}={}", AttributeValue::from_slice(v).plain()))
                })
                .collect(),
            capacity: d
                .device
                .capacity
                .iter()
                .map(|(k, c)| format!("{k}={c}"))
                .collect(),
            pool_problem: d.pool_problem.clone(),
        })
        .collect();
    out.sort_by(|a, b| (&a.node, &a.driver, &a.device).cmp(&(&b.node, &b.driver, &b.device)));
    out
}

fn or_dash(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

fn list_or_dash(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        v.join(",")
    }
}

/// A kubectl-style table, columns padded to their widest cell.
pub fn table(rows: &[DeviceRow], wide: bool) -> String {
    let mut header = vec![
        "NODE",
        "DRIVER",
        "DEVICE",
        "PCIEROOT",
        "DEVICEGROUP4",
        "NUMA",
        "CLAIM",
        "TAINTS",
    ];
    if wide {
        header.extend(["POOL", "SLICE", "ATTRIBUTES", "CAPACITY"]);
    }
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let mut row = vec![
            r.node.clone(),
            r.driver.clone(),
            r.device.clone(),
            or_dash(&r.pcie_root).to_string(),
            or_dash(&r.device_group).to_string(),
            or_dash(&r.numa_node).to_string(),
            list_or_dash(&r.claims),
            list_or_dash(&r.taints),
        ];
        if wide {
            row.extend([
                r.pool.clone(),
                r.slice.clone(),
                list_or_dash(&r.attributes),
                list_or_dash(&r.capacity),
            ]);
        }
        cells.push(row);
    }
    let widths: Vec<usize> = (0..cells[0].len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}
