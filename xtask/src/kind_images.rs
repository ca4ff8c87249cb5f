//! Images `cargo xtask e2e --cluster kind` builds on the machine, so the
//! kind path needs no image registry (`--kind-images offline`, the default):
//!
//! - the Dockerfile's local base images ([`crate::base_images`]);
//! - the kind node image of a Kubernetes version ([`node_image`]): Debian
//!   with systemd, iptables, runc and the CNI plugins (Debian packages),
//!   kind's own base-image files (entrypoint, systemd units, containerd
//!   config, from the `sigs.k8s.io/kind` module), containerd, kubelet,
//!   kubectl, kubeadm and kube-proxy built from their Go modules, and the
//!   images kubeadm runs (kube-apiserver, kube-controller-manager,
//!   kube-scheduler, etcd, kube-proxy, CoreDNS, pause) preloaded into the
//!   node's containerd, each assembled here from those binaries (CoreDNS
//!   from its own wrapper module, `e2e/go/coredns/<version>`).
//!
//! Each is built once and found again by its tag (the node image's tag
//! carries a hash of everything that goes into it); `docker image rm` forces
//! a rebuild. Limit: the CNI is kind-less: [`crate::kind_network`] wires
//! the pod routes itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::base_images::{DEBIAN_IMAGE, ensure_debian};
use crate::docker;

/// Debian packages of the node image (kind's base image has the same set,
/// less what only rootless or storage tests use), plus runc and the CNI
/// plugins, which kind builds from source.
pub const NODE_PACKAGES: &[&str] = &[
    "systemd",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "e2fsprogs",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
    "runc",
    "containernetworking-plugins",
];
/// The entrypoint kind's node containers start with.
const NODE_ENTRYPOINT: &str = r#"["/usr/local/bin/entrypoint", "/sbin/init"]"#;

fn work_root() -> PathBuf {
    local_cluster::toolchain::cache_root().join("kind-images")
}

/// The images kubeadm of `version` runs (`kubeadm config images list`).
fn kubeadm_images(kubeadm: &Path, version: &str) -> Result<Vec<String>> {
    let out = docker::output(
        "kubeadm config images list",
        Command::new(kubeadm).args(["config", "images", "list", "--kubernetes-version", version]),
    )?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The CoreDNS version (`v1.14.6`) kubeadm of `version` deploys as its DNS
/// addon, from `kubeadm config images list`.
pub fn coredns_tag(kubeadm: &Path, version: &str) -> Result<String> {
    kubeadm_images(kubeadm, version)?
        .iter()
        .find(|r| image_component(r) == "coredns")
        .and_then(|r| r.rsplit_once(':').map(|(_, tag)| tag.to_string()))
        .context("kubeadm config images list names no CoreDNS image")
}

/// The binary `kubeadm`'s image `reference` runs, by its repository name.
fn image_component(reference: &str) -> &str {
    let repo = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
    repo.rsplit('/').next().unwrap_or(repo)
}

/// Everything the node image of `version` is made of.
pub struct NodeInputs<'a> {
    pub version: &'a e2e::KubernetesVersion,
    /// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd, containerd.
    pub binaries: &'a e2e::Binaries,
    /// kubeadm and kube-proxy.
    pub kind_node_dir: &'a Path,
    /// `images/base/files` of the kind module.
    pub kind_base_files: &'a Path,
    /// The pause binary the cached pause image was made of.
    pub pause_binary: &'a Path,
    /// CoreDNS of the version kubeadm deploys.
    pub coredns_binary: &'a Path,
}

fn file_hash(h: &mut Sha256, path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    h.update(format!("{}|{}|{mtime}\n", path.display(), meta.len()).as_bytes());
    Ok(())
}

