//! The container image's compile step, shared with `cargo xtask ci`.
//!
//! The Dockerfile's build stage runs exactly [`BUILD_ARGS`] (checked by the
//! test below), and `cargo xtask ci` runs the same command, so the image's
//! compile is exercised on every CI run even where no Docker engine exists.
//! `docker build` of the Dockerfile itself runs in `cargo xtask e2e --cluster
//! kind` (with local base images as build arguments, `crate::kind_images`);
//! what neither exercises: the public base images and buildx multi-arch.

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
        // The public bases are the defaults; `cargo xtask e2e --cluster kind`
        // passes local ones as build arguments.
        for line in [
            "ARG BUILD_IMAGE=docker.io/library/rust:${RUST_VERSION}-bookworm",
            "ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12",
            "FROM ${BUILD_IMAGE} AS build",
            "FROM ${RUNTIME_IMAGE} AS runtime",
        ] {
            assert!(dockerfile.lines().any(|l| l == line), "no {line:?}");
        }
        // A `# syntax=` line makes BuildKit pull its frontend from a registry.
        assert!(!dockerfile.contains("# syntax="));
    }
}
