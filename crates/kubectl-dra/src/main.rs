//! `kubectl-dra`: a kubectl plugin (`kubectl dra …` when on PATH).
//!
//! `explain claim|pod NAME` says why a claim is (not) allocatable;
//! `devices` lists what is published and who holds it; `topology NODE` draws
//! one node's devices by PCIe root and device group. Input comes from the
//! cluster, or from `--from-file` dumps without any cluster access.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use kubectl_dra::cel::{Environment, Release};
use kubectl_dra::devices::{self, Filter};
use kubectl_dra::explain::{self, Allocatable, Explanation, Scope};
use kubectl_dra::inventory::Inventory;
use kubectl_dra::lookup::{self, ObjectKind};
use kubectl_dra::online::{self, Connection, SliceScope};
use kubectl_dra::render;
use kubectl_dra::topology;
use kubectl_dra::world::World;

/// `print!` that ends the program quietly when stdout is a closed pipe
/// (`kubectl dra explain pod x | head -3`), as command-line tools do, where
/// `print!` would panic; any other write error is reported, exit status 1.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            eprintln!("error: writing to stdout: {e}");
            std::process::exit(1);
        }
    }};
}

/// `println!` with the same handling as [`out!`].
macro_rules! outln {
    () => {
        out!("\n")
    };
    ($($arg:tt)*) => {{
        out!($($arg)*);
        out!("\n");
    }};
}

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-dra",
    version,
    about = "Why is my DRA claim pending, what is free, and what a node looks like",
    after_help = "Run as `kubectl dra …` once kubectl-dra is on PATH. Offline: pass \
                  `kubectl get … -o yaml` dumps or a driver's `discover` output with -f."
)]
struct Cli {
    /// Read objects from these files (`kubectl get … -o yaml|json`, multi-document YAML,
    /// or a driver's `discover` output) instead of the cluster. Repeatable.
    #[arg(long = "from-file", short = 'f', global = true, value_name = "FILE")]
    from_file: Vec<PathBuf>,
    /// Path to the kubeconfig file (as kubectl; default: KUBECONFIG, then ~/.kube/config,
    /// then in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (as kubectl; default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Namespace of the claim or pod (default: the context's, else "default").
    #[arg(long, short = 'n', global = true, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Look the claim or pod up in every namespace (an error if the name is in several).
    /// `devices` and `topology` always show the claims of every namespace.
    #[arg(
        long = "all-namespaces",
        short = 'A',
        global = true,
        conflicts_with = "namespace"
    )]
    all_namespaces: bool,
    /// How long to wait for each request to the API server before giving up, as kubectl:
    /// a number of seconds or a duration (500ms, 30s, 2m); 0 waits forever.
    #[arg(
        long = "request-timeout",
        global = true,
        value_name = "DURATION",
        default_value = "0",
        value_parser = parse_timeout
    )]
    request_timeout: TimeoutFlag,
    /// The Kubernetes release (1.34 to 1.38, or a version such as v1.38.0-beta.0) whose CEL
    /// environment judges selectors: what its API server refuses is reported as an invalid
    /// selector. A newer release is judged as 1.38, with a warning.
    #[arg(
        long = "kubernetes-version",
        global = true,
        value_name = "RELEASE",
        default_value_t = Release::default()
    )]
    kubernetes_version: Release,
    #[command(subcommand)]
    command: Command,
}

/// `--request-timeout` parsed; `None` is no limit.
#[derive(Debug, Clone, Copy)]
struct TimeoutFlag(Option<Duration>);