/// `aws-dra-local/kind-node:<version>-<hash of the inputs>`.
pub fn node_image(inputs: &NodeInputs) -> Result<String> {
    let b = inputs.binaries;
    let mut h = Sha256::new();
    h.update(NODE_PACKAGES.join(" ").as_bytes());
    h.update(NODE_DOCKERFILE_REVISION.as_bytes());
    // The node's runc wrapper (it depends on what this host withholds).
    h.update(node_runc_wrapper().unwrap_or_default().as_bytes());
    for p in [
        &b.kube_apiserver,
        &b.kube_controller_manager,
        &b.kube_scheduler,
        &b.kubelet,
        &b.kubectl,
        &b.etcd,
        &b.containerd,
        &b.ctr,
        &b.containerd_bin_dir.join("containerd-shim-runc-v2"),
        &inputs.kind_node_dir.join("kubeadm"),
        &inputs.kind_node_dir.join("kube-proxy"),
        &inputs.kind_base_files.join("usr/local/bin/entrypoint"),
        &inputs.pause_binary.to_path_buf(),
        &inputs.coredns_binary.to_path_buf(),
    ] {
        file_hash(&mut h, p)?;
    }
    let hash = hex::encode(h.finalize());
    Ok(format!(
        "aws-dra-local/kind-node:{}-{}",
        inputs.version,
        &hash[..12]
    ))
}

/// The runc wrapper of the node image, where this host withholds
/// capabilities from its containers (see [`ensure_node`]).
fn node_runc_wrapper() -> Option<String> {
    let withheld = docker::withheld_capabilities();
    (!withheld.is_empty()).then(|| docker::runc_wrapper(Path::new("/usr/sbin/runc"), &withheld))
}

/// Bumped whenever the node image's recipe below changes.
const NODE_DOCKERFILE_REVISION: &str = "node-2";

fn node_dockerfile(version: &str) -> String {
    let packages = NODE_PACKAGES.join(" ");
    format!(
        "FROM {DEBIAN_IMAGE}\n\
RUN apt-get update \\\n \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {packages} \\\n \
 && rm -rf /var/lib/apt/lists/* \\\n \
 && find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete \\\n \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\\n \
    /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\\n \
    /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \\\n \
 && echo ReadKMsg=no >> /etc/systemd/journald.conf \\\n \
 && ln -sf /usr/lib/systemd/systemd /sbin/init \\\n \
 && mkdir -p /opt/cni/bin /etc/kubernetes/manifests /kind \\\n \
 && ln -s /usr/lib/cni/* /opt/cni/bin/\n\
COPY kind-base/ /\n\
COPY bin/ /usr/local/bin/\n\
COPY k8s/ /usr/bin/\n\
RUN chmod 0755 /kind /kind/bin /kind/bin/* /usr/local/bin/* \\\n \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\\n \
 && systemctl mask systemd-binfmt.service \\\n \
 && ctr oci spec \\\n \
    | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {{\"path\": \"/kind/bin/mount-product-files.sh\"}}' \\\n \
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\\n \
 && echo {version} > /kind/version\n\
ENV container=docker\n\
STOPSIGNAL SIGRTMIN+3\n\
ENTRYPOINT {NODE_ENTRYPOINT}\n"
    )
}

fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Copies a tree out of the Go module cache, whose files and directories
/// are read-only: the copy is made writable so that it can be removed.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    docker::run(
        &format!("copying {}", from.display()),
        Command::new("cp").arg("-rT").arg(from).arg(to),
    )?;
    docker::run(
        "making the copy writable",
        Command::new("chmod").arg("-R").arg("u+w").arg(to),
    )
}

