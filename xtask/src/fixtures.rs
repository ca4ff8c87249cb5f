//! `cargo xtask fixtures`: write a generated hardware tree for an instance
//! type, so that drivers can be run against it by hand
//! (`efa-driver discover --sysfs-root <dir>/sys --dev-root <dir>/dev`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct FixturesArgs {
    /// List the instance types that have a description, and exit.
    #[arg(long, conflicts_with_all = ["instance_type", "dir"])]
    list: bool,
    /// Instance type to generate (see --list).
    #[arg(required_unless_present = "list")]
    instance_type: Option<String>,
    /// Directory to write `<dir>/sys` and `<dir>/dev` into (created if missing).
    #[arg(required_unless_present = "list")]
    dir: Option<PathBuf>,
}

pub fn run(args: FixturesArgs) -> Result<()> {
    if args.list {
        for t in sysfs_fixtures::instance_types() {
            println!("{t}");
        }
        return Ok(());
    }
    let (Some(instance_type), Some(dir)) = (args.instance_type, args.dir) else {
        bail!("give an instance type and a directory, or --list");
    };
    if dir.join("sys").exists() || dir.join("dev").exists() {
        bail!(
            "{} already holds sys/ or dev/; choose an empty directory",
            dir.display()
        );
    }
    let f = sysfs_fixtures::generate(&instance_type, &dir).with_context(|| {
        format!(
            "generating {instance_type} (known: {})",
            sysfs_fixtures::instance_types().join(", ")
        )
    })?;
    println!(
        "{}: {} GPUs, {} EFAs, {} Neuron chips, {} decoys; device nodes as {:?}",
        f.instance_type,
        f.gpus.len(),
        f.efas.len(),
        f.neuron_chips.len(),
        f.decoys.len(),
        f.device_nodes
    );
    println!("  --sysfs-root {}", f.sys.display());
    println!("  --dev-root   {}", f.dev.display());
    Ok(())
}
