//! `cargo xtask topology`: a human-readable affinity matrix of GPUs, Neuron
//! chips and EFAs, like `nvidia-smi topo -m`, for a generated instance type
//! or any sysfs tree. It shows what the drivers will pair: the EFAs nearest
//! to each accelerator, NUMA nodes, PCIe roots, and (on EFA-enabled Neuron
//! instances) whether AWS's chip → EFA table agrees with the PCIe tree.
//!
//! Neuron chip indices come from the fixture description; on a real host
//! they need the neuron driver's ioctl, so `--sysfs-root` shows chips in PCI
//! address order with `?` indices.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use topology::{
    DeviceKind, EfaTable, InstanceType, LocatedChip, PciAddress, PciDevice, SysfsRoot, check_table,
    classify, nearest, proximity,
};

#[derive(clap::Args)]
pub struct TopologyArgs {
    /// Instance type to generate a fixture for and show (see `cargo xtask fixtures --list`).
    #[arg(required_unless_present = "sysfs_root", conflicts_with = "sysfs_root")]
    instance_type: Option<String>,
    /// Show an existing sysfs tree instead (e.g. /sys, or `<dir>/sys` of `cargo xtask fixtures`).
    #[arg(long)]
    sysfs_root: Option<PathBuf>,
}

struct Accel<'a> {
    label: String,
    dev: &'a PciDevice,
    chip: Option<u32>,
}

pub fn run(args: TopologyArgs) -> Result<()> {
    let mut _tmp = None;
    let (sys, chip_indices) = match (&args.instance_type, &args.sysfs_root) {
        (Some(t), _) => {
            let dir = tempfile::tempdir().context("creating a temporary directory")?;
            let f = sysfs_fixtures::generate(t, dir.path()).with_context(|| {
                format!(
                    "no fixture for {t} (known: {})",
                    sysfs_fixtures::instance_types().join(", ")
                )
            })?;
            let mut map = BTreeMap::new();
            for c in &f.neuron_chips {
                map.insert(c.bdf.parse::<PciAddress>()?, c.index);
            }
            _tmp = Some(dir);
            (f.sys, Some(map))
        }
        (None, Some(root)) => (root.clone(), None),
        (None, None) => bail!("give an instance type or --sysfs-root"),
    };
    print!("{}", render(&SysfsRoot::new(&sys), chip_indices.as_ref())?);
    Ok(())
}

