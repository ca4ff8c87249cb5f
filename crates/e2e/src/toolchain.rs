//! Building and locating the binaries the local cluster runs.
//!
//! Kubernetes, etcd and containerd are built from their Go modules through
//! small wrapper modules kept in the repository (`e2e/go/*`); runc and the CNI
//! plugins come from Debian packages. Everything built lands in a cache keyed
//! by version (default `~/.cache/aws-dra/`, override `AWS_DRA_CACHE_DIR`),
//! together with the Go module and build caches, so a warm run only checks
//! stamps. A stamp file records exactly what produced a directory (versions,
//! hash of the wrapper module, Go version, flags): if anything changes the
//! directory is rebuilt, never half-reused.
//!
//! Builds run one at a time with `go build -p 2`: the machines this runs on
//! are small and shared.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result, io};
use crate::image::{self, ImageSpec};
use crate::process::run_checked;

/// The Kubernetes release the committed wrapper module pins: the newest
/// v1.34.x patch the Go proxy served when it was generated. 1.34 is the oldest
/// release we support and the first that serves `resource.k8s.io/v1`.
pub const DEFAULT_KUBERNETES_VERSION: &str = "v1.34.4";
/// etcd pinned by `e2e/go/etcd/go.mod`.
pub const ETCD_VERSION: &str = "v3.6.16";
/// containerd pinned by `e2e/go/containerd/go.mod` (2.1.x supports 1.34 on CRI v1).
pub const CONTAINERD_VERSION: &str = "v2.1.9";

/// Image references the cluster uses; pods must name them exactly.
pub const PAUSE_IMAGE: &str = "localhost/aws-dra-e2e/pause:v1";
pub const PROBE_IMAGE: &str = "localhost/aws-dra-e2e/probe:v1";

/// A Kubernetes release `vMAJOR.MINOR.PATCH`, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubernetesVersion {
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || Error::BadVersion(text.to_string());
        let rest = text.strip_prefix('v').ok_or_else(bad)?;
        let mut parts = rest.split('.');
        let mut next = || -> Result<u32> {
            parts
                .next()
                .ok_or_else(bad)?
                .parse::<u32>()
                .map_err(|_| bad())
        };
        let version = Self {
            major: next()?,
            minor: next()?,
            patch: next()?,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(version)
    }

    /// The `v0.MINOR.PATCH` tag of the staging modules that ship with this release.
    pub fn staging_version(&self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }
}

impl std::fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Root of the repository, where the wrapper Go modules live.
pub fn repo_root() -> PathBuf {
    // crates/e2e → repository root; this is a developer tool run from a checkout.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cache root: `$AWS_DRA_CACHE_DIR`, else `$HOME/.cache/aws-dra`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("AWS_DRA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/aws-dra")
}

/// Every executable and image archive a cluster needs, at absolute paths.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kubernetes_version: KubernetesVersion,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubelet: PathBuf,
    pub etcd: PathBuf,
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    /// Directory holding `containerd-shim-runc-v2`; it goes first on containerd's PATH.
    pub containerd_bin_dir: PathBuf,
    pub runc: PathBuf,
    /// Directory of the CNI plugin binaries (Debian's containernetworking-plugins).
    pub cni_bin_dir: PathBuf,
    pub pause_image: PathBuf,
    pub probe_image: PathBuf,
}

struct Layout {
    kubernetes: PathBuf,
    etcd: PathBuf,
    containerd: PathBuf,
    images: PathBuf,
}

fn layout(version: &KubernetesVersion) -> Result<Layout> {
    let bin = cache_root().join("bin");
    Ok(Layout {
        kubernetes: bin.join(format!("kubernetes-{version}")),
        etcd: bin.join(format!("etcd-{ETCD_VERSION}")),
        containerd: bin.join(format!("containerd-{CONTAINERD_VERSION}")),
        images: bin.join(format!("images-{}", images_source_hash()?)),
    })
}

const CNI_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];

fn binaries_at(version: &KubernetesVersion, layout: &Layout) -> Binaries {
    let runc = which("runc").unwrap_or_else(|| PathBuf::from("/usr/sbin/runc"));
    let cni_bin_dir = CNI_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|d| d.join("host-local").exists())
        .unwrap_or_else(|| PathBuf::from(CNI_DIRS[0]));
    Binaries {
        kubernetes_version: version.clone(),
        kube_apiserver: layout.kubernetes.join("kube-apiserver"),
        kube_controller_manager: layout.kubernetes.join("kube-controller-manager"),
        kube_scheduler: layout.kubernetes.join("kube-scheduler"),
        kubelet: layout.kubernetes.join("kubelet"),
        etcd: layout.etcd.join("etcd"),
        containerd: layout.containerd.join("containerd"),
        ctr: layout.containerd.join("ctr"),
        containerd_bin_dir: layout.containerd.clone(),
        runc,
        cni_bin_dir,
        pause_image: layout.images.join("pause.oci.tar"),
        probe_image: layout.images.join("probe.oci.tar"),
    }
}

