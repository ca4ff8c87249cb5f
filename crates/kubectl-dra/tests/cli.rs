//! The binary as a user runs it, offline: `--from-file` inputs, exit codes,
//! the devices table and the structured outputs.
//!
//! With `KUBECTL_DRA_BIN` set, every test runs that binary instead of the
//! one cargo built for the test: CI's `kubectl-dra-release` step points it
//! at the release build, the binary users install.

use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn example(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(path)
        .display()
        .to_string()
}

/// The binary under test (see the module docs).
fn binary() -> String {
    std::env::var("KUBECTL_DRA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kubectl-dra").into())
}

fn run(args: &[String]) -> (i32, String, String) {
    let out = Command::new(binary())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl-dra: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `flag FILE` for the device classes and `node`'s EFA and Neuron slices,
/// then `-f` for the example pod asking for 4 chips with EFAs.
fn node_files(flag: &str, node: &str) -> Vec<String> {
    let mut a = Vec::new();
    for f in [
        "classes.yaml".to_string(),
        format!("{node}-efa.yaml"),
        format!("{node}-neuron.yaml"),
    ] {
        a.extend([flag.to_string(), fixture(&f)]);
    }
    a.extend([
        "-f".to_string(),
        example("neuron/neuron-4-chips-with-efas.yaml"),
    ]);
    a
}

#[test]
fn explain_pod_offline_exits_1_with_the_reason() {
    let mut a = node_files("--from-file", "trn1");
    a.extend(args(&["explain", "pod", "neuron-4-chips-with-efas"]));
    let (code, out, err) = run(&a);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("Verdict: Not allocatable"), "{out}");
    assert!(
        out.contains("matchAttribute resource.aws.com/devicegroup4_id"),
        "{out}"
    );

    a.extend(args(&["-o", "json"]));
    let (code, out, err) = run(&a);
    assert_eq!(code, 1, "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json[0]["allocatable"], "no", "{out}");
    assert_eq!(
        json[0]["constraints"][0]["attribute"],
        "resource.aws.com/devicegroup4_id"
    );
}

#[test]
fn explain_on_trn2_exits_0() {
    let mut a = node_files("-f", "trn2");
    a.extend(args(&["explain", "pod", "neuron-4-chips-with-efas"]));
    let (code, out, err) = run(&a);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Allocatable now"), "{out}");
}

/// `--kubernetes-version` takes what an API server reports (`v1.38.0-beta.0`);
/// a release newer than kubectl-dra models is judged as the newest, with one
/// warning on stderr that names both, and an older one is refused.
#[test]
fn kubernetes_versions_newer_and_older_than_modelled() {
    let mut a = node_files("-f", "trn2");
    a.extend(args(&["explain", "pod", "neuron-4-chips-with-efas"]));
    let with_version = |version: &str| {
        let mut v = args(&["--kubernetes-version", version]);
        v.extend(a.iter().cloned());
        run(&v)
    };

    let (code, out, err) = with_version("v1.38.0-beta.0");
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("warning"), "{err}");

    let (code, out, err) = with_version("v1.39.1");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Allocatable now"), "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("Kubernetes v1.39.1 (1.39)"), "{err}");
    assert!(
        warnings[0].contains("newest release kubectl-dra models (1.38)"),
        "{err}"
    );

    let (code, _, err) = with_version("1.33");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is not 1.34 or later"), "{err}");
}

#[test]
fn devices_table_and_yaml() {
    let a = vec![
        "-f".to_string(),
        fixture("p5-efa.yaml"),
        "-f".to_string(),
        fixture("trn1-efa.yaml"),
        "devices".to_string(),
        "--node".to_string(),
        "p5".to_string(),
    ];
    let (code, out, err) = run(&a);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NODE") && lines[0].contains("PCIEROOT"),
        "{out}"
    );
    assert_eq!(lines.len(), 1 + 32, "{out}");
    assert!(lines.iter().skip(1).all(|l| l.starts_with("p5 ")), "{out}");

    let mut yaml = a.clone();
    yaml.extend(args(&["-o", "yaml"]));
    let (code, out, err) = run(&yaml);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<serde_json::Value> =
        serde_saphyr::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(rows.len(), 32);
    assert_eq!(rows[0]["pcieRoot"], "pci0000:44");
}

