//! The flags reference of a driver binary, from its clap command: what
//! `--help` prints, as tables (flag, environment variable, default, what).

use super::blocks::cell;

/// One table per subcommand of `command` (`run`, `discover`).
pub fn render(command: &clap::Command) -> String {
    let mut out = String::new();
    for sub in command.get_subcommands() {
        let name = sub.get_name();
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "\n`{} {name}`: {}\n\n",
            command.get_name(),
            cell(&about)
        ));
        out.push_str("| flag | environment | default | what |\n|---|---|---|---|\n");
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                flag(arg),
                arg.get_env()
                    .map(|e| format!("`{}`", e.to_string_lossy()))
                    .unwrap_or_else(|| "—".into()),
                default(arg),
                what(arg)
            ));
        }
    }
    out.trim_start().to_owned()
}

fn flag(arg: &clap::Arg) -> String {
    let mut names = Vec::new();
    if let Some(s) = arg.get_short() {
        names.push(format!("`-{s}`"));
    }
    if let Some(l) = arg.get_long() {
        names.push(format!("`--{l}`"));
    }
    names.join(", ")
}

fn default(arg: &clap::Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    match (values.is_empty(), arg.get_action()) {
        (false, _) if values.iter().all(String::is_empty) => "empty".into(),
        (false, _) => format!("`{}`", values.join(",")),
        (true, clap::ArgAction::SetTrue) => "`false`".into(),
        (true, clap::ArgAction::Count) => "`0`".into(),
        (true, _) if arg.is_required_set() => "required".into(),
        (true, _) => "none".into(),
    }
}

fn what(arg: &clap::Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    let bool_flag = matches!(
        arg.get_action(),
        clap::ArgAction::SetTrue | clap::ArgAction::Count
    );
    if values.is_empty() || bool_flag {
        cell(&help)
    } else {
        let help = help.trim_end().trim_end_matches('.');
        cell(&format!("{help}. One of {}.", values.join(", ")))
    }
}
