//! The checks against a made-up machine: a PATH of stand-in programs, some
//! of them missing or failing.

use super::*;

/// A directory of stand-in programs that print `output` and exit 0 (or 1
/// where `ok` is false).
struct FakeBin(tempfile::TempDir);

impl FakeBin {
    fn new() -> FakeBin {
        FakeBin(tempfile::tempdir().unwrap())
    }

    fn add(&self, name: &str, output: &str, ok: bool) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.0.path().join(name);
        let script = format!(
            "#!/bin/sh\necho '{output}'\nexit {}\n",
            if ok { 0 } else { 1 }
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

/// A machine with every prerequisite: each program a stand-in, Go 1.26.
fn complete() -> FakeBin {
    let bin = FakeBin::new();
    for name in [
        "rustfmt",
        "cargo-clippy",
        "cc",
        "c++",
        "python3",
        "git",
        "apt-get",
        "ip",
        "mount",
    ] {
        bin.add(name, "1.0", true);
    }
    bin.add("go", "go version go1.26.8 linux/amd64", true);
    bin
}

fn host(bin: &FakeBin) -> Host {
    Host {
        path: bin.path().as_os_str().to_owned(),
        cxx: None,
        go: None,
        // Not there: Go is looked up on PATH.
        go_default: bin.path().join("no-such-go"),
        uid_is_root: true,
        checkov_cached: false,
    }
}

fn missing(host: &Host) -> Vec<&'static str> {
    report(host).1
}

#[test]
fn a_complete_machine_passes() {
    let bin = complete();
    let (lines, missing) = report(&host(&bin));
    assert_eq!(missing, Vec::<&str>::new(), "{lines:#?}");
    assert_eq!(lines.len(), PREREQUISITES.len());
    assert!(check(&host(&bin)).is_ok());
}

#[test]
fn a_tool_missing_from_path_is_named_with_how_to_install_it() {
    let bin = complete();
    std::fs::remove_file(bin.path().join("c++")).unwrap();
    std::fs::remove_file(bin.path().join("cargo-clippy")).unwrap();
    let h = host(&bin);
    let (lines, missing) = report(&h);
    assert_eq!(missing, ["clippy", "C++ compiler"]);
    let cxx = lines.iter().find(|l| l.contains("C++ compiler")).unwrap();
    assert!(cxx.starts_with("MISSING"), "{cxx}");
    assert!(cxx.contains("`c++` is not on PATH"), "{cxx}");
    assert!(cxx.contains("install: apt-get install -y g++"), "{cxx}");
    let err = check(&h).unwrap_err().to_string();
    assert!(err.contains("missing: clippy, C++ compiler"), "{err}");
}

#[test]
fn cxx_names_the_compiler_to_check() {
    let bin = complete();
    std::fs::remove_file(bin.path().join("c++")).unwrap();
    bin.add("clang++", "clang 19", true);
    let h = Host {
        cxx: Some("clang++".into()),
        ..host(&bin)
    };
    assert!(missing(&h).is_empty(), "{:?}", report(&h).0);
}

#[test]
fn a_failing_tool_counts_as_missing() {
    // rustup's proxy answers for a component it does not have, and fails.
    let bin = complete();
    bin.add("rustfmt", "error: 'rustfmt' is not installed", false);
    assert_eq!(missing(&host(&bin)), ["rustfmt"]);
}

#[test]
fn python_without_venv_is_missing() {
    let bin = complete();
    bin.add(
        "python3",
        "ModuleNotFoundError: No module named 'ensurepip'",
        false,
    );
    // The index probe runs python3 too: both fail, each named.
    assert_eq!(
        missing(&host(&bin)),
        ["python3 with venv", "Python package index"]
    );
    // With checkov cached, only the interpreter's modules are asked for.
    let h = Host {
        checkov_cached: true,
        ..host(&bin)
    };
    assert_eq!(missing(&h), ["python3 with venv"]);
}

#[test]
fn go_is_found_where_the_builds_look_and_must_be_new_enough() {
    let bin = complete();
    bin.add("go", "go version go1.24.2 linux/amd64", true);
    let h = host(&bin);
    let (lines, missing) = report(&h);
    assert_eq!(missing, ["Go"]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("is Go 1.24; the modules need 1.26")),
        "{lines:#?}"
    );
    // $AWS_DRA_GO wins over PATH.
    let newer = FakeBin::new();
    newer.add("go", "go version go1.27.0 linux/amd64", true);
    let h = Host {
        go: Some(newer.path().join("go")),
        ..host(&bin)
    };
    assert!(report(&h).1.is_empty());
    // No Go anywhere.
    std::fs::remove_file(bin.path().join("go")).unwrap();
    let (lines, missing) = report(&host(&bin));
    assert_eq!(missing, ["Go"]);
    assert!(lines.iter().any(|l| l.contains("`go` is not on PATH")));
}

#[test]
fn go_versions_are_read_from_go_version() {
    assert_eq!(go_version("go version go1.26.8 linux/amd64"), Some((1, 26)));
    assert_eq!(
        go_version("go version go1.27rc1 linux/amd64"),
        Some((1, 27))
    );
    assert_eq!(go_version("go version devel"), None);
}

#[test]
fn not_root_is_missing() {
    let bin = complete();
    let h = Host {
        uid_is_root: false,
        ..host(&bin)
    };
    assert_eq!(missing(&h), ["root"]);
}

#[test]
fn the_go_minimum_is_the_highest_go_directive_the_local_go_builds() {
    // A module that asks for a Go minor with a pinned toolchain
    // (`GO_TOOLCHAINS`: Kubernetes 1.38's 1.27) builds with that toolchain,
    // fetched through the Go proxy; the local Go builds every other one.
    let fetched = |v: (u32, u32)| {
        local_cluster::go_toolchain::GO_TOOLCHAINS
            .iter()
            .any(|(minor, _)| *minor == format!("{}.{}", v.0, v.1))
    };
    let root = crate::paths::repo_root().join("e2e/go");
    let mut highest = (0, 0);
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "go.mod") {
                let text = std::fs::read_to_string(&path).unwrap();
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("go ") {
                        let v = go_version(&format!("go version go{v} x")).unwrap();
                        if !fetched(v) {
                            highest = highest.max(v);
                        }
                    }
                }
            }
        }
    }
    assert_eq!(GO_MIN, highest);
}
