//! Building Go programs from their modules: the Go toolchain, wrapper
//! modules, and stamped output directories.
//!
//! A stamp file records exactly what produced a directory (hash of the
//! wrapper module, Go version, flags): if anything changes the directory is
//! rebuilt, never half-reused. Builds run one at a time with `go build -p 2`:
//! the machines this runs on are small and shared.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result, io};
use crate::paths::cache_root;
use crate::process::run_checked;
use crate::versions::KubernetesVersion;

/// Called with one human-readable line per step.
pub type Progress = Box<dyn FnMut(&str) + Send>;

/// The Kubernetes commands every wrapper module builds (its `tool` list).
pub const KUBERNETES_COMMANDS: [&str; 5] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
];

/// The Kubernetes commands a kind node image needs besides those
/// (`cargo xtask e2e --cluster kind` with the offline node image): listed
/// in every wrapper module too, built only for kind.
pub const KIND_NODE_COMMANDS: [&str; 2] = ["kubeadm", "kube-proxy"];

/// One command of a wrapper module to build: the binary's name, its Go
/// package, whether it needs cgo, and its `-ldflags` and `-tags`.
pub struct GoTarget {
    pub name: &'static str,
    pub package: String,
    pub cgo: bool,
    pub ldflags: String,
    pub tags: String,
}

pub use crate::go_stand_ins::{STAND_INS, stand_in_paths, stand_ins_key};
pub use crate::go_toolchain::GoToolchain;

