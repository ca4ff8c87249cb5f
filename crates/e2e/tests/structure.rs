//! The shape of the code itself. Inside `dra-core`, the test crates
//! (`local-cluster`, `e2e`, `long-runs`) and `xtask/src` (`TREES`), no two
//! files use each other, directly or in a loop. For every crate of the
//! workspace (the members listed in the root `Cargo.toml`, read at test time so
//! that a new crate is covered without editing this file) and the fuzz
//! targets: no source file, product or test, grows past 600 lines; and no two
//! top-level modules use each other, directly or in a loop, counting every
//! file below a module as that module. A circle makes two modules one in all but name:
//! neither can be read, tested or moved without the other.
//!
//! A file "uses" another when its code (comments and its test module
//! aside, whether inline or in a `tests.rs` file declared under
//! `#[cfg(test)]`) names an item through a path that resolves into the
//! other file: `crate::a::b`, `super::x`, `self::x`, in `use` lines or
//! inline. `mod x;` declarations do not count: a parent declaring a child is
//! not a dependency on it. Limits: a path that reaches a module through a
//! glob import (`use super::*` then `x::f`), through a crate root's own
//! `use` without `crate::`, or from a parent to its own child without
//! `self::` (`use child::X`) is not seen; the crate root itself is not a
//! module here (it declares and re-exports everything).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a source file may be: one that grows past it has more than one
/// job (CONVENTIONS.md).
const MAX_LINES: usize = 600;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `(module path, file)` of every `.rs` file under `src`, where the crate
/// root (`lib.rs`/`main.rs`) is the empty path.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                // `src/bin` holds separate crates.
                if path.file_name().is_some_and(|n| n != "bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
                parts.clear();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The code of a file that counts: no comments, no inline test module
/// (`mod tests`, also `pub(crate)` or `pub` when other tests share its helpers).
fn code_of(text: &str) -> String {
    let body = ["", "pub ", "pub(crate) "]
        .iter()
        .filter_map(|vis| text.find(&format!("#[cfg(test)]\n{vis}mod tests")))
        .min()
        .map_or(text, |end| &text[..end]);
    body.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .filter(|l| !l.trim_start().starts_with("mod ") && !l.trim_start().starts_with("pub mod "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that starts with `crate::`, `super::` or `self::`, including
/// the ones inside `use a::{b::c, d}` groups, as segment lists.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let starts = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|p| rest.starts_with(p));
        let boundary = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if let (Some(_), true) = (starts, boundary) {
            let mut j = i;
            let mut segment = String::new();
            let mut segments = Vec::new();
            while j < bytes.len() {
                let c = bytes[j];
                if c.is_alphanumeric() || c == '_' {
                    segment.push(c);
                    j += 1;
                } else if c == ':' && bytes.get(j + 1) == Some(&':') {
                    segments.push(std::mem::take(&mut segment));
                    j += 2;
                } else {
                    break;
                }
            }
            if !segment.is_empty() {
                segments.push(segment);
            }
            // `use crate::a::{b, c::d}`: each member extends the prefix.
            if bytes.get(j) == Some(&'{') {
                let close = bytes[j..]
                    .iter()
                    .position(|c| *c == '}')
                    .map_or(bytes.len(), |p| j + p);
                let inner: String = bytes[j + 1..close].iter().collect();
                for member in inner.split(',') {
                    let mut full = segments.clone();
                    full.extend(
                        member
                            .trim()
                            .split("::")
                            .map(|s| s.trim().to_string())
                            .filter(|s| !s.is_empty() && s != "self" && s != "*"),
                    );
                    out.push(full);
                }
            }
            out.push(segments);
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The file a path from module `from` lands in: its longest module prefix.
fn target(
    from: &[String],
    path: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => from.to_vec(),
        Some("super") => from[..from.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    // `super::Item` lands in the parent itself, not only in a module below
    // it; the crate root is no module here.
    let file =
        |base: &Vec<String>| (!base.is_empty() && mods.contains_key(base)).then(|| base.clone());
    let mut best = file(&base);
    for seg in &path[1..] {
        if seg == "super" {
            base.pop();
        } else {
            base.push(seg.clone());
        }
        best = file(&base).or(best);
    }
    best
}

/// A `tests` file its parent declares only for tests
/// (`#[cfg(test)]` then `mod tests;`): the same as an inline test module.
fn is_test_module(module: &[String], mods: &BTreeMap<Vec<String>, PathBuf>) -> bool {
    let Some((last, parent)) = module.split_last() else {
        return false;
    };
    last == "tests"
        && mods.get(parent).is_some_and(|file| {
            std::fs::read_to_string(file).is_ok_and(|t| t.contains("#[cfg(test)]\nmod tests;"))
        })
}

fn graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(src);
    let mut edges = BTreeMap::new();
    for (module, file) in &mods {
        if is_test_module(module, &mods) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let targets: BTreeSet<Vec<String>> = paths_in(&code)
            .iter()
            .filter_map(|p| target(module, p, &mods))
            .filter(|t| t != module && !t.is_empty())
            .collect();
        edges.insert(module.clone(), targets);
    }
    edges
}

/// A cycle, as module names, if the graph has one.
fn find_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle: Vec<String> =
                        stack[start..].iter().map(|m| m.join("::")).collect();
                    cycle.push(next.join("::"));
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node).copied().unwrap_or(0) == 0
            && let Some(c) = visit(node, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

const TREES: [&str; 5] = [
    "crates/dra-core/src",
    "crates/local-cluster/src",
    "crates/e2e/src",
    "crates/long-runs/src",
    "xtask/src",
];

/// The `members` of the workspace's `Cargo.toml`, as written there.
fn workspace_members() -> Vec<String> {
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map_or("", |(list, _)| list);
    list.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(','))
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The graph between top-level modules: each file counts as the top-level
/// module it sits under; the crate root and uses inside one module drop out.
fn top_level(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut top: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, targets) in edges {
        let Some(from) = from.first() else { continue };
        let out = top.entry(vec![from.clone()]).or_default();
        for to in targets.iter().filter_map(|t| t.first()) {
            if to != from {
                out.insert(vec![to.clone()]);
            }
        }
    }
    top
}

#[test]
fn no_files_import_each_other() {
    for tree in TREES {
        let edges = graph(&repo_root().join(tree));
        assert!(edges.len() > 5, "{tree}: found only {} files", edges.len());
        if let Some(cycle) = find_cycle(&edges) {
            panic!("{tree}: import cycle {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn no_top_level_modules_import_each_other_in_any_crate() {
    let members = workspace_members();
    assert!(
        members.len() >= 8,
        "read only {members:?} from the workspace's members"
    );
    let mut cycles = Vec::new();
    for member in &members {
        let src = repo_root().join(member).join("src");
        let top = top_level(&graph(&src));
        if top.is_empty() {
            // A crate of one file (k8s-quantity) has no modules to circle;
            // anything else without modules means the scan found nothing.
            let files = std::fs::read_dir(&src)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "rs"))
                        .count()
                })
                .unwrap_or(0);
            assert_eq!(files, 1, "{member}: no modules found under {src:?}");
            continue;
        }
        if let Some(cycle) = find_cycle(&top) {
            cycles.push(format!("{member}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import circles: {cycles:#?}");
}

/// Every `.rs` file below `dir` (sources, tests, benches, examples, build
/// scripts), build output aside.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                if path.file_name().is_none_or(|n| n != "target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The files of `files` longer than [`MAX_LINES`], with their lengths.
fn too_long(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect()
}

#[test]
fn files_stay_readable_in_one_sitting() {
    let root = repo_root();
    let mut files = Vec::new();
    for member in workspace_members()
        .iter()
        .map(String::as_str)
        .chain(["fuzz"])
    {
        let found = rust_files(&root.join(member));
        assert!(!found.is_empty(), "{member}: no .rs files found");
        files.extend(found);
    }
    let long = too_long(&files);
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines (split the file along its jobs): {long:#?}"
    );
}

#[test]
fn the_size_check_sees_every_kind_of_file_and_counts_lines() {
    let dir = tempfile::tempdir().unwrap();
    let lines = |n: usize| "x\n".repeat(n);
    for (path, n) in [
        ("src/lib.rs", MAX_LINES),
        ("src/a/deep/mod.rs", MAX_LINES + 1),
        ("tests/big/main.rs", MAX_LINES + 5),
        ("build.rs", 3),
        ("target/debug/build/out.rs", MAX_LINES * 2),
        ("src/notes.txt", MAX_LINES * 2),
    ] {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, lines(n)).unwrap();
    }
    let files = rust_files(dir.path());
    assert_eq!(files.len(), 4, "{files:?}");
    let long: Vec<String> = too_long(&files)
        .iter()
        .map(|l| l.replace(&format!("{}/", dir.path().display()), ""))
        .collect();
    assert_eq!(
        long,
        [
            format!("src/a/deep/mod.rs ({} lines)", MAX_LINES + 1),
            format!("tests/big/main.rs ({} lines)", MAX_LINES + 5),
        ]
    );
}

#[test]
fn the_checker_sees_cycles_and_group_imports() {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let m = |s: &str| vec![s.to_string()];
    edges.insert(m("a"), [m("b")].into());
    edges.insert(m("b"), [m("c")].into());
    edges.insert(m("c"), BTreeSet::new());
    assert_eq!(find_cycle(&edges), None);
    edges.insert(m("c"), [m("a")].into());
    assert_eq!(
        find_cycle(&edges).unwrap(),
        ["a", "b", "c", "a"].map(String::from)
    );

    let mut mods = BTreeMap::new();
    for p in [
        vec![],
        m("cluster"),
        vec!["chart".into(), "host".into()],
        m("chart"),
    ] {
        mods.insert(p, PathBuf::new());
    }
    let code = code_of(
        "use crate::{cluster::X, chart::host::Y};\n// crate::nothing::here\nfn f() { super::host::Z; super::V; }\n#[cfg(test)]\nmod tests { use crate::cluster::W; }",
    );
    let found: BTreeSet<Vec<String>> = paths_in(&code)
        .iter()
        .filter_map(|p| target(&["chart".into(), "values".into()], p, &mods))
        .collect();
    assert_eq!(
        found,
        [
            m("chart"),
            m("cluster"),
            vec!["chart".to_string(), "host".to_string()]
        ]
        .into()
    );
}

#[test]
fn the_checker_sees_circles_between_top_level_modules() {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    // No file-level loop: explain::mod -> world, render -> explain::mod,
    // explain::solve -> render; one between the folders explain and render.
    edges.insert(vec![], [p("explain"), p("render")].into());
    edges.insert(p("explain"), [p("world"), p("explain::solve")].into());
    edges.insert(p("explain::solve"), [p("render")].into());
    edges.insert(p("render"), [p("explain")].into());
    edges.insert(p("world"), BTreeSet::new());
    let top = top_level(&edges);
    assert_eq!(top.get(&vec![]), None, "the crate root is not a module");
    assert_eq!(
        find_cycle(&top).unwrap(),
        ["explain", "render", "explain"].map(String::from)
    );
    edges.insert(p("explain::solve"), BTreeSet::new());
    assert_eq!(find_cycle(&top_level(&edges)), None);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rs"), "#[cfg(test)]\nmod tests;\n").unwrap();
    std::fs::write(dir.path().join("b.rs"), "mod tests;\n").unwrap();
    let mut mods = BTreeMap::new();
    mods.insert(p("a"), dir.path().join("a.rs"));
    mods.insert(p("b"), dir.path().join("b.rs"));
    assert!(is_test_module(&p("a::tests"), &mods));
    assert!(
        !is_test_module(&p("b::tests"), &mods),
        "not declared for tests only"
    );
    assert!(!is_test_module(&p("a::other"), &mods));

    for vis in ["", "pub ", "pub(crate) "] {
        let code = code_of(&format!(
            "use crate::a::X;\n#[cfg(test)]\n{vis}mod tests {{ use crate::b::Y; }}"
        ));
        assert!(
            code.contains("crate::a::X") && !code.contains("crate::b"),
            "{vis}: {code}"
        );
    }
}

/// dra-core's layers and what each may import, as each top-level module's
/// own doc states it (`crates/dra-core/src/<layer>/mod.rs`): `scan` and
/// `prepare` import no other layer, `publish` only `scan`, `kubelet` only
/// `prepare` and `scan`, `daemon` every other layer. `testing` and
/// `fuzzing` are entry points for tests, not layers: no layer imports them
/// outside its tests.
const DRA_CORE_LAYERS: &[(&str, &[&str])] = &[
    ("scan", &[]),
    ("publish", &["scan"]),
    ("prepare", &[]),
    ("kubelet", &["prepare", "scan"]),
    ("daemon", &["scan", "publish", "prepare", "kubelet"]),
];

/// What breaks [`DRA_CORE_LAYERS`] in a top-level graph, one line each.
fn layer_violations(top: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (layer, allowed) in DRA_CORE_LAYERS {
        let Some(targets) = top.get(&vec![(*layer).to_owned()]) else {
            wrong.push(format!("{layer}: no such top-level module"));
            continue;
        };
        for to in targets.iter().filter_map(|t| t.first()) {
            if !allowed.contains(&to.as_str()) {
                wrong.push(format!("{layer} imports {to}"));
            }
        }
    }
    wrong
}

#[test]
fn dra_core_layers_import_only_what_their_docs_allow() {
    let top = top_level(&graph(&repo_root().join("crates/dra-core/src")));
    assert_eq!(layer_violations(&top), Vec::<String>::new());
    // Each rule is stated in the layer's own doc: the test and the docs
    // cannot drift apart silently.
    for (layer, _) in DRA_CORE_LAYERS {
        let doc = std::fs::read_to_string(
            repo_root().join(format!("crates/dra-core/src/{layer}/mod.rs")),
        )
        .unwrap();
        assert!(
            doc.lines()
                .any(|l| l.starts_with("//!") && l.to_lowercase().contains("import")),
            "{layer}/mod.rs states no import rule"
        );
    }
}

#[test]
fn the_layer_check_sees_an_import_against_the_rules() {
    let edge = |from: &str, to: &[&str]| {
        (
            vec![from.to_owned()],
            to.iter()
                .map(|t| vec![(*t).to_owned()])
                .collect::<BTreeSet<_>>(),
        )
    };
    let mut top: BTreeMap<_, _> = [
        edge("scan", &[]),
        edge("publish", &["scan"]),
        edge("prepare", &[]),
        edge("kubelet", &["prepare"]),
        edge("daemon", &["kubelet", "publish"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(layer_violations(&top), Vec::<String>::new());
    top.insert(vec!["scan".into()], [vec!["kubelet".to_owned()]].into());
    top.insert(vec!["prepare".into()], [vec!["testing".to_owned()]].into());
    assert_eq!(
        layer_violations(&top),
        ["scan imports kubelet", "prepare imports testing"]
    );
}
