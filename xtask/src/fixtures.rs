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
    /// trn2u.48xlarge only: what the UltraServer files say: `member` (node
    /// --ultraserver-node of an UltraServer), `busy` (the NeuronLink
    /// election is running), `none` (the kernel's non-UltraServer values).
    #[arg(long, value_parser = ["member", "busy", "none"], default_value = "member")]
    ultraserver: String,
    /// trn2u.48xlarge only: which of the UltraServer's 4 nodes (0-3).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..4))]
    ultraserver_node: u32,
    /// trn2u.48xlarge only: the supported modes as the kernel lists them
    /// (1 = 4 nodes, 2/3 = 2 nodes, 4 = 1 node).
    #[arg(long, default_value = "1,2,3,4")]
    ultraserver_modes: String,
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
    let f = if instance_type == "trn2u.48xlarge" {
        use sysfs_fixtures::UltraServerSpec;
        let state = match args.ultraserver.as_str() {
            "busy" => UltraServerSpec::Busy,
            "none" => UltraServerSpec::NotMember,
            _ => UltraServerSpec::Member {
                server: 0,
                node: args.ultraserver_node,
                modes: args.ultraserver_modes.leak(),
            },
        };
        sysfs_fixtures::generate_spec(sysfs_fixtures::trn2u(state), &dir, None)
            .context("generating trn2u.48xlarge")?
    } else {
        sysfs_fixtures::generate(&instance_type, &dir).with_context(|| {
            format!(
                "generating {instance_type} (known: {})",
                sysfs_fixtures::instance_types().join(", ")
            )
        })?
    };
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