/// Builds `targets` of one wrapper module into `out_dir`, unless its stamp
/// already matches.
pub fn build_set(
    go: &GoToolchain,
    label: &str,
    module_dir: &Path,
    out_dir: &Path,
    targets: &[GoTarget],
    extra_key: &str,
    progress: &mut Progress,
) -> Result<()> {
    let mut key = Sha256::new();
    key.update(go.version().as_bytes());
    for file in ["go.mod", "go.sum"] {
        let path = module_dir.join(file);
        if path.exists() {
            key.update(fs::read(&path).map_err(io("reading", &path))?);
        }
    }
    key.update(extra_key.as_bytes());
    for t in targets {
        key.update(
            format!(
                "{}|{}|{}|{}|{}",
                t.name, t.package, t.cgo, t.ldflags, t.tags
            )
            .as_bytes(),
        );
    }
    let key = hex::encode(key.finalize());
    let stamp = out_dir.join(".stamp");
    if fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == key)
        && targets.iter().all(|t| out_dir.join(t.name).exists())
    {
        progress(&format!("{label}: up to date in {}", out_dir.display()));
        return Ok(());
    }
    fs::create_dir_all(out_dir).map_err(io("creating", out_dir))?;
    let _hold = crate::go_toolchain::hold_build_cache()?;
    let _ = fs::remove_file(&stamp);
    let total = Instant::now();
    for (i, t) in targets.iter().enumerate() {
        let started = Instant::now();
        progress(&format!(
            "{label}: [{}/{}] go build {} (cgo={})",
            i + 1,
            targets.len(),
            t.package,
            t.cgo
        ));
        let tmp = out_dir.join(format!(".{}.tmp", t.name));
        let mut cmd = go.command(module_dir);
        cmd.args(["build", "-p", "2", "-ldflags", &t.ldflags]);
        if !t.tags.is_empty() {
            cmd.args(["-tags", &t.tags]);
        }
        cmd.arg("-o")
            .arg(&tmp)
            .arg(&t.package)
            .env("CGO_ENABLED", if t.cgo { "1" } else { "0" });
        run_with_heartbeat(&mut cmd, t.name, progress)?;
        let dest = out_dir.join(t.name);
        fs::rename(&tmp, &dest).map_err(io("renaming into", &dest))?;
        progress(&format!(
            "{label}: built {} in {:.0}s",
            t.name,
            started.elapsed().as_secs_f64()
        ));
    }
    fs::write(&stamp, &key).map_err(io("writing", &stamp))?;
    progress(&format!(
        "{label}: done in {:.0}s",
        total.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Empties the Go build cache (`<cache>/go/build`) once what a step builds
/// is stamped in the cache (a Kubernetes release, kind's node binaries,
/// CoreDNS): what the compiler kept for them (about 6 GB a release) only
/// helps a rebuild of the same module, which a stamp makes rare. The module
/// cache (sources, and the fetched Go toolchains) stays.
/// `AWS_DRA_KEEP_GO_BUILD_CACHE=1` keeps it (for someone iterating on a
/// wrapper module). A no-op when the cache is empty (a warm run); best
/// effort otherwise: a failure is reported, never fatal.
pub fn prune_build_cache(go: &GoToolchain, progress: &mut Progress) {
    let dir = cache_root().join("go/build");
    let before = dir_size(&dir);
    if before < 1_000_000 {
        return;
    }
    if std::env::var_os("AWS_DRA_KEEP_GO_BUILD_CACHE").is_some_and(|v| v != "0") {
        progress("go build cache kept (AWS_DRA_KEEP_GO_BUILD_CACHE)");
        return;
    }
    let _owned = match crate::go_toolchain::try_own_build_cache() {
        Ok(Some(file)) => file,
        Ok(None) => {
            progress("go build cache kept: a Go build beside this one is using it");
            return;
        }
        Err(e) => {
            progress(&format!("go build cache not emptied: {e}"));
            return;
        }
    };
    match run_checked(go.command(&std::env::temp_dir()).args(["clean", "-cache"])) {
        Ok(_) => progress(&format!(
            "go build cache emptied ({:.1} GB freed; the binaries are cached, \
             AWS_DRA_KEEP_GO_BUILD_CACHE=1 keeps it)",
            before as f64 / 1e9
        )),
        Err(e) => progress(&format!("go build cache not emptied: {e}")),
    }
}

/// Bytes of the files under `dir` (0 when it cannot be read).
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// Runs a long command, forwarding its output lines (Go prints only errors
/// and downloads) and printing a heartbeat every 30 s so a cold build is
/// visibly alive.
pub(crate) fn run_with_heartbeat(
    cmd: &mut Command,
    name: &str,
    progress: &mut Progress,
) -> Result<()> {
    let rendered = format!("{cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: rendered.clone(),
            source,
        })?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let started = Instant::now();
    let mut tail: Vec<String> = Vec::new();
    let mut next_beat = Duration::from_secs(30);
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                progress(&format!("  {name}: {line}"));
                tail.push(line);
                if tail.len() > 40 {
                    tail.remove(0);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if started.elapsed() >= next_beat {
            progress(&format!(
                "  {name}: still building ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            next_beat += Duration::from_secs(30);
        }
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child.wait().map_err(|source| Error::Spawn {
        command: rendered.clone(),
        source,
    })?;
    if !status.success() {
        return Err(Error::CommandFailed {
            command: rendered,
            status: status.to_string(),
            output_tail: tail.join("\n"),
        });
    }
    Ok(())
}

/// `-X` flags so `/version`, the Node's kubeletVersion and feature-gate
/// defaults all report the real release instead of `v0.0.0-master`.
pub fn kubernetes_ldflags(version: &KubernetesVersion) -> String {
    let mut flags = vec!["-s".to_string(), "-w".to_string()];
    for pkg in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        for (var, value) in [
            ("gitVersion", version.to_string()),
            ("gitMajor", version.major.to_string()),
            ("gitMinor", version.minor.to_string()),
            ("gitTreeState", "clean".to_string()),
            ("buildDate", "1970-01-01T00:00:00Z".to_string()),
        ] {
            flags.push(format!("-X {pkg}.{var}={value}"));
        }
    }
    flags.join(" ")
}

/// Checks that the wrapper module at `dir` requires `module` at `expected`.
pub(crate) fn check_pin(dir: &Path, module: &str, expected: &str) -> Result<()> {
    let path = dir.join("go.mod");
    let text = fs::read_to_string(&path).map_err(io("reading", &path))?;
    let found = required_version(&text, module).unwrap_or_default();
    if found != expected {
        return Err(Error::PinMismatch {
            path,
            module: module.to_string(),
            found,
            expected: expected.to_string(),
        });
    }
    Ok(())
}

/// The version a go.mod `require`s `module` at, in either the one-line or
/// the block form.
pub fn required_version(go_mod: &str, module: &str) -> Option<String> {
    let mut in_require = false;
    for line in go_mod.lines() {
        let line = line.split("//").next().unwrap_or("").trim();
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["require", "("] => in_require = true,
            [")"] => in_require = false,
            ["require", m, v] if *m == module => return Some((*v).to_string()),
            [m, v] if in_require && *m == module => return Some((*v).to_string()),
            _ => {}
        }
    }
    None
}

/// The module paths upstream's go.mod maps to `./staging/src/...`: exactly
/// the modules a dependent wrapper must replace by their published tags.
pub fn staging_modules(upstream_go_mod: &str) -> Vec<String> {
    upstream_go_mod
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once("=>")?;
            let target = right.trim();
            target
                .starts_with("./staging/")
                .then(|| left.split_whitespace().last().map(str::to_string))
                .flatten()
        })
        .collect()
}