/// The image archives preloaded into the node: one per image kubeadm runs,
/// plus containerd's sandbox image of kind's config.
fn write_node_archives(inputs: &NodeInputs, kubeadm: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let b = inputs.binaries;
    let mut references = kubeadm_images(kubeadm, &inputs.version.to_string())?;
    // kind's containerd config names its own pause tag as the sandbox image.
    let config =
        std::fs::read_to_string(inputs.kind_base_files.join("etc/containerd/config.toml"))?;
    if let Some(sandbox) = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("sandbox_image = "))
    {
        references.push(sandbox.trim_matches('"').to_string());
    }
    for reference in references {
        let component = image_component(&reference);
        let binary = match component {
            "kube-apiserver" => b.kube_apiserver.clone(),
            "kube-controller-manager" => b.kube_controller_manager.clone(),
            "kube-scheduler" => b.kube_scheduler.clone(),
            "etcd" => b.etcd.clone(),
            "pause" => inputs.pause_binary.to_path_buf(),
            "kube-proxy" => {
                kube_proxy_archive(inputs, &reference, &dir.join("kube-proxy.tar"))?;
                continue;
            }
            "coredns" => inputs.coredns_binary.to_path_buf(),
            other => {
                bail!("kubeadm wants an image this build does not make: {other} ({reference})")
            }
        };
        let file = dir.join(format!("{}.oci.tar", reference.replace(['/', ':'], "_")));
        // The command kubeadm's manifests give is the bare name (`etcd`,
        // `kube-apiserver`): the image's PATH is `/`.
        local_cluster::image::write_archive(
            &local_cluster::image::ImageSpec {
                reference: reference.clone(),
                binary,
                entrypoint: format!("/{component}"),
                files: vec![],
            },
            &file,
        )?;
    }
    Ok(())
}

/// kube-proxy needs iptables and conntrack beside it: Debian plus the
/// binary, built by Docker and saved as an archive.
fn kube_proxy_archive(inputs: &NodeInputs, reference: &str, out: &Path) -> Result<()> {
    let ctx = work_root().join("kube-proxy-context");
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx)?;
    }
    std::fs::create_dir_all(&ctx)?;
    link_or_copy(
        &inputs.kind_node_dir.join("kube-proxy"),
        &ctx.join("kube-proxy"),
    )?;
    std::fs::write(
        ctx.join("Dockerfile"),
        format!(
            "FROM {DEBIAN_IMAGE}\n\
             RUN apt-get update \\\n \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables nftables conntrack kmod \\\n \
             && rm -rf /var/lib/apt/lists/*\n\
             COPY kube-proxy /usr/local/bin/kube-proxy\n"
        ),
    )?;
    docker::run(
        &format!("docker build {reference}"),
        docker::build_command()?.arg("-t").arg(reference).arg(&ctx),
    )?;
    docker::run(
        "docker save kube-proxy",
        Command::new("docker")
            .args(["save", "-o"])
            .arg(out)
            .arg(reference),
    )?;
    std::fs::remove_dir_all(&ctx)?;
    Ok(())
}