fn render(root: &SysfsRoot, chip_indices: Option<&BTreeMap<PciAddress, u32>>) -> Result<String> {
    let scan =
        topology::scan(root).with_context(|| format!("scanning {}", root.path().display()))?;
    let mut out = String::new();
    let instance = match InstanceType::from_sysfs(root) {
        Ok(Some(t)) => Some(t),
        Ok(None) => None,
        Err(e) => {
            writeln!(out, "warning: {e}")?;
            None
        }
    };
    for e in &scan.errors {
        writeln!(out, "warning: skipped {}: {}", e.entry, e.error)?;
    }

    let mut accels: Vec<Accel> = Vec::new();
    let mut efas: Vec<(&PciDevice, String)> = Vec::new();
    let mut gpu_n = 0;
    for d in &scan.devices {
        match classify(d) {
            DeviceKind::NvidiaGpu => {
                accels.push(Accel {
                    label: format!("GPU{gpu_n}"),
                    dev: d,
                    chip: None,
                });
                gpu_n += 1;
            }
            DeviceKind::Neuron(_) => {
                let chip = chip_indices.and_then(|m| m.get(&d.address).copied());
                let label =
                    chip.map_or_else(|| format!("NC?{}", accels.len()), |i| format!("NC{i}"));
                accels.push(Accel {
                    label,
                    dev: d,
                    chip,
                });
            }
            DeviceKind::Efa => {
                let ib = topology::sysfs::list_dir(d.sysfs_path.join("infiniband"))
                    .ok()
                    .flatten()
                    .and_then(|v| v.into_iter().next())
                    .unwrap_or_else(|| format!("efa@{}", d.address));
                efas.push((d, ib));
            }
            DeviceKind::Other => {}
        }
    }
    accels.sort_by_key(|a| (a.chip.is_some(), a.chip, a.dev.address));

    let n_gpu = gpu_n;
    let n_chip = accels.len() - n_gpu;
    writeln!(
        out,
        "Instance type: {}   sysfs: {}",
        instance.as_ref().map_or("unknown", |t| t.as_str()),
        root.path().display()
    )?;
    writeln!(
        out,
        "{n_gpu} GPUs, {n_chip} Neuron chips, {} EFAs\n",
        efas.len()
    )?;

    let w = accels
        .iter()
        .map(|a| a.label.len())
        .max()
        .unwrap_or(4)
        .max(4)
        + 1;
    if !accels.is_empty() {
        write!(out, "{:w$}", "")?;
        for a in &accels {
            write!(out, "{:>w$}", a.label)?;
        }
        writeln!(out, "  NUMA  pcieRoot    PCI address   nearest EFAs")?;
        for a in &accels {
            write!(out, "{:w$}", a.label)?;
            for b in &accels {
                write!(out, "{:>w$}", proximity(a.dev, b.dev).label())?;
            }
            let (best, set) = nearest(a.dev, efas.iter().map(|(d, _)| *d));
            let names: Vec<&str> = set
                .iter()
                .filter_map(|d| efas.iter().find(|(e, _)| e.address == d.address))
                .map(|(_, n)| n.as_str())
                .collect();
            let nearest = match best {
                Some(p) => format!("{p}: {}", names.join(" ")),
                None => "-".to_owned(),
            };
            writeln!(
                out,
                "  {:>4}  {:10}  {}  {nearest}",
                numa(a.dev),
                a.dev.pcie_root.to_string(),
                a.dev.address
            )?;
        }
        writeln!(out)?;
    }

    let table = instance.as_ref().and_then(EfaTable::for_instance);
    if !efas.is_empty() {
        writeln!(
            out,
            "EFA          PCI address   pcieRoot    NUMA  nearest accelerators"
        )?;
        for (d, ib) in &efas {
            let (best, set) = nearest(d, accels.iter().map(|a| a.dev));
            let labels: Vec<&str> = set
                .iter()
                .filter_map(|s| accels.iter().find(|a| a.dev.address == s.address))
                .map(|a| a.label.as_str())
                .collect();
            let near = best.map_or("-".to_owned(), |p| format!("{p}: {}", labels.join(" ")));
            let chips = table
                .as_ref()
                .map(|t| t.chips_for_efa(d.address))
                .unwrap_or_default();
            let chips = if chips.is_empty() {
                String::new()
            } else {
                let l: Vec<String> = chips.iter().map(|c| format!("NC{c}")).collect();
                format!("  table: {}", l.join(" "))
            };
            writeln!(
                out,
                "{ib:12} {}  {:10}  {:>4}  {near:12}{chips}",
                d.address,
                d.pcie_root.to_string(),
                numa(d)
            )?;
        }
        writeln!(out)?;
    }

    match (&instance, &table) {
        (Some(t), Some(table)) => {
            let chips: Vec<LocatedChip> = accels
                .iter()
                .filter_map(|a| {
                    a.chip.map(|index| LocatedChip {
                        index,
                        device: a.dev,
                    })
                })
                .collect();
            let efa_devs: Vec<&PciDevice> = efas.iter().map(|(d, _)| *d).collect();
            let mismatches = check_table(table, &chips, &efa_devs);
            if mismatches.is_empty() {
                writeln!(out, "{t}: AWS chip → EFA table agrees with the PCIe tree.")?;
            } else {
                writeln!(
                    out,
                    "{t}: AWS chip → EFA table disagrees with the PCIe tree:"
                )?;
                for m in mismatches {
                    writeln!(out, "  {m}")?;
                }
            }
            if let Some(g) = table.groups_for_chip(0) {
                let attrs: Vec<String> = g
                    .attributes()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                writeln!(out, "chip 0 device groups: {}", attrs.join(" "))?;
            }
        }
        (Some(t), None) if n_chip > 0 => {
            writeln!(
                out,
                "{t} is not EFA-enabled: no devicegroup attributes are published."
            )?;
        }
        _ => {}
    }
    writeln!(
        out,
        "Legend: X self, PIX same PCIe switch, PXB several switches, PHB same root complex, \
         NODE same NUMA node, SYS across NUMA nodes"
    )?;
    Ok(out)
}

fn numa(d: &PciDevice) -> String {
    d.numa_node.map_or("-".to_owned(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p5_shows_every_gpu_with_four_efas_on_its_switch() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate("p5.48xlarge", dir.path()).unwrap();
        let out = render(&SysfsRoot::new(&f.sys), None).unwrap();
        let gpu_rows: Vec<&str> = out.lines().filter(|l| l.starts_with("GPU")).collect();
        assert_eq!(gpu_rows.len(), 8, "{out}");
        for row in gpu_rows {
            let efas = row.split("PIX: ").nth(1).unwrap_or("");
            assert_eq!(efas.split_whitespace().count(), 4, "{row}");
        }
        let efa0: Vec<&str> = out
            .lines()
            .find(|l| l.starts_with("rdmap79s0 "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            efa0,
            [
                "rdmap79s0",
                "0000:4f:00.0",
                "pci0000:44",
                "0",
                "PIX:",
                "GPU0"
            ]
        );
    }

    #[test]
    fn trn2_reports_table_agreement_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        let f = sysfs_fixtures::generate("trn2.48xlarge", dir.path()).unwrap();
        let map = f
            .neuron_chips
            .iter()
            .map(|c| (c.bdf.parse().unwrap(), c.index))
            .collect();
        let out = render(&SysfsRoot::new(&f.sys), Some(&map)).unwrap();
        assert!(out.contains("table agrees"), "{out}");
        assert!(out.contains("devicegroup4_id=13713e551cd37c19"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("NC0 ") && l.ends_with("PIX: rdmap201s0")),
            "{out}"
        );
    }
}