/// The go.mod of a wrapper module for `version` (before `go mod tidy` adds
/// the indirect requirements). `upstream_go_mod` is k8s.io/kubernetes' own.
/// `stand_ins` maps a module the proxy will not serve to the directory of
/// ours that replaces it, as the wrapper's go.mod must spell it; only those
/// upstream requires are written.
pub fn render_kubernetes_go_mod(
    version: &KubernetesVersion,
    upstream_go_mod: &str,
    upstream_path: &Path,
    stand_ins: &[(&str, String)],
) -> Result<String> {
    let staging = staging_modules(upstream_go_mod);
    if staging.is_empty() {
        return Err(Error::NoStagingReplaces {
            path: upstream_path.to_path_buf(),
        });
    }
    // Keep upstream's language version and GODEBUG defaults: they are part of
    // how the release behaves, and a dependency's godebug lines do not apply to us.
    let directive = |name: &str| {
        upstream_go_mod
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map(|l| format!("{l}\n\n"))
            .unwrap_or_default()
    };
    let mut out = String::new();
    out.push_str(
        "// Wrapper module that builds the Kubernetes components of the local\n\
         // end-to-end cluster (crates/e2e) from the k8s.io/kubernetes Go module.\n\
         //\n\
         // Generated by `cargo xtask k8s gen-module` from upstream's go.mod: a\n\
         // dependency's replace directives do not apply to us, so every staging\n\
         // module upstream maps to ./staging/src/k8s.io/<name> is replaced here at\n\
         // the matching v0.MINOR.PATCH tag. Regenerate rather than edit.\n",
    );
    out.push_str("module github.com/aws-dra/aws-dra-drivers/e2e/go/kubernetes\n\n");
    out.push_str(&directive("go"));
    out.push_str(&directive("godebug"));
    out.push_str("tool (\n");
    for c in KUBERNETES_COMMANDS.iter().chain(&KIND_NODE_COMMANDS) {
        out.push_str(&format!("\tk8s.io/kubernetes/cmd/{c}\n"));
    }
    out.push_str(")\n\n");
    out.push_str(&format!(
        "require k8s.io/kubernetes {version}\n\nreplace (\n"
    ));
    let staging_version = version.staging_version();
    for m in staging {
        out.push_str(&format!("\t{m} => {m} {staging_version}\n"));
    }
    for (module, dir) in stand_ins {
        if required_version(upstream_go_mod, module).is_some() {
            out.push_str(&format!(
                "\t// The proxy refuses this module's zip: our stand-in (its go.mod says why).\n\
                 \t{module} => {dir}\n"
            ));
        }
    }
    out.push_str(")\n");
    Ok(out)
}

/// Writes and tidies a wrapper module for `version` into `dir` (needs the Go
/// module proxy). `cargo xtask k8s gen-module` uses this to move the pin.
/// The tidy runs with the Go the release's go.mod asks for
/// ([`GoToolchain::for_module`]).
pub fn generate_kubernetes_module(version: &KubernetesVersion, dir: &Path) -> Result<()> {
    GoToolchain::find()?.generate(version, dir)
}

