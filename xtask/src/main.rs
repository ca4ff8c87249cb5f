//! `cargo xtask <task>`: the project's automation, in Rust so that it runs
//! wherever cargo does.

mod ci;
mod k8s;

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
    /// Build the Kubernetes components and run the local end-to-end cluster.
    K8s(k8s::K8sArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Ci(args) => ci::run(args),
        Task::K8s(args) => k8s::run(args),
    }
}
