//! Building and locating the binaries the local cluster runs.
//!
//! Kubernetes, etcd and containerd are built from their Go modules through
//! small wrapper modules kept in the repository (`e2e/go/*`, one per
//! Kubernetes minor under `e2e/go/kubernetes/`; see [`crate::versions`]);
//! runc and the CNI plugins come from Debian packages. Everything built lands
//! in a cache keyed by version (default `~/.cache/aws-dra/`, override
//! `AWS_DRA_CACHE_DIR`), together with the Go module and build caches, so a
//! warm run only checks stamps ([`crate::go_build`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result, io};
use crate::go_build::{
    GoTarget, GoToolchain, KUBERNETES_COMMANDS, Progress, build_set, check_pin, kubernetes_ldflags,
    run_with_heartbeat, stand_ins_key,
};
use crate::image::{self, ImageSpec};
use crate::paths::which;
pub use crate::paths::{cache_root, repo_root};
use crate::process::run_checked;
use crate::versions::{KubernetesVersion, MAIN_MINOR, Release};

/// The version the demo and a plain `cargo xtask e2e` run: the pinned patch
/// of the main release ([`MAIN_MINOR`]).
pub fn default_kubernetes_version() -> KubernetesVersion {
    Release::for_minor(MAIN_MINOR).map_or(
        KubernetesVersion {
            major: 1,
            minor: MAIN_MINOR,
            patch: 0,
            pre: None,
        },
        Release::version,
    )
}
/// etcd pinned by `e2e/go/etcd/go.mod`.
pub const ETCD_VERSION: &str = "v3.6.16";
/// containerd pinned by `e2e/go/containerd/go.mod` (2.1.x supports 1.34 on CRI v1).
pub const CONTAINERD_VERSION: &str = "v2.1.9";

/// Image references the cluster uses; pods must name them exactly.
pub const PAUSE_IMAGE: &str = "localhost/aws-dra-e2e/pause:v1";
pub const PROBE_IMAGE: &str = "localhost/aws-dra-e2e/probe:v1";

/// Every executable and image archive a cluster needs, at absolute paths.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kubernetes_version: KubernetesVersion,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubelet: PathBuf,
    /// kubectl of the same release, for people (the demo prints commands using it).
    pub kubectl: PathBuf,
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
        kubectl: layout.kubernetes.join("kubectl"),
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
            ("kubectl", &self.kubectl),
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

/// Builds kubeadm and kube-proxy of `version` (the pinned patch of a
/// known release, from its committed wrapper module) into
/// `<cache>/bin/kind-node-<version>/`, for the offline kind node image; the
/// kubelet and kubectl it needs are those of [`ensure_built`]. Returns the
/// directory.
pub fn ensure_kind_node_built(
    version: &KubernetesVersion,
    progress: &mut Progress,
) -> Result<PathBuf> {
    let release = version.release()?;
    let module = repo_root().join(release.module_dir());
    if version.to_string() != release.pinned {
        return Err(Error::Testbed(format!(
            "the offline kind node image is built for pinned releases only ({}), not {version}",
            release.pinned
        )));
    }
    check_pin(&module, "k8s.io/kubernetes", &version.to_string())?;
    let ldflags = kubernetes_ldflags(version);
    let targets: Vec<GoTarget> = crate::go_build::KIND_NODE_COMMANDS
        .into_iter()
        .map(|name| GoTarget {
            name,
            package: format!("k8s.io/kubernetes/cmd/{name}"),
            // Both are static in upstream's release (KUBE_STATIC_BINARIES).
            cgo: false,
            ldflags: ldflags.clone(),
            tags: String::new(),
        })
        .collect();
    let out = cache_root()
        .join("bin")
        .join(format!("kind-node-{version}"));
    build_set(
        &GoToolchain::for_module(&module)?,
        "kind node",
        &module,
        &out,
        &targets,
        &stand_ins_key(&module)?,
        progress,
    )?;
    crate::go_build::prune_build_cache(&GoToolchain::find()?, progress);
    Ok(out)
}

/// Builds CoreDNS `tag` (the version kubeadm's addon names, `v1.14.6`)
/// from its committed wrapper module `e2e/go/coredns/<tag>/` into
/// `<cache>/bin/coredns-<tag>/coredns`, for the offline kind node image.
/// Static, as upstream's image ships it. Returns the binary.
pub fn ensure_coredns_built(tag: &str, progress: &mut Progress) -> Result<PathBuf> {
    let module = repo_root().join("e2e/go/coredns").join(tag);
    if !module.join("go.mod").exists() {
        return Err(Error::Testbed(format!(
            "kubeadm asks for CoreDNS {tag}, and there is no wrapper module for it at {} \
             (copy a sibling directory, set the require line, run go mod tidy)",
            module.display()
        )));
    }
    check_pin(&module, "github.com/coredns/coredns", tag)?;
    let out = cache_root().join("bin").join(format!("coredns-{tag}"));
    build_set(
        &GoToolchain::find()?,
        "coredns",
        &module,
        &out,
        &[GoTarget {
            name: "coredns",
            package: "github.com/coredns/coredns".into(),
            cgo: false,
            ldflags: "-s -w".into(),
            tags: String::new(),
        }],
        "",
        progress,
    )?;
    crate::go_build::prune_build_cache(&GoToolchain::find()?, progress);
    Ok(out.join("coredns"))
}