impl GoToolchain {
    pub(crate) fn generate(&self, version: &KubernetesVersion, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let download = |go: &GoToolchain| {
            let mut cmd = go.command(dir);
            cmd.args(["mod", "download", "-json"])
                .arg(format!("k8s.io/kubernetes@{version}"))
                // Outside any module: `go mod download` needs none for a path@version.
                .env("GO111MODULE", "on")
                .env("GOFLAGS", "-mod=mod");
            let rendered = format!("{cmd:?}");
            let out = cmd.output().map_err(|source| Error::Spawn {
                command: rendered,
                source,
            })?;
            let json = String::from_utf8_lossy(&out.stdout).into_owned();
            let info: BTreeMap<String, serde_json::Value> =
                serde_json::from_str(&json).map_err(|source| Error::Json {
                    what: format!("go mod download output for {version}"),
                    source,
                })?;
            Ok::<_, Error>((out.status.success(), json, info))
        };
        let (mut ok, mut json, mut info) = download(self)?;
        // A release whose go.mod asks for a newer Go than this one refuses
        // the download ("requires go >= 1.27.0"), but its go.mod is already
        // fetched: it says which Go to download the rest with.
        let fetched_go_mod = info
            .get("GoMod")
            .and_then(|v| v.as_str())
            .map(PathBuf::from);
        if !ok
            && let Some(gomod) = fetched_go_mod
            && let Ok(text) = fs::read_to_string(&gomod)
        {
            let go = GoToolchain::for_go_mod(&text, &gomod)?;
            (ok, json, info) = download(&go)?;
        }
        if !ok {
            return Err(Error::CommandFailed {
                command: format!("go mod download k8s.io/kubernetes@{version}"),
                status: "failed".into(),
                output_tail: json,
            });
        }
        let gomod_path = info
            .get("GoMod")
            .and_then(|v| v.as_str())
            .map(PathBuf::from)
            .ok_or_else(|| Error::CommandFailed {
                command: format!("go mod download k8s.io/kubernetes@{version}"),
                status: "no GoMod in output".into(),
                output_tail: json.clone(),
            })?;
        let upstream = fs::read_to_string(&gomod_path).map_err(io("reading", &gomod_path))?;
        let stand_ins = stand_in_paths(dir);
        let stand_ins: Vec<(&str, String)> =
            stand_ins.iter().map(|(m, p)| (*m, p.clone())).collect();
        let rendered = render_kubernetes_go_mod(version, &upstream, &gomod_path, &stand_ins)?;
        let path = dir.join("go.mod");
        fs::write(&path, rendered).map_err(io("writing", &path))?;
        let _ = fs::remove_file(dir.join("go.sum"));
        let go = GoToolchain::for_module(dir)?;
        run_checked(go.command(dir).args(["mod", "tidy"]))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldflags_set_real_version() {
        let flags = kubernetes_ldflags(&KubernetesVersion::parse("v1.34.4").unwrap());
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.34.4"));
        assert!(flags.contains("-X k8s.io/component-base/version.gitMinor=34"));
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMajor=1"));
    }

    const UPSTREAM: &str = "module k8s.io/kubernetes\n\ngo 1.24.0\n\ngodebug default=go1.24\n\n\
        require (\n\tk8s.io/api v0.0.0\n)\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\
        \tk8s.io/kubelet => ./staging/src/k8s.io/kubelet\n\tgithub.com/x/y => github.com/x/y v1.0.0\n)\n";

    #[test]
    fn renders_staging_replaces_at_matching_tag() {
        let v = KubernetesVersion::parse("v1.35.4").unwrap();
        let out = render_kubernetes_go_mod(&v, UPSTREAM, Path::new("up.mod"), &[]).unwrap();
        assert!(out.contains("\tk8s.io/api => k8s.io/api v0.35.4\n"));
        assert!(out.contains("\tk8s.io/kubelet => k8s.io/kubelet v0.35.4\n"));
        assert!(!out.contains("github.com/x/y"));
        assert!(out.contains("require k8s.io/kubernetes v1.35.4"));
        assert!(out.contains("go 1.24.0\n"));
        assert!(out.contains("godebug default=go1.24\n"));
        assert_eq!(
            required_version(&out, "k8s.io/kubernetes").as_deref(),
            Some("v1.35.4")
        );
    }

    #[test]
    fn rejects_upstream_without_staging() {
        let v = KubernetesVersion::parse("v1.34.4").unwrap();
        assert!(render_kubernetes_go_mod(&v, "module x\n", Path::new("x"), &[]).is_err());
    }

    #[test]
    fn pre_releases_replace_staging_at_the_pre_release_tag() {
        let v = KubernetesVersion::parse("v1.38.0-beta.0").unwrap();
        let out = render_kubernetes_go_mod(&v, UPSTREAM, Path::new("up.mod"), &[]).unwrap();
        assert!(out.contains("\tk8s.io/api => k8s.io/api v0.38.0-beta.0\n"));
        assert!(out.contains("require k8s.io/kubernetes v1.38.0-beta.0"));
    }

    #[test]
    fn stand_ins_replace_only_what_upstream_requires() {
        let v = KubernetesVersion::parse("v1.38.0-beta.0").unwrap();
        let upstream = UPSTREAM.replace(
            "require (\n",
            "require (\n\tsigs.k8s.io/iptables-wrappers v1.0.0\n",
        );
        let stand_ins = [
            (
                "sigs.k8s.io/iptables-wrappers",
                "../../iptables-wrappers".to_string(),
            ),
            ("example.com/unused", "../../unused".to_string()),
        ];
        let out = render_kubernetes_go_mod(&v, &upstream, Path::new("up.mod"), &stand_ins).unwrap();
        assert!(out.contains("\tsigs.k8s.io/iptables-wrappers => ../../iptables-wrappers\n"));
        assert!(!out.contains("example.com/unused"));
        let committed = crate::paths::repo_root().join("e2e/go/kubernetes/v1.38");
        let paths = stand_in_paths(&committed);
        assert_eq!(paths[0].1, "../../../../e2e/go/iptables-wrappers");
        let elsewhere = stand_in_paths(Path::new("/tmp/aws-dra-wrapper"));
        assert!(Path::new(&elsewhere[0].1).is_absolute(), "{elsewhere:?}");
    }
}