/// Builds the node image of `inputs` unless the engine has it; returns its tag.
pub fn ensure_node(inputs: &NodeInputs) -> Result<String> {
    let image = node_image(inputs)?;
    if docker::has_image(&image) {
        eprintln!("==> kind node image {image}: cached");
        return Ok(image);
    }
    let started = Instant::now();
    ensure_debian()?;
    let b = inputs.binaries;
    let ctx = work_root().join(format!("node-{}", inputs.version));
    if ctx.exists() {
        std::fs::remove_dir_all(&ctx)?;
    }
    for sub in ["bin", "k8s", "kind-base", "images"] {
        std::fs::create_dir_all(ctx.join(sub))?;
    }
    copy_tree(inputs.kind_base_files, &ctx.join("kind-base"))?;
    // Only the node's files: kind's LICENSES/ and README stay out.
    let _ = std::fs::remove_dir_all(ctx.join("kind-base/LICENSES"));
    for (from, dir) in [
        (b.containerd.clone(), "bin"),
        (b.ctr.clone(), "bin"),
        (b.containerd_bin_dir.join("containerd-shim-runc-v2"), "bin"),
        (b.kubelet.clone(), "k8s"),
        (b.kubectl.clone(), "k8s"),
        (inputs.kind_node_dir.join("kubeadm"), "k8s"),
    ] {
        let name = from.file_name().context("binary without a name")?;
        link_or_copy(&from, &ctx.join(dir).join(name))?;
    }
    // A kind node gets no more capabilities than this host gives its
    // containers: where some are withheld, the node's containerd runs the
    // pods' containers through the same wrapper as the engine
    // (`/usr/local/bin/runc` comes before Debian's `/usr/sbin/runc` on
    // containerd's PATH). Without it no sandbox of a critical pod starts.
    if let Some(wrapper) = node_runc_wrapper() {
        std::fs::write(ctx.join("bin/runc"), wrapper)?;
    }
    write_node_archives(
        inputs,
        &inputs.kind_node_dir.join("kubeadm"),
        &ctx.join("images"),
    )?;
    std::fs::write(
        ctx.join("Dockerfile"),
        node_dockerfile(&inputs.version.to_string()),
    )?;
    std::fs::write(ctx.join(".dockerignore"), "images/\n")?;
    let stage = format!("{image}-stage");
    docker::run(
        "docker build (kind node, without images)",
        docker::build_command()?.arg("-t").arg(&stage).arg(&ctx),
    )?;
    preload(&stage, &image, &ctx.join("images"))?;
    let _ = Command::new("docker")
        .args(["image", "rm", &stage])
        .output();
    std::fs::remove_dir_all(&ctx)?;
    eprintln!(
        "==> kind node image {image}: built in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(image)
}

/// Imports the archives of `images` into the content store of `stage`'s
/// containerd (without unpacking: the node unpacks on first use, as kind's
/// own node images do) and commits the result as `image`.
fn preload(stage: &str, image: &str, images: &Path) -> Result<()> {
    let name = "aws-dra-kind-node-build";
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let images_s = images.to_str().context("cache path is not UTF-8")?;
    docker::run(
        "starting containerd in the node image",
        Command::new("docker").args([
            "run",
            "-d",
            "--privileged",
            "--name",
            name,
            "-v",
            &format!("{images_s}:/kind/images:ro"),
            "--entrypoint",
            "/usr/local/bin/containerd",
            stage,
        ]),
    )?;
    let result = (|| -> Result<()> {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while !Command::new("docker")
            .args(["exec", name, "ctr", "version"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            if Instant::now() > deadline {
                bail!("containerd in the node image did not answer within 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        let mut archives: Vec<_> = std::fs::read_dir(images)?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        archives.sort();
        for file in archives {
            let file = file.to_string_lossy().into_owned();
            docker::run(
                &format!("ctr images import {file}"),
                Command::new("docker").args([
                    "exec",
                    name,
                    "ctr",
                    "--namespace",
                    "k8s.io",
                    "images",
                    "import",
                    "--all-platforms",
                    "--no-unpack",
                    "--digests",
                    &format!("/kind/images/{file}"),
                ]),
            )?;
        }
        let listed = docker::output(
            "ctr images ls",
            Command::new("docker")
                .args(["exec", name, "ctr", "-n", "k8s.io", "images", "ls", "-q"]),
        )?;
        eprintln!("    preloaded:\n{listed}");
        docker::run(
            "stopping containerd",
            Command::new("docker").args(["stop", name]),
        )?;
        docker::run(
            &format!("docker commit {image}"),
            Command::new("docker").args([
                "commit",
                "--change",
                &format!("ENTRYPOINT {NODE_ENTRYPOINT}"),
                "--change",
                "CMD []",
                name,
                image,
            ]),
        )
    })();
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_references_map_to_components() {
        assert_eq!(
            image_component("registry.k8s.io/kube-apiserver:v1.37.2"),
            "kube-apiserver"
        );
        assert_eq!(image_component("registry.k8s.io/etcd:3.6.5-0"), "etcd");
        assert_eq!(
            image_component("registry.k8s.io/coredns/coredns:v1.12.1"),
            "coredns"
        );
        assert_eq!(image_component("registry.k8s.io/pause:3.10.1"), "pause");
    }

    #[test]
    fn the_node_dockerfile_enables_kinds_units_and_keeps_its_entrypoint() {
        let d = node_dockerfile("v1.37.2");
        assert!(d.starts_with(&format!("FROM {DEBIAN_IMAGE}\n")), "{d}");
        assert!(
            d.contains("systemctl enable kubelet.service containerd.service"),
            "{d}"
        );
        assert!(d.contains("echo v1.37.2 > /kind/version"), "{d}");
        assert!(d.contains(&format!("ENTRYPOINT {NODE_ENTRYPOINT}")), "{d}");
        for p in ["runc", "containernetworking-plugins", "systemd", "iptables"] {
            assert!(d.contains(p), "{p} missing: {d}");
        }
    }
}