fn parse_timeout(s: &str) -> Result<TimeoutFlag, String> {
    online::parse_request_timeout(s).map(TimeoutFlag)
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Explain why a claim or a pod's claims are (not) allocatable.
    ///
    /// Exit status: 0 allocated or allocatable, 1 not allocatable, 3 cannot decide, 2 error.
    Explain {
        /// What NAME is: a ResourceClaim (`claim`) or a Pod (`pod`, all its claims and
        /// DRA-served extended resources).
        #[arg(value_enum)]
        kind: Kind,
        /// Name of the claim or pod (its namespace: -n, or -A to find it).
        name: String,
        /// Only consider this node.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Output format: text for people, json or yaml for scripts (the whole report).
        #[arg(long, short = 'o', value_enum, default_value_t = ExplainOutput::Text)]
        output: ExplainOutput,
    },
    /// List published devices, their key attributes, holders and taints.
    Devices {
        /// Only devices of this node.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Only devices of this driver (e.g. efa.networking.k8s.aws, neuron.aws.com).
        #[arg(long, value_name = "DRIVER")]
        driver: Option<String>,
        /// Output format (default: a table): wide adds pool, slice, every attribute and
        /// capacity; json or yaml give every row in full.
        #[arg(long, short = 'o', value_enum)]
        output: Option<DevicesOutput>,
    },
    /// Draw one node: PCIe roots with their GPUs and EFAs, Neuron chips on
    /// their grid with device groups and NeuronCores, what is allocated (to
    /// which claim), tainted or unhealthy.
    Topology {
        /// The node to draw (its name, as `kubectl get nodes` shows it).
        node: String,
        /// text: Unicode boxes for a terminal; svg: a standalone SVG image
        /// for docs and tickets; json|yaml: the model the pictures are drawn from.
        #[arg(long, short = 'o', value_enum, default_value_t = TopologyOutput::Text)]
        output: TopologyOutput,
        /// Colour in text output: auto (when stdout is a terminal and
        /// NO_COLOR is unset), always or never.
        #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
        color: ColorChoice,
    },
    /// Print a shell completion script for kubectl-dra (bash, zsh or fish), as
    /// `kubectl completion` does: e.g. `source <(kubectl-dra completion bash)`.
    Completion {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: Shell,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum TopologyOutput {
    Text,
    Svg,
    Json,
    Yaml,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// `auto` follows the no-color.org convention: a set, non-empty
    /// `NO_COLOR` turns colour off; so does stdout not being a terminal.
    fn enabled(self) -> bool {
        use std::io::IsTerminal as _;
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Kind {
    /// A ResourceClaim.
    #[value(alias = "resourceclaim")]
    Claim,
    /// A Pod: each of its claims.
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

/// The objects `devices` or `topology` reads: from the files, or the part
/// of the cluster the command shows.
async fn load_for(cli: &Cli, reads: Reads<'_>) -> Result<Inventory> {
    if !cli.from_file.is_empty() {
        return Ok(Inventory::from_files(&cli.from_file)?);
    }
    let (client, _) = online::connect(&connection(cli)).await?;
    Ok(match reads {
        Reads::Devices(scope) => online::fetch_devices(&client, &scope).await?,
        Reads::Topology(node) => online::fetch_topology(&client, node).await?,
    })
}

/// What a command other than `explain` shows.
enum Reads<'a> {
    Devices(SliceScope),
    Topology(&'a str),
}

fn connection(cli: &Cli) -> Connection {
    Connection {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
        request_timeout: cli.request_timeout.0,
    }
}

/// The objects and the namespace to work in. `find` is the claim or pod
/// `explain` is about: with -A its namespace is looked up.
async fn load(cli: &Cli, find: Option<(ObjectKind, &str)>) -> Result<(Inventory, String)> {
    let pod = match find {
        Some((ObjectKind::Pod, name)) => Some(name),
        _ => None,
    };
    let offline = !cli.from_file.is_empty();
    let (inventory, default_ns) = if offline {
        (
            Inventory::from_files(&cli.from_file)?,
            "default".to_string(),
        )
    } else {
        let (client, default_ns) = online::connect(&connection(cli)).await?;
        let inventory = if cli.all_namespaces {
            online::fetch_all_namespaces(&client, pod).await?
        } else {
            let namespace = cli.namespace.as_deref().unwrap_or(&default_ns);
            online::fetch(&client, namespace, pod).await?
        };
        (inventory, default_ns)
    };
    let namespace = match (cli.all_namespaces, find) {
        (true, Some((kind, name))) => lookup::namespace_of(&inventory, kind, name, offline)?,
        _ => cli.namespace.clone().unwrap_or(default_ns),
    };
    Ok((inventory, namespace))
}

fn print_structured<T: serde::Serialize>(value: &T, yaml: bool) -> Result<()> {
    if yaml {
        out!(
            "{}",
            serde_saphyr::to_string(value).context("rendering YAML")?
        );
    } else {
        outln!(
            "{}",
            serde_json::to_string_pretty(value).context("rendering JSON")?
        );
    }
    Ok(())
}

/// The completion script for `shell`, for the `kubectl-dra` command (what
/// the shell completes; `kubectl dra` itself is completed by kubectl).
fn completion_script(shell: Shell) -> String {
    use clap::CommandFactory as _;
    let mut out = Vec::new();
    match shell {
        Shell::Bash => {
            // clap_complete 4.6's bash script breaks on a hyphen in the command
            // name (its case labels turn `-` into a subcommand separator, so
            // nothing past the first word completes). Generated for
            // `kubectl_dra`, then registered for the real name: the function
            // itself never looks at the name.
            clap_complete::generate(
                clap_complete::Shell::Bash,
                &mut Cli::command(),
                "kubectl_dra",
                &mut out,
            );
            let script = String::from_utf8_lossy(&out);
            return script
                .lines()
                .map(
                    |line| match line.trim_start().starts_with("complete -F _kubectl_dra") {
                        true => line.replace(" kubectl_dra", " kubectl-dra"),
                        false => line.to_string(),
                    },
                )
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
        }
        Shell::Zsh => clap_complete::generate(
            clap_complete::Shell::Zsh,
            &mut Cli::command(),
            "kubectl-dra",
            &mut out,
        ),
        Shell::Fish => clap_complete::generate(
            clap_complete::Shell::Fish,
            &mut Cli::command(),
            "kubectl-dra",
            &mut out,
        ),
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Completion { shell } => {
            out!("{}", completion_script(*shell));
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            kind,
            name,
            node,
            output,
        } => {
            let object = match kind {
                Kind::Claim => ObjectKind::Claim,
                Kind::Pod => ObjectKind::Pod,
            };
            let (inventory, namespace) = load(&cli, Some((object, name.as_str()))).await?;
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
                        outln!(
                            "pod {namespace}/{name} has no DRA claims and no DRA-served extended resources"
                        );
                    }
                    for r in &reports {
                        out!("{}", render::explanation(r));
                        outln!();
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
            let scope = SliceScope {
                node: node.clone(),
                driver: driver.clone(),
            };
            let inventory = load_for(&cli, Reads::Devices(scope)).await?;
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
                None => out!("{}", devices::table(&rows, false)),
                Some(DevicesOutput::Wide) => out!("{}", devices::table(&rows, true)),
                Some(DevicesOutput::Json) => print_structured(&rows, false)?,
                Some(DevicesOutput::Yaml) => print_structured(&rows, true)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Topology {
            node,
            output,
            color,
        } => {
            let inventory = load_for(&cli, Reads::Topology(node)).await?;
            let world = World::new(&inventory);
            let picture = topology::build(&world, node)?;
            match output {
                TopologyOutput::Text => {
                    out!("{}", topology::text::render(&picture, color.enabled()))
                }
                TopologyOutput::Svg => out!("{}", topology::svg::render(&picture)),
                TopologyOutput::Json => print_structured(&picture, false)?,
                TopologyOutput::Yaml => print_structured(&picture, true)?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The arguments, with usage and errors written as `kubectl dra …`, the way
/// users call a plugin. (Set here, not on the derive: completion scripts are
/// for the `kubectl-dra` command, and a space in their name breaks them.)
fn parse_args() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Cli::command().bin_name("kubectl dra").get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    let cli = parse_args();
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// Every flag and argument of every subcommand says what it is for.
    #[test]
    fn every_argument_has_help() {
        fn check(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {}", sub.get_name()));
                }
                check(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        check(&Cli::command(), "kubectl dra", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        Cli::command().debug_assert();
    }
}
