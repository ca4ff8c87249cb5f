//! The container image's compile step, shared with `cargo xtask ci`.
//!
//! The Dockerfile's build stage runs exactly [`BUILD_ARGS`] (checked by the
//! test below), and `cargo xtask ci` runs the same command, so the image's
//! compile is exercised on every CI run even where no Docker engine exists.
//! What CI cannot exercise: the base images, buildx multi-arch, the COPY of
//! the binaries into the runtime stage.

/// `cargo <BUILD_ARGS>`: the release build of both driver binaries.
pub const BUILD_ARGS: &[&str] = &[
    "build",
    "--release",
    "--locked",
    "-p",
    "efa-driver",
    "-p",
    "neuron-driver",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dockerfile_builds_with_the_ci_command() {
        let dockerfile =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
        let want = format!("cargo {}", BUILD_ARGS.join(" "));
        let runs: Vec<&str> = dockerfile
            .lines()
            .map(|l| l.trim().trim_end_matches('\\').trim())
            .filter(|l| l.starts_with("cargo "))
            .collect();
        assert_eq!(runs, [want.as_str()], "Dockerfile cargo commands");
        for bin in ["efa-driver", "neuron-driver"] {
            assert!(
                dockerfile.contains(&format!("target/release/{bin}")),
                "{bin} is not copied out of the build stage"
            );
        }
        assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian12 AS runtime"));
    }
}