/// What to build and how to talk about it.
pub struct BuildOptions {
    pub kubernetes_version: KubernetesVersion,
    /// Install runc and the CNI plugins with apt-get when they are missing.
    pub install_host_packages: bool,
    /// Called with one human-readable line per step.
    pub progress: Progress,
    /// Empty the Go build cache once everything is built (see
    /// [`crate::go_build::prune_build_cache`]); `false` for a caller that
    /// builds more from the same module next (kind's node binaries reuse
    /// most of what the kubelet's build compiled) and empties it itself.
    pub prune_go_build_cache: bool,
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

    // Kubernetes: the committed wrapper of the release's pinned patch, a
    // generated one (in the cache) for any other patch.
    let release = version.release()?;
    let committed = repo_root().join(release.module_dir());
    let k8s_module = if version.to_string() == release.pinned && committed.join("go.sum").exists() {
        committed
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
    let k8s_targets: Vec<GoTarget> = KUBERNETES_COMMANDS
        .into_iter()
        .map(|name| GoTarget {
            name,
            package: format!("k8s.io/kubernetes/cmd/{name}"),
            // Upstream builds the kubelet with cgo when it can (it is not in
            // KUBE_STATIC_BINARIES); do the same so it behaves like a release kubelet.
            cgo: name == "kubelet",
            ldflags: ldflags.clone(),
            tags: String::new(),
        })
        .collect();
    // With the Go its go.mod asks for (1.38: Go 1.27, fetched once through
    // the proxy); etcd, containerd and the images keep the local Go, and so
    // their cached builds.
    let k8s_go = GoToolchain::for_module(&k8s_module)?;
    if k8s_go.version() != go.version() {
        progress(&format!("kubernetes {version}: with {}", k8s_go.version()));
    }
    build_set(
        &k8s_go,
        "kubernetes",
        &k8s_module,
        &layout.kubernetes,
        &k8s_targets,
        &stand_ins_key(&k8s_module)?,
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
        "",
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
        "",
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
        // The images module's sources are ours and change; hash them too.
        &images_source_hash()?,
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

    let binaries = Binaries::locate(&version)?;
    // Everything above is stamped now: what the compiler kept is not needed.
    if options.prune_go_build_cache {
        crate::go_build::prune_build_cache(&go, progress);
    }
    Ok(binaries)
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
fn ensure_host_packages(progress: &mut Progress) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::go_build::KIND_NODE_COMMANDS;
    use crate::go_build::required_version;
    use crate::versions::CI_RELEASES;

    /// Every stand-in for a module the proxy refuses passes its own Go
    /// tests (what it does is tested where it is written), with the Go its
    /// go.mod asks for.
    #[test]
    fn stand_ins_pass_their_go_tests() {
        for (module, rel) in crate::go_build::STAND_INS {
            let dir = repo_root().join(rel);
            let go = GoToolchain::for_module(&dir).unwrap();
            let _hold = crate::go_toolchain::hold_build_cache().unwrap();
            let out = go
                .command(&dir)
                .args(["test", "-count=1", "./..."])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "go test ./... of the stand-in for {module} in {}:\n{}{}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.contains("ok "), "no package tested: {stdout}");
        }
    }

    /// Each committed wrapper must replace every staging module of its
    /// release at the pinned patch (a partial list builds a mix of versions
    /// silently) and list every command we build.
    #[test]
    fn committed_kubernetes_modules_match_their_pins() {
        for minor in CI_RELEASES {
            let release = Release::for_minor(minor).unwrap();
            let path = repo_root().join(release.module_dir()).join("go.mod");
            let text = fs::read_to_string(&path).unwrap();
            assert_eq!(
                required_version(&text, "k8s.io/kubernetes").as_deref(),
                Some(release.pinned),
                "{}",
                path.display()
            );
            let v = release.version();
            let replaces: Vec<&str> = text
                .lines()
                .filter(|l| l.trim_start().starts_with("k8s.io/") && l.contains("=>"))
                .collect();
            assert!(replaces.len() >= 31, "{replaces:#?}");
            for line in replaces {
                assert!(line.trim_end().ends_with(&v.staging_version()), "{line}");
            }
            for command in KUBERNETES_COMMANDS.iter().chain(&KIND_NODE_COMMANDS) {
                assert!(
                    text.contains(&format!("\tk8s.io/kubernetes/cmd/{command}\n")),
                    "{} lacks {command}",
                    path.display()
                );
            }
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
