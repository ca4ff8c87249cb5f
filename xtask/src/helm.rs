//! The `helm` CLI, built from its Go module and cached.
//!
//! The version is pinned by the wrapper module in `e2e/go/helm/go.mod`
//! (with its `go.sum`), so every machine builds the same Helm from the Go
//! module proxy; nothing is downloaded as a prebuilt binary. The binary lands
//! in `~/.cache/aws-dra/helm/<version>/helm` (or under `$AWS_DRA_CACHE_DIR`) and
//! is rebuilt only when missing or when it reports another version. Helm's
//! own config, cache and data directories are kept beside it, so a user's
//! `~/.config/helm` (repositories, plugins) never changes what the checks do.
//!
//! Limits: needs a Go toolchain at least as new as the `go` line of the
//! wrapper module; `GOTOOLCHAIN` defaults to `local`, so an older Go is
//! reported instead of silently fetching a newer one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Wrapper module, relative to the repository root.
const WRAPPER_DIR: &str = "e2e/go/helm";
/// The module whose `cmd/helm` package is built.
const HELM_MODULE: &str = "helm.sh/helm/v4";

/// A built Helm and the private directories it runs with.
pub struct Helm {
    pub binary: PathBuf,
    pub version: String,
    home: PathBuf,
}

impl Helm {
    /// A `helm` command with the private config/cache/data directories.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"));
        cmd
    }

    /// Runs helm with `args`, returning stdout; stderr is included in the error.
    pub fn output(&self, args: &[&str]) -> Result<String> {
        let _turn = e2e::charts::chart_dirs_lock(args).context("locking charts/.helm.lock")?;
        let out = self
            .command()
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.binary.display()))?;
        if !out.status.success() {
            bail!(
                "helm {} failed ({}):\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8(out.stdout).context("helm printed non-UTF-8 output")
    }
}

/// The one cache root of everything the project builds from source
/// (`$AWS_DRA_CACHE_DIR`, else `~/.cache/aws-dra`), shared with the
/// Kubernetes binaries so one variable moves all of it.
pub fn cache_root() -> Result<PathBuf> {
    Ok(local_cluster::toolchain::cache_root())
}

/// The Helm version the wrapper module pins, read from its `go.mod`.
pub fn pinned_version(go_mod: &str) -> Result<String> {
    go_mod
        .lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(HELM_MODULE))
                .then(|| words.next())
                .flatten()
                .map(str::to_owned)
        })
        .filter(|v| v.starts_with('v'))
        .with_context(|| format!("{WRAPPER_DIR}/go.mod does not require {HELM_MODULE}"))
}

/// Returns a working Helm, building it first if the cache does not hold the
/// pinned version. Safe to call repeatedly and from concurrent processes
/// (the binary is built under a temporary name and renamed into place).
pub fn ensure(repo_root: &Path) -> Result<Helm> {
    let wrapper = repo_root.join(WRAPPER_DIR);
    let go_mod = std::fs::read_to_string(wrapper.join("go.mod"))
        .with_context(|| format!("reading {}", wrapper.join("go.mod").display()))?;
    let version = pinned_version(&go_mod)?;
    let cache = cache_root()?;
    let dir = cache.join("helm").join(&version);
    let helm = Helm {
        binary: dir.join("helm"),
        version: version.clone(),
        home: dir.join("home"),
    };
    if helm.binary.is_file() {
        match helm.output(&["version", "--template", "{{.Version}}"]) {
            Ok(v) if v.trim() == version => return Ok(helm),
            Ok(v) => eprintln!(
                "==> helm: cached binary reports {}, want {version}: rebuilding",
                v.trim()
            ),
            Err(e) => eprintln!("==> helm: cached binary does not run ({e:#}): rebuilding"),
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!("helm.tmp.{}", std::process::id()));
    eprintln!(
        "==> helm: building {HELM_MODULE} {version} from the Go module proxy into {} (first time only; a few minutes)",
        dir.display()
    );
    let started = Instant::now();
    let go_cache = cache.join("go");
    // Held while the build reads and writes the Go build cache, which a
    // Kubernetes build beside this one may otherwise empty.
    let _hold = local_cluster::go_toolchain::hold_build_cache()?;
    let status = Command::new("go")
        .current_dir(&wrapper)
        .env("GOMODCACHE", go_cache.join("mod"))
        .env("GOCACHE", go_cache.join("build"))
        .env(
            "GOTOOLCHAIN",
            std::env::var("GOTOOLCHAIN").unwrap_or_else(|_| "local".into()),
        )
        .env("CGO_ENABLED", "0")
        .args(["build", "-mod=readonly", "-trimpath", "-ldflags"])
        .arg(format!(
            "-s -w -X {HELM_MODULE}/internal/version.version={version}"
        ))
        .arg("-o")
        .arg(&tmp)
        .arg(format!("{HELM_MODULE}/cmd/helm"))
        .status()
        .context("running `go build` (is a Go toolchain on PATH?)")?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!("building helm {version} failed ({status})");
    }
    std::fs::rename(&tmp, &helm.binary)
        .with_context(|| format!("moving the new helm to {}", helm.binary.display()))?;
    eprintln!(
        "==> helm: built {version} in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    let v = helm.output(&["version", "--template", "{{.Version}}"])?;
    if v.trim() != version {
        bail!("freshly built helm reports {:?}, want {version}", v.trim());
    }
    Ok(helm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_version_reads_the_require_line() {
        let table = [
            (
                "module m\n\nrequire helm.sh/helm/v4 v4.3.2\n",
                Some("v4.3.2"),
            ),
            (
                "module m\nrequire (\n\tfoo.io/x v1.0.0\n\thelm.sh/helm/v4 v4.3.2 // indirect\n)\n",
                Some("v4.3.2"),
            ),
            ("module m\ntool helm.sh/helm/v4/cmd/helm\n", None),
            ("module m\nrequire helm.sh/helm/v3 v3.19.0\n", None),
        ];
        for (go_mod, want) in table {
            assert_eq!(pinned_version(go_mod).ok().as_deref(), want, "{go_mod}");
        }
    }

    #[test]
    fn the_committed_wrapper_pins_helm() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let go_mod = std::fs::read_to_string(root.join(WRAPPER_DIR).join("go.mod")).unwrap();
        let v = pinned_version(&go_mod).unwrap();
        assert!(v.starts_with("v4."), "{v}");
        assert!(root.join(WRAPPER_DIR).join("go.sum").is_file());
    }
}
