//! `cargo xtask <task>`: the project's automation, in Rust so that it runs
//! wherever cargo does.

mod autoscale;
mod base_images;
mod bench;
mod bench_scheduler;
mod cargo_command;
mod chaos;
mod charts;
mod ci;
mod demo;
mod docker;
mod docs_anchors;
mod docs_links;
mod docs_reference;
mod doctor;
mod e2e;
#[cfg(test)]
mod examples;
mod fixtures;
mod fuzz;
mod helm;
mod image_build;
mod k8s;
mod kind;
mod kind_images;
mod kind_network;
mod kind_tool;
mod krew;
mod long_run;
mod lws;
mod manifest_checks;
mod paths;
mod supply_chain;
#[cfg(test)]
mod templates;
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
    /// Helm charts: `check` (lint + render + assertions with real helm), `scan` (checkov), `render`.
    Charts(charts::command::ChartsArgs),
    /// End-to-end suite: `--cluster kind` (Docker) or `--cluster local`.
    E2e(e2e::E2eArgs),
    /// Start the drivers on a local cluster, apply the examples, print the allocations.
    Demo(demo::DemoArgs),
    /// Write a generated sysfs + dev tree of an instance type (or --list the types).
    Fixtures(fixtures::FixturesArgs),
    /// Print the GPU / Neuron / EFA affinity matrix of an instance type or a sysfs tree.
    Topology(topology::TopologyArgs),
    /// Build the Kubernetes components and run the local end-to-end cluster.
    K8s(k8s::K8sArgs),
    /// Benchmarks on the local cluster: our EFA driver against a Go reference
    /// driver (default), or `fleet`: many simulated nodes' publishers.
    Bench(bench::BenchArgs),
    /// Run the libFuzzer targets of fuzz/ (stable toolchain): `[TARGET] [--time S]`.
    Fuzz(fuzz::FuzzArgs),
    /// Faults on the local cluster: SIGKILL cycles, kubelet restart, reboot, outages.
    Chaos(chaos::ChaosArgs),
    /// Node autoscalers on claims: `karpenter` provisions a node for a pod's claim.
    Autoscale(autoscale::AutoscaleArgs),
    /// AWS's UltraServer job as a LeaderWorkerSet (controller built from its Go module) on 4 trn2u kubelets.
    Lws(lws::LwsArgs),
    /// The krew plugin manifest of kubectl dra, from the release archives (sha256, URIs).
    KrewManifest(krew::KrewArgs),
    /// Licence, ban and source checks of the dependency graph (policy: supply-chain.yaml).
    SupplyChain,
    /// Every file under docs/ reachable from docs/README.md, no broken relative link.
    DocsLinks,
    /// The reference parts of the docs from the code (flags, metrics, chart values); `--check`:
    /// fail where a doc disagrees with the code (also attribute tables, code names, paths).
    Docs(docs_reference::DocsArgs),
    /// Whether this machine has what `demo` and `ci` need, and how to install what it lacks.
    Doctor,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Ci(args) => ci::run(args),
        Task::Charts(args) => charts::command::run(args),
        Task::E2e(args) => e2e::run(args),
        Task::Demo(args) => demo::run(args),
        Task::Fixtures(args) => fixtures::run(args),
        Task::Topology(args) => topology::run(args),
        Task::K8s(args) => k8s::run(args),
        Task::Fuzz(args) => fuzz::run(args),
        Task::SupplyChain => supply_chain::run(),
        Task::DocsLinks => docs_links::run(),
        Task::Docs(args) => docs_reference::run(args),
        Task::Doctor => doctor::run(),
        Task::KrewManifest(args) => krew::run(args),
        Task::Bench(args) => bench::run(args),
        Task::Chaos(args) => chaos::run(args),
        Task::Autoscale(args) => autoscale::run(args),
        Task::Lws(args) => lws::run(args),
    }
}
