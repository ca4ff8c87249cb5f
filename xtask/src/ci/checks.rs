//! The checks that need no cluster: one lane beside the e2e legs, at a lower
//! priority ([`super::lanes`]), so that they take the cores the legs leave
//! idle.

use std::path::Path;

use super::{Step, step};

/// The lane of the checks that need no cluster, beside the e2e legs.
pub(super) const CHECKS_LANE: &str = "checks";

/// The checks that need no cluster, run in one lane beside the e2e legs.
/// `target` is the absolute target directory the steps' cargos build into
/// ([`super::target_dir`]).
pub(super) fn checks(target: &Path) -> Vec<Step> {
    let steps = vec![
        // Licences, bans and sources of the dependency graph (policy:
        // supply-chain.yaml).
        step("supply-chain", 900, &["xtask", "supply-chain"]),
        // Every page under docs/ reachable from docs/README.md, no broken
        // relative link (a second or two).
        step("docs-links", 300, &["xtask", "docs-links"]),
        // The docs against the code: generated reference tables (flags,
        // metrics, chart values) up to date, attribute rows and Node labels
        // as the drivers publish them on every fixture, every named piece of
        // code and repository path existing (CONTRIBUTING.md, "Docs that
        // follow the code"). Seconds once xtask is built.
        step("docs", 300, &["xtask", "docs", "--check"]),
        // Cold: 337 s.
        step(
            "clippy",
            1800,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        // The fuzz targets are a workspace of their own, which neither
        // `fmt --all` nor the clippy above reaches (a plain build, without
        // libFuzzer's instrumentation). Clippy cold: 71 s.
        step(
            "fmt-fuzz",
            300,
            &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--check"],
        ),
        step(
            "clippy-fuzz",
            900,
            &[
                "clippy",
                "--manifest-path",
                "fuzz/Cargo.toml",
                "--bins",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        // dra-core as a driver binary builds it, without the `testing`
        // feature the workspace build turns on through the e2e crate: no
        // unreachable `pub`, no code only the test helpers use.
        step(
            "clippy-sdk",
            900,
            &[
                "clippy", "-p", "dra-core", "--lib", "--locked", "--", "-D", "warnings",
            ],
        ),
        Step {
            env: vec![("RUSTDOCFLAGS", "-D warnings".into())],
            ..step("doc", 900, &["doc", "--workspace", "--no-deps", "--locked"])
        },
        // Cold: 253 s; 245 s warm when dra-core changed.
        step(
            "test",
            1800,
            &["test", "--workspace", "--exclude", "e2e", "--locked"],
        ),
        // The e2e crate's own unit tests and the structure checks (import
        // cycles in the test crates and xtask; file length, and import
        // circles between top-level modules, in every crate; dra-core's public
        // surface): no cluster needed.
        step(
            "e2e-unit",
            900,
            &[
                "test",
                "-p",
                "e2e",
                "--locked",
                "--lib",
                "--test",
                "structure",
                // Every node a scenario asks for is in the kind node list.
                "--test",
                "kind_nodes",
                // dra-core's public items, counted from the source.
                "--test",
                "public_surface",
                // The stand-in GPU driver's tests, dra-core's conformance
                // suite among them.
                "--bin",
                "gpu-test-driver",
            ],
        ),
        // kubectl-dra's command-line tests once more, against the binary a
        // user installs (`cargo install` builds the release profile): a
        // selector that panics the CEL interpreter must still be "cannot
        // decide" there, which takes `panic = "unwind"` in that profile
        // (docs/reliability.md). Cold: 119 s (fat LTO of one binary, the
        // drivers' release dependencies already built by image-build).
        // The binary's path is absolute: the test runs in crates/kubectl-dra
        // (issue 53; `super::target_dir`).
        Step {
            program: "sh",
            args: vec![
                "-c".into(),
                "\"${CARGO:-cargo}\" build --release --locked -p kubectl-dra && \
                 \"${CARGO:-cargo}\" test --locked -p kubectl-dra --test cli"
                    .into(),
            ],
            env: vec![(
                "KUBECTL_DRA_BIN",
                target.join("release").join("kubectl-dra").into_os_string(),
            )],
            ..step("kubectl-dra-release", 900, &[])
        },
        // checkov (pinned, from PyPI; installed into the cache on first
        // use) on the default renderings of the charts: only the failures
        // docs/install.md explains, at most 4 per chart.
        // Warm: ~40 s on this 2-core machine (one checkov run, 4 renderings).
        // Cold it also installs checkov into a virtual environment.
        step("chart-scan", 900, &["xtask", "charts", "scan"]),
    ];
    steps
        .into_iter()
        .map(|s| Step {
            lane: Some(CHECKS_LANE.to_string()),
            nice: true,
            ..s
        })
        .collect()
}
