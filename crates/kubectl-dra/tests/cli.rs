//! The binary as a user runs it, offline: `--from-file` inputs, exit codes,
//! the devices table and the structured outputs.

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

fn run(args: &[String]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
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

#[test]
fn explain_pod_offline_exits_1_with_the_reason() {
    let mut a = Vec::new();
    for f in ["classes.yaml", "trn1-efa.yaml", "trn1-neuron.yaml"] {
        a.extend(["--from-file".to_string(), fixture(f)]);
    }
    a.extend([
        "-f".to_string(),
        example("neuron/neuron-4-chips-with-efas.yaml"),
    ]);
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
    let mut a = Vec::new();
    for f in ["classes.yaml", "trn2-efa.yaml", "trn2-neuron.yaml"] {
        a.extend(["-f".to_string(), fixture(f)]);
    }
    a.extend([
        "-f".to_string(),
        example("neuron/neuron-4-chips-with-efas.yaml"),
    ]);
    a.extend(args(&["explain", "pod", "neuron-4-chips-with-efas"]));
    let (code, out, err) = run(&a);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Allocatable now"), "{out}");
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