impl Binaries {
    /// Finds everything built for `version` without building; names the first
    /// missing piece (and the command that builds it) otherwise.
    pub fn locate(version: &KubernetesVersion) -> Result<Self> {
        let layout = layout(version)?;
        let binaries = binaries_at(version, &layout);
        for (what, path) in binaries.all() {
            if !path.exists() {
                return Err(Error::MissingBinary {
                    what: what.to_string(),
                    path: path.clone(),
                });
            }
        }
        Ok(binaries)
    }

    fn all(&self) -> Vec<(&'static str, &PathBuf)> {
        vec![
            ("kube-apiserver", &self.kube_apiserver),
            ("kube-controller-manager", &self.kube_controller_manager),
            ("kube-scheduler", &self.kube_scheduler),
            ("kubelet", &self.kubelet),
            ("etcd", &self.etcd),
            ("containerd", &self.containerd),
            ("ctr", &self.ctr),
            ("runc", &self.runc),
            ("CNI plugins", &self.cni_bin_dir),
            ("pause image", &self.pause_image),
            ("probe image", &self.probe_image),
        ]
    }
}

/// What to build and how to talk about it.
pub struct BuildOptions {
    pub kubernetes_version: KubernetesVersion,
    /// Install runc and the CNI plugins with apt-get when they are missing.
    pub install_host_packages: bool,
    /// Called with one human-readable line per step.
    pub progress: Box<dyn FnMut(&str) + Send>,
}

/// Builds whatever is missing for `options.kubernetes_version` and returns
/// where everything is. A warm cache makes this a few stamp reads.
pub fn ensure_built(mut options: BuildOptions) -> Result<Binaries> {
    let version = options.kubernetes_version.clone();
    let layout = layout(&version)?;
    let go = GoToolchain::find()?;
    let progress = &mut options.progress;

    if options.install_host_packages {
        ensure_host_packages(progress)?;
    }

    // Kubernetes: the committed wrapper for the pinned release, a generated one otherwise.
    let k8s_module = if version.to_string() == DEFAULT_KUBERNETES_VERSION {
        repo_root().join("e2e/go/kubernetes")
    } else {
        let dir = cache_root().join(format!("src/kubernetes-{version}"));
        if !dir.join("go.sum").exists() {
            progress(&format!(
                "generating wrapper module for k8s.io/kubernetes {version} in {}",
                dir.display()
            ));
            go.generate(&version, &dir)?;
        }
        dir
    };
    check_pin(&k8s_module, "k8s.io/kubernetes", &version.to_string())?;
    let ldflags = kubernetes_ldflags(&version);
    let k8s_targets: Vec<GoTarget> = [
        ("kube-apiserver", false),
        ("kube-controller-manager", false),
        ("kube-scheduler", false),
        // Upstream builds the kubelet with cgo when it can (it is not in
        // KUBE_STATIC_BINARIES); do the same so it behaves like a release kubelet.
        ("kubelet", true),
    ]
    .into_iter()
    .map(|(name, cgo)| GoTarget {
        name,
        package: format!("k8s.io/kubernetes/cmd/{name}"),
        cgo,
        ldflags: ldflags.clone(),
        tags: String::new(),
    })
    .collect();
    build_set(
        &go,
        "kubernetes",
        &k8s_module,
        &layout.kubernetes,
        &k8s_targets,
        progress,
    )?;

    let etcd_module = repo_root().join("e2e/go/etcd");
    check_pin(&etcd_module, "go.etcd.io/etcd/server/v3", ETCD_VERSION)?;
    let etcd_targets = [GoTarget {
        name: "etcd",
        package: ".".to_string(),
        cgo: false,
        ldflags: "-s -w".to_string(),
        tags: String::new(),
    }];
    build_set(
        &go,
        "etcd",
        &etcd_module,
        &layout.etcd,
        &etcd_targets,
        progress,
    )?;

    let containerd_module = repo_root().join("e2e/go/containerd");
    check_pin(
        &containerd_module,
        "github.com/containerd/containerd/v2",
        CONTAINERD_VERSION,
    )?;
    let containerd_ldflags = format!(
        "-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION} \
         -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
    );
    // Snapshotters that need C libraries we do not have are left out, as kind does.
    let containerd_tags = "no_btrfs no_devmapper no_zfs no_aufs".to_string();
    let containerd_targets: Vec<GoTarget> = [
        ("containerd", true),
        ("ctr", true),
        // Upstream builds the shim static without cgo.
        ("containerd-shim-runc-v2", false),
    ]
    .into_iter()
    .map(|(name, cgo)| GoTarget {
        name,
        package: format!("github.com/containerd/containerd/v2/cmd/{name}"),
        cgo,
        ldflags: containerd_ldflags.clone(),
        tags: containerd_tags.clone(),
    })
    .collect();
    build_set(
        &go,
        "containerd",
        &containerd_module,
        &layout.containerd,
        &containerd_targets,
        progress,
    )?;

    let images_module = repo_root().join("e2e/go/images");
    let image_targets: Vec<GoTarget> = ["pause", "probe"]
        .into_iter()
        .map(|name| GoTarget {
            name,
            package: format!("./{name}"),
            cgo: false,
            ldflags: "-s -w".to_string(),
            tags: String::new(),
        })
        .collect();
    build_set(
        &go,
        "images",
        &images_module,
        &layout.images,
        &image_targets,
        progress,
    )?;
    for (name, reference, archive) in [
        ("pause", PAUSE_IMAGE, "pause.oci.tar"),
        ("probe", PROBE_IMAGE, "probe.oci.tar"),
    ] {
        let out = layout.images.join(archive);
        if !out.exists() {
            image::write_archive(
                &ImageSpec {
                    reference: reference.to_string(),
                    binary: layout.images.join(name),
                    entrypoint: format!("/{name}"),
                    files: vec![],
                },
                &out,
            )?;
            progress(&format!("packed {reference} into {}", out.display()));
        }
    }

    Binaries::locate(&version)
}

