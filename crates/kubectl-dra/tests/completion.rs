//! `kubectl-dra completion bash|zsh|fish`: each script loaded into the real
//! shell and asked to complete, as a user's Tab would.
//!
//! bash is everywhere the tests run; zsh and fish may not be. Without them
//! the scripts' content is still checked, and the test says on stderr that
//! the shell itself did not run (it does not pretend it did).

use std::path::{Path, PathBuf};
use std::process::Command;

fn script(shell: &str) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
        .args(["completion", shell])
        .output()
        .unwrap_or_else(|e| panic!("running kubectl-dra: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for word in [
        "explain",
        "devices",
        "topology",
        "completion",
        "request-timeout",
    ] {
        assert!(text.contains(word), "{shell} script lacks {word}");
    }
    let path = std::env::temp_dir().join(format!(
        "kubectl-dra-completion-{}-{shell}",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

fn shell_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// bash: the completion function fills COMPREPLY for a partial command line.
fn bash_complete(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _kubectl_dra kubectl-dra '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)]
    );
    shell_output("bash", &["-c", &program])
        .unwrap_or_else(|| panic!("bash not found"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_subcommands_flags_and_values() {
    let s = script("bash");
    let subs = bash_complete(&s, &["kubectl-dra", "to"]);
    assert_eq!(subs, ["topology"]);
    let flags = bash_complete(&s, &["kubectl-dra", "topology", "--co"]);
    assert!(flags.contains(&"--color".to_string()), "{flags:?}");
    assert!(flags.contains(&"--context".to_string()), "{flags:?}");
    let values = bash_complete(&s, &["kubectl-dra", "topology", "-o", ""]);
    assert_eq!(values, ["text", "svg", "json", "yaml"]);
    let shells = bash_complete(&s, &["kubectl-dra", "completion", ""]);
    // The positional's values, after the flags clap also offers there.
    assert!(
        shells.ends_with(&["bash".into(), "zsh".into(), "fish".into()]),
        "{shells:?}"
    );
    // Registered for the command users type.
    let registered = shell_output(
        "bash",
        &[
            "-c",
            &format!("source '{}'; complete -p kubectl-dra", s.display()),
        ],
    )
    .unwrap_or_default();
    assert!(registered.contains("-F _kubectl_dra"), "{registered}");
    let _ = std::fs::remove_file(s);
}

#[test]
fn fish_completes_subcommands_and_values() {
    let s = script("fish");
    let text = std::fs::read_to_string(&s).unwrap_or_default();
    assert!(text.contains("complete -c kubectl-dra"), "{text}");
    let load = format!("source '{}'", s.display());
    match shell_output(
        "fish",
        &[
            "--no-config",
            "-c",
            &format!("{load}; complete -C 'kubectl-dra to'"),
        ],
    ) {
        Some(out) => {
            assert!(out.lines().any(|l| l.starts_with("topology")), "{out}");
            let out = shell_output(
                "fish",
                &[
                    "--no-config",
                    "-c",
                    &format!("{load}; complete -C 'kubectl-dra topology -o '"),
                ],
            )
            .unwrap_or_default();
            let values: Vec<&str> = out
                .lines()
                .map(|l| l.split('\t').next().unwrap_or(""))
                .collect();
            assert_eq!(values, ["json", "svg", "text", "yaml"], "{out}");
        }
        None => eprintln!("fish not found: only the fish script's content was checked"),
    }
    let _ = std::fs::remove_file(s);
}

#[test]
fn zsh_registers_the_completion_function() {
    let s = script("zsh");
    let text = std::fs::read_to_string(&s).unwrap_or_default();
    assert!(text.starts_with("#compdef kubectl-dra"), "{text}");
    let program = format!(
        "autoload -U compinit && compinit -u -D && source '{}' && print -r -- ${{_comps[kubectl-dra]}} && whence -w _kubectl-dra",
        s.display()
    );
    match shell_output("zsh", &["-f", "-c", &program]) {
        Some(out) => {
            assert!(out.contains("_kubectl-dra"), "{out}");
            assert!(out.contains("_kubectl-dra: function"), "{out}");
        }
        None => eprintln!("zsh not found: only the zsh script's content was checked"),
    }
    let _ = std::fs::remove_file(s);
}
