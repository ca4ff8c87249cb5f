//! `cargo xtask <task>`: the project's automation, in Rust so that it runs
//! wherever cargo does.

mod ci;
mod fixtures;
mod topology;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Project automation for the AWS DRA drivers"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Everything a change must pass: fmt, clippy, tests (and the end-to-end suite).
    Ci(ci::CiArgs),
    /// Write a generated sysfs + dev tree of an instance type (or --list the types).
    Fixtures(fixtures::FixturesArgs),
    /// Print the GPU / Neuron / EFA affinity matrix of an instance type or a sysfs tree.
    Topology(topology::TopologyArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Ci(args) => ci::run(args),
        Task::Fixtures(args) => fixtures::run(args),
        Task::Topology(args) => topology::run(args),
    }
}