struct GoTarget {
    name: &'static str,
    package: String,
    cgo: bool,
    ldflags: String,
    tags: String,
}

struct GoToolchain {
    go: PathBuf,
    version: String,
}

impl GoToolchain {
    fn find() -> Result<Self> {
        let go = std::env::var_os("AWS_DRA_GO")
            .map(PathBuf::from)
            .or_else(|| {
                let default = PathBuf::from("/usr/local/go/bin/go");
                default.exists().then_some(default)
            })
            .or_else(|| which("go"))
            .ok_or_else(|| Error::MissingBinary {
                what: "go toolchain (set AWS_DRA_GO)".into(),
                path: PathBuf::from("/usr/local/go/bin/go"),
            })?;
        let out = run_checked(Command::new(&go).arg("version"))?;
        Ok(Self {
            go,
            version: out.trim().to_string(),
        })
    }

    fn command(&self, module_dir: &Path) -> Command {
        let cache = cache_root().join("go");
        let mut cmd = Command::new(&self.go);
        cmd.current_dir(module_dir)
            .env("GOMODCACHE", cache.join("mod"))
            .env("GOCACHE", cache.join("build"))
            // Reproducible paths, and no VCS stamping (worktrees confuse it).
            .env("GOFLAGS", "-trimpath -buildvcs=false")
            // Never fetch another toolchain: the go directive must fit the local one.
            .env("GOTOOLCHAIN", "local");
        cmd
    }
}

