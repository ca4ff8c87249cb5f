//! `kubectl-dra`: a kubectl plugin (`kubectl dra …` when on PATH).
//!
//! `explain claim|pod NAME` says why a claim is (not) allocatable;
//! `devices` lists what is published and who holds it. Input comes from the
//! cluster, or from `--from-file` dumps without any cluster access.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use kubectl_dra::cel::{Environment, Release};
use kubectl_dra::devices::{self, Filter};
use kubectl_dra::explain::{self, Allocatable, Explanation, Scope};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::online::{self, Connection};
use kubectl_dra::render;
use kubectl_dra::world::World;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-dra",
    version,
    about = "Why is my DRA claim pending, and what is free"
)]
struct Cli {
    /// Read objects from these files (`kubectl get … -o yaml|json`, multi-document YAML,
    /// or a driver's `discover` output) instead of the cluster. Repeatable.
    #[arg(long = "from-file", short = 'f', global = true)]
    from_file: Vec<PathBuf>,
    /// Path to the kubeconfig file (as kubectl).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (as kubectl).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace of the claim or pod (default: the context's, else "default").
    #[arg(long, short = 'n', global = true)]
    namespace: Option<String>,
    /// The Kubernetes release (1.34 to 1.37) whose CEL environment judges selectors: what its
    /// API server refuses is reported as an invalid selector.
    #[arg(long = "kubernetes-version", global = true, default_value_t = Release::default())]
    kubernetes_version: Release,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Explain why a claim or a pod's claims are (not) allocatable.
    Explain {
        #[arg(value_enum)]
        kind: Kind,
        name: String,
        /// Only consider this node.
        #[arg(long)]
        node: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = ExplainOutput::Text)]
        output: ExplainOutput,
    },
    /// List published devices, their key attributes, holders and taints.
    Devices {
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        driver: Option<String>,
        #[arg(long, short = 'o', value_enum)]
        output: Option<DevicesOutput>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Kind {
    #[value(alias = "resourceclaim")]
    Claim,
    Pod,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ExplainOutput {
    Text,
    Json,
    Yaml,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum DevicesOutput {
    Wide,
    Json,
    Yaml,
}

async fn load(cli: &Cli, pod: Option<&str>) -> Result<(Inventory, String)> {
    if !cli.from_file.is_empty() {
        let inventory = Inventory::from_files(&cli.from_file)?;
        let namespace = cli
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        return Ok((inventory, namespace));
    }
    let (client, default_ns) = online::connect(&Connection {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
    })
    .await?;
    let namespace = cli.namespace.clone().unwrap_or(default_ns);
    let inventory = online::fetch(&client, &namespace, pod).await?;
    Ok((inventory, namespace))
}

fn print_structured<T: serde::Serialize>(value: &T, yaml: bool) -> Result<()> {
    if yaml {
        print!(
            "{}",
            serde_saphyr::to_string(value).context("rendering YAML")?
        );
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(value).context("rendering JSON")?
        );
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Explain {
            kind,
            name,
            node,
            output,
        } => {
            let pod = matches!(kind, Kind::Pod).then_some(name.as_str());
            let (inventory, namespace) = load(&cli, pod).await?;
            let mut world = World::new(&inventory);
            world.env = Environment::for_release(cli.kubernetes_version);
            let (subjects, mut scope) = match kind {
                Kind::Claim => (
                    explain::subjects_for_claim(&inventory, &namespace, name)?,
                    Scope::default(),
                ),
                Kind::Pod => explain::subjects_for_pod(&inventory, &namespace, name)?,
            };
            if node.is_some() {
                scope.node = node.clone();
            }
            let reports: Vec<Explanation> = subjects
                .iter()
                .map(|s| explain::explain(&world, s, &scope))
                .collect();
            match output {
                ExplainOutput::Text => {
                    if subjects.is_empty() {
                        println!(
                            "pod {namespace}/{name} has no DRA claims and no DRA-served extended resources"
                        );
                    }
                    for r in &reports {
                        print!("{}", render::explanation(r));
                        println!();
                    }
                }
                ExplainOutput::Json => print_structured(&reports, false)?,
                ExplainOutput::Yaml => print_structured(&reports, true)?,
            }
            // Exit status a script can use: 0 allocated/allocatable, 1 not, 3 unknown.
            let worst = reports.iter().map(|r| r.allocatable).fold(0u8, |acc, a| {
                acc.max(match a {
                    Allocatable::Allocated | Allocatable::Yes => 0,
                    Allocatable::No => 1,
                    Allocatable::Unknown => 3,
                })
            });
            Ok(ExitCode::from(worst))
        }
        Command::Devices {
            node,
            driver,
            output,
        } => {
            let (inventory, _) = load(&cli, None).await?;
            let mut world = World::new(&inventory);
            world.env = Environment::for_release(cli.kubernetes_version);
            let rows = devices::rows(
                &world,
                &Filter {
                    node: node.clone(),
                    driver: driver.clone(),
                },
            );
            match output {
                None => print!("{}", devices::table(&rows, false)),
                Some(DevicesOutput::Wide) => print!("{}", devices::table(&rows, true)),
                Some(DevicesOutput::Json) => print_structured(&rows, false)?,
                Some(DevicesOutput::Yaml) => print_structured(&rows, true)?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
