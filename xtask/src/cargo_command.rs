//! Every cargo that xtask starts is started here, without the variables
//! `cargo run` (which `cargo xtask` is) set for the xtask package.
//!
//! Build scripts name some of those variables in `rerun-if-env-changed`
//! (ring's: `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, the version parts), and
//! cargo compares them against its own environment. A cargo started by
//! xtask saw xtask's values and a cargo started from a shell none, so the
//! two took turns rebuilding ring and everything above it (rustls, kube,
//! both drivers: about 3 minutes of release build on 2 cores) whenever they
//! alternated, CI's image-build step included.

use std::process::Command;

/// `cargo` (the one that runs xtask, when known), with the package
/// variables of `cargo run` removed from its environment.
pub fn cargo() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_cargo_run_var) {
            command.env_remove(&name);
        }
    }
    command
}

/// Whether `name` is one of the variables `cargo run` sets for the package
/// it runs (cargo's variables for a crate being compiled).
fn is_cargo_run_var(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || name.starts_with("CARGO_CFG_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_package_variables_and_keeps_the_user_configuration() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            assert!(is_cargo_run_var(name), "{name} kept");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO_BUILD_JOBS",
            "CARGO_NET_OFFLINE",
            "RUSTFLAGS",
        ] {
            assert!(!is_cargo_run_var(name), "{name} dropped");
        }
    }

    #[test]
    fn the_command_does_not_pass_the_package_variables_on() {
        // `cargo test` sets CARGO_MANIFEST_DIR and CARGO_PKG_NAME for this
        // test binary, as `cargo run` does for xtask.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let command = cargo();
        let removed: Vec<_> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        assert!(
            removed.iter().any(|n| n == "CARGO_MANIFEST_DIR"),
            "{removed:?}"
        );
        assert!(removed.iter().any(|n| n == "CARGO_PKG_NAME"), "{removed:?}");
    }
}