/// Builds `targets` of one wrapper module into `out_dir`, unless its stamp
/// already matches.
fn build_set(
    go: &GoToolchain,
    label: &str,
    module_dir: &Path,
    out_dir: &Path,
    targets: &[GoTarget],
    progress: &mut Box<dyn FnMut(&str) + Send>,
) -> Result<()> {
    let mut key = Sha256::new();
    key.update(go.version.as_bytes());
    for file in ["go.mod", "go.sum"] {
        let path = module_dir.join(file);
        if path.exists() {
            key.update(fs::read(&path).map_err(io("reading", &path))?);
        }
    }
    // The images module's sources are ours and change; hash them too.
    if label == "images" {
        key.update(images_source_hash()?.as_bytes());
    }
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

/// Runs a long command, forwarding its output lines (Go prints only errors
/// and downloads) and printing a heartbeat every 30 s so a cold build is
/// visibly alive.
fn run_with_heartbeat(
    cmd: &mut Command,
    name: &str,
    progress: &mut Box<dyn FnMut(&str) + Send>,
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
fn check_pin(dir: &Path, module: &str, expected: &str) -> Result<()> {
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
pub fn render_kubernetes_go_mod(
    version: &KubernetesVersion,
    upstream_go_mod: &str,
    upstream_path: &Path,
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
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
    ] {
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
    out.push_str(")\n");
    Ok(out)
}

/// Writes and tidies a wrapper module for `version` into `dir` (needs the Go
/// module proxy). `cargo xtask k8s gen-module` uses this to move the pin.
pub fn generate_kubernetes_module(version: &KubernetesVersion, dir: &Path) -> Result<()> {
    GoToolchain::find()?.generate(version, dir)
}

impl GoToolchain {
    fn generate(&self, version: &KubernetesVersion, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let json = run_checked(
            self.command(dir)
                .args(["mod", "download", "-json"])
                .arg(format!("k8s.io/kubernetes@{version}"))
                // Outside any module: `go mod download` needs none for a path@version.
                .env("GO111MODULE", "on")
                .env("GOFLAGS", "-mod=mod"),
        )?;
        let info: BTreeMap<String, serde_json::Value> =
            serde_json::from_str(&json).map_err(|source| Error::Json {
                what: format!("go mod download output for {version}"),
                source,
            })?;
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
        let rendered = render_kubernetes_go_mod(version, &upstream, &gomod_path)?;
        let path = dir.join("go.mod");
        fs::write(&path, rendered).map_err(io("writing", &path))?;
        let _ = fs::remove_file(dir.join("go.sum"));
        run_checked(self.command(dir).args(["mod", "tidy"]))?;
        Ok(())
    }
}

fn images_source_hash() -> Result<String> {
    let dir = repo_root().join("e2e/go/images");
    let mut hash = Sha256::new();
    for file in ["go.mod", "pause/main.go", "probe/main.go"] {
        let path = dir.join(file);
        hash.update(file.as_bytes());
        hash.update(fs::read(&path).map_err(io("reading", &path))?);
    }
    hash.update(image::FORMAT_REVISION.as_bytes());
    Ok(hex::encode(&hash.finalize()[..8]))
}

/// runc and the CNI plugins come from Debian packages (runc needs cgo and
/// libseccomp; the packages are built that way already).
fn ensure_host_packages(progress: &mut Box<dyn FnMut(&str) + Send>) -> Result<()> {
    let have_runc = which("runc").is_some();
    let have_cni = CNI_DIRS
        .iter()
        .any(|d| Path::new(d).join("host-local").exists());
    if have_runc && have_cni {
        return Ok(());
    }
    let mut packages = Vec::new();
    if !have_runc {
        packages.push("runc");
    }
    if !have_cni {
        packages.push("containernetworking-plugins");
    }
    for p in &packages {
        let policy = run_checked(Command::new("apt-cache").args(["policy", p]))?;
        if !policy.contains("Candidate:") || policy.contains("Candidate: (none)") {
            return Err(Error::Host(format!(
                "apt has no candidate for {p}:\n{policy}"
            )));
        }
    }
    progress(&format!("apt-get install -y {}", packages.join(" ")));
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run_with_heartbeat(&mut cmd, "apt-get", progress)
}

pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions() {
        for (text, ok) in [
            ("v1.34.4", true),
            ("v1.37.2", true),
            ("1.34.4", false),
            ("v1.34", false),
            ("v1.34.4.1", false),
            ("v1.x.4", false),
        ] {
            assert_eq!(KubernetesVersion::parse(text).is_ok(), ok, "{text}");
        }
        let v = KubernetesVersion::parse("v1.34.4").unwrap();
        assert_eq!(v.staging_version(), "v0.34.4");
        assert_eq!(v.to_string(), "v1.34.4");
    }

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
        let out = render_kubernetes_go_mod(&v, UPSTREAM, Path::new("up.mod")).unwrap();
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
        assert!(render_kubernetes_go_mod(&v, "module x\n", Path::new("x")).is_err());
    }

    /// The committed wrapper must replace all 31 staging modules of 1.34 at
    /// the pinned patch; a partial list builds a mix of versions silently.
    #[test]
    fn committed_kubernetes_module_matches_pin() {
        let text = fs::read_to_string(repo_root().join("e2e/go/kubernetes/go.mod")).unwrap();
        assert_eq!(
            required_version(&text, "k8s.io/kubernetes").as_deref(),
            Some(DEFAULT_KUBERNETES_VERSION)
        );
        let v = KubernetesVersion::parse(DEFAULT_KUBERNETES_VERSION).unwrap();
        let replaces: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("k8s.io/") && l.contains("=>"))
            .collect();
        assert_eq!(replaces.len(), 31, "{replaces:#?}");
        for line in replaces {
            assert!(line.trim_end().ends_with(&v.staging_version()), "{line}");
        }
        let etcd = fs::read_to_string(repo_root().join("e2e/go/etcd/go.mod")).unwrap();
        assert_eq!(
            required_version(&etcd, "go.etcd.io/etcd/server/v3").as_deref(),
            Some(ETCD_VERSION)
        );
        let containerd = fs::read_to_string(repo_root().join("e2e/go/containerd/go.mod")).unwrap();
        assert_eq!(
            required_version(&containerd, "github.com/containerd/containerd/v2").as_deref(),
            Some(CONTAINERD_VERSION)
        );
    }
}