#[test]
fn errors_name_the_file_and_the_object() {
    let (code, _, err) = run(&args(&["-f", "/nonexistent/bundle.yaml", "devices"]));
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/bundle.yaml"), "{err}");
    let (code, _, err) = run(&[
        "-f".to_string(),
        fixture("classes.yaml"),
        "explain".into(),
        "claim".into(),
        "missing".into(),
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("ResourceClaim default/missing not found"),
        "{err}"
    );
}

#[test]
fn all_namespaces_finds_the_pod_or_says_where_it_is_ambiguous() {
    let mut a = node_files("-f", "trn2");
    let mut found = a.clone();
    found.extend(args(&["explain", "pod", "neuron-4-chips-with-efas", "-A"]));
    let (code, out, err) = run(&found);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Allocatable now"), "{out}");

    // The state file holds claims in team-a and ops; a name in none of them.
    a.extend(["-f".to_string(), fixture("trn1-state.yaml")]);
    let mut missing = a.clone();
    missing.extend(args(&["-A", "explain", "claim", "nowhere"]));
    let (code, _, err) = run(&missing);
    assert_eq!(code, 2);
    assert!(
        err.contains("no ResourceClaim named \"nowhere\" in any namespace"),
        "{err}"
    );
    let mut in_team_a = a.clone();
    in_team_a.extend(args(&[
        "-A",
        "explain",
        "claim",
        "training-job",
        "-o",
        "json",
    ]));
    let (_, out, err) = run(&in_team_a);
    assert!(out.contains("team-a/training-job"), "{out}{err}");

    let (code, _, err) = run(&args(&["-A", "-n", "x", "devices"]));
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
}

/// A server that accepts connections and never answers: the request must
/// give up after --request-timeout and say what to change.
#[test]
fn request_timeout_gives_up_and_names_the_flag() {
    use std::io::Write as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let dir = std::env::temp_dir().join(format!("kubectl-dra-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("config");
    let mut f = std::fs::File::create(&kubeconfig).expect("kubeconfig");
    write!(
        f,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
         contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: x}}\n"
    )
    .expect("write kubeconfig");
    let (code, _, err) = run(&[
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--request-timeout".to_string(),
        "1s".to_string(),
        "devices".to_string(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("listing ResourceSlices"), "{err}");
    // The message of the timeout, not of a refused or reset connection: the
    // request was cut by --request-timeout (no wall-clock bound asserted).
    assert!(err.contains("raise --request-timeout"), "{err}");

    let (code, _, err) = run(&args(&["--request-timeout", "2x", "devices"]));
    assert_eq!(code, 2);
    assert!(err.contains("invalid timeout \"2x\""), "{err}");
}

#[test]
fn help_describes_every_flag() {
    // -h: the short form, one line per flag.
    for sub in [
        &["-h"][..],
        &["explain", "-h"],
        &["devices", "-h"],
        &["topology", "-h"],
    ] {
        let (code, out, err) = run(&args(sub));
        assert_eq!(code, 0, "{err}");
        // Every option line has text after the flag itself.
        let flags = out.lines().filter(|l| {
            let t = l.trim_start();
            t.starts_with("--") || (t.starts_with('-') && t[1..].starts_with(char::is_alphabetic))
        });
        for line in flags {
            let flag_end = line
                .trim_start()
                .find("  ")
                .unwrap_or_else(|| panic!("{sub:?}: no help on {line:?}\n{out}"));
            assert!(
                !line.trim_start()[flag_end..].trim().is_empty(),
                "{sub:?}: no help on {line:?}"
            );
        }
        assert!(out.contains("--request-timeout"), "{out}");
        assert!(out.contains("--all-namespaces"), "{out}");
    }
}

/// `kubectl dra devices | head -1`: when the reader is gone the output is
/// cut short and the program ends with status 0, without a panic message.
/// The pipe's read end is closed before the program starts, so every write
/// fails with EPIPE (Rust ignores SIGPIPE), whatever the timing.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(binary())
        .args(["-f", &fixture("p5-efa.yaml"), "devices"])
        .stdout(writer)
        .output()
        .expect("running kubectl-dra");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// A selector that panics the CEL interpreter (kube-cel 0.8 slices a string
/// at a byte inside 'é') is one the tool cannot decide: exit status 3, the
/// verdict names the panic, and no panic report (nor, with
/// `RUST_BACKTRACE=1`, a backtrace) reaches stderr. Against the release
/// binary this fails if that profile aborts on panic: the process dies of
/// SIGABRT instead.
#[test]
fn a_selector_that_panics_the_interpreter_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let claim = dir.path().join("claim.yaml");
    std::fs::write(
        &claim,
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: odd-datetime
  namespace: default
spec:
  devices:
    requests:
    - name: chip
      exactly:
        deviceClassName: neuron.aws.com
        selectors:
        - cel:
            expression: 'format.datetime().validate("2024-01-01T12:34:5éZ").hasValue()'
"#,
    )
    .expect("writing the claim");
    let out = Command::new(binary())
        .env("RUST_BACKTRACE", "1")
        .args(["--from-file", &fixture("classes.yaml")])
        .args(["--from-file", &fixture("trn1-neuron.yaml")])
        .args(["-f", &claim.display().to_string()])
        .args(["explain", "claim", "odd-datetime"])
        .output()
        .expect("running kubectl-dra");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{:?}\n{stdout}{stderr}",
        out.status
    );
    assert!(
        stdout.contains("Verdict: Cannot decide")
            && stdout.contains("the CEL interpreter panicked: ")
            && stdout.contains("char boundary"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}
