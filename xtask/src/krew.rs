//! `cargo xtask krew-manifest`: the krew plugin manifest of `kubectl dra`,
//! filled from the release archives themselves.
//!
//! Krew installs a plugin by downloading the archive a manifest names and
//! refusing it unless its sha256 matches, then linking the `bin` it names
//! out of the unpacked files. So the manifest must be written from the very
//! archives that are published: this reads each one, takes its digest, checks
//! that it holds the binary (and the licence) where the manifest says, and
//! fills the template `crates/kubectl-dra/krew/dra.yaml`. The result is
//! checked against krew's own rules before it is written.
//!
//! Archives are named `kubectl-dra_<version>_<os>_<arch>.tar.gz`, the binary
//! at the archive's top level; that is all the release step has to follow.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use sha2::{Digest as _, Sha256};

use crate::paths::repo_root;

const TEMPLATE: &str = "crates/kubectl-dra/krew/dra.yaml";
const BINARY: &str = "kubectl-dra";
const LICENSE: &str = "LICENSE";

#[derive(clap::Args)]
pub struct KrewArgs {
    /// The release version, as krew wants it: semver with a leading v (v0.1.0).
    #[arg(long)]
    version: String,
    /// Where the archives are published: each URI is BASE_URL/ARCHIVE-FILE-NAME
    /// (e.g. `https://github.com/aws-dra/aws-dra-drivers/releases/download/v0.1.0`).
    #[arg(long)]
    base_url: String,
    /// Write the manifest to this file (default: standard output).
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// The release archives, `kubectl-dra_<version>_<os>_<arch>.tar.gz`.
    #[arg(required = true)]
    archives: Vec<PathBuf>,
}

/// One platform's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub uri: String,
    pub sha256: String,
    /// The binary's name inside the archive (`.exe` on Windows).
    pub bin: String,
    pub has_license: bool,
}

pub fn run(args: KrewArgs) -> Result<()> {
    let template_path = repo_root().join(TEMPLATE);
    let template = std::fs::read_to_string(&template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let platforms = args
        .archives
        .iter()
        .map(|a| platform(a, &args.version, &args.base_url))
        .collect::<Result<Vec<_>>>()?;
    let manifest = render(&template, &args.version, &platforms)?;
    check(&manifest).context("the generated manifest breaks krew's rules")?;
    match &args.output {
        Some(path) => std::fs::write(path, &manifest)
            .with_context(|| format!("writing {}", path.display()))?,
        None => print!("{manifest}"),
    }
    Ok(())
}

/// `(os, arch)` from `kubectl-dra_<version>_<os>_<arch>.tar.gz`.
fn os_arch(file_name: &str, version: &str) -> Result<(String, String)> {
    let prefix = format!("{BINARY}_{version}_");
    let rest = file_name
        .strip_prefix(&prefix)
        .and_then(|r| r.strip_suffix(".tar.gz"))
        .with_context(|| {
            format!("archive {file_name:?} is not named {prefix}<os>_<arch>.tar.gz")
        })?;
    let (os, arch) = rest
        .split_once('_')
        .with_context(|| format!("archive {file_name:?}: no _<arch> after the OS"))?;
    ensure!(
        ["linux", "darwin", "windows"].contains(&os),
        "archive {file_name:?}: OS {os:?} is not one krew knows (linux, darwin, windows)"
    );
    ensure!(
        ["amd64", "arm64"].contains(&arch),
        "archive {file_name:?}: architecture {arch:?} is not amd64 or arm64"
    );
    Ok((os.to_string(), arch.to_string()))
}

/// Reads an archive: its platform, digest and whether it holds the binary.
pub fn platform(path: &Path, version: &str, base_url: &str) -> Result<Platform> {
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: no file name", path.display()))?;
    let (os, arch) = os_arch(file_name, version)?;
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let mut names = BTreeSet::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    for entry in tar
        .entries()
        .with_context(|| format!("{}: not a gzip-compressed tar archive", path.display()))?
    {
        let entry = entry.with_context(|| format!("{}: unreadable entry", path.display()))?;
        let name = entry
            .path()
            .with_context(|| format!("{}: entry without a path", path.display()))?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        names.insert(name);
    }
    let bin = if os == "windows" {
        format!("{BINARY}.exe")
    } else {
        BINARY.to_string()
    };
    if !names.contains(&bin) {
        bail!(
            "{}: no {bin} at the top of the archive (it holds: {}); krew links the binary from there",
            path.display(),
            names.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(Platform {
        uri: format!("{}/{file_name}", base_url.trim_end_matches('/')),
        os,
        arch,
        sha256,
        has_license: names.contains(LICENSE),
        bin,
    })
}

/// The template with `${VERSION}` and `${PLATFORMS}` filled.
pub fn render(template: &str, version: &str, platforms: &[Platform]) -> Result<String> {
    ensure!(
        template.matches("${VERSION}").count() == 1
            && template.matches("${PLATFORMS}\n").count() == 1
            && template.matches("${PLATFORMS}").count() == 1,
        "{TEMPLATE} must hold ${{VERSION}} once and ${{PLATFORMS}} once, on a line of its own"
    );
    ensure!(!platforms.is_empty(), "no archives given");
    // Digests and URIs quoted: an all-digit (or `1e5`-like) sha256 would
    // otherwise read back as a number.
    let mut entries = String::new();
    for p in platforms {
        entries.push_str(&format!(
            "  - selector:\n      matchLabels:\n        os: {}\n        arch: {}\n    uri: \"{}\"\n    sha256: \"{}\"\n    bin: {}\n    files:\n      - from: {}\n        to: .\n",
            p.os, p.arch, p.uri, p.sha256, p.bin, p.bin
        ));
        if p.has_license {
            entries.push_str(&format!("      - from: {LICENSE}\n        to: .\n"));
        }
    }
    Ok(template
        .replace("${VERSION}", &format!("\"{version}\""))
        .replace("${PLATFORMS}\n", &entries))
}

/// Krew's rules for a manifest (its developer guide): kind and apiVersion,
/// the name `dra`, a `v`-prefixed semver, a one-line short description, and per platform an
/// os/arch selector, a URI, a 64-digit lowercase sha256 and a `bin` that the
/// platform's files bring along; no two platforms for the same os/arch.
pub fn check(manifest: &str) -> Result<()> {
    let v: serde_json::Value =
        serde_saphyr::from_str(manifest).context("the manifest is not YAML")?;
    ensure!(
        v["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2",
        "apiVersion is {}",
        v["apiVersion"]
    );
    ensure!(v["kind"] == "Plugin", "kind is {}", v["kind"]);
    ensure!(v["metadata"]["name"] == "dra", "metadata.name is not dra");
    let spec = &v["spec"];
    let version = spec["version"].as_str().unwrap_or_default();
    let semver = version.strip_prefix('v').map(|s| {
        let core = s.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    });
    ensure!(
        semver == Some(true),
        "spec.version {version:?} is not semver with a leading v (v0.1.0)"
    );
    ensure!(
        spec["shortDescription"]
            .as_str()
            .is_some_and(|s| !s.trim().is_empty() && !s.contains('\n')),
        "spec.shortDescription is missing or not one line"
    );
    let platforms = spec["platforms"]
        .as_array()
        .filter(|p| !p.is_empty())
        .context("spec.platforms is empty")?;
    let mut seen = BTreeSet::new();
    for (i, p) in platforms.iter().enumerate() {
        let labels = &p["selector"]["matchLabels"];
        let os = labels["os"].as_str().unwrap_or_default();
        let arch = labels["arch"].as_str().unwrap_or_default();
        ensure!(
            !os.is_empty() && !arch.is_empty(),
            "platform {i}: no os/arch selector"
        );
        ensure!(
            seen.insert((os.to_string(), arch.to_string())),
            "platform {i}: a second entry for {os}/{arch}"
        );
        let uri = p["uri"].as_str().unwrap_or_default();
        ensure!(
            uri.starts_with("https://") || uri.starts_with("http://"),
            "platform {os}/{arch}: uri {uri:?} is not a URL"
        );
        let sha = p["sha256"].as_str().unwrap_or_default();
        ensure!(
            sha.len() == 64 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "platform {os}/{arch}: sha256 {sha:?} is not 64 lowercase hex digits"
        );
        let bin = p["bin"].as_str().unwrap_or_default();
        ensure!(!bin.is_empty(), "platform {os}/{arch}: no bin");
        let brought = p["files"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["from"] == bin || f["from"] == "*");
        ensure!(
            brought,
            "platform {os}/{arch}: files do not bring bin {bin} along"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release archive as the release step would build it.
    fn archive(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).unwrap();
        let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o755);
            header.set_cksum();
            tar.append_data(&mut header, name, *data).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
        path
    }

    fn template() -> String {
        std::fs::read_to_string(repo_root().join(TEMPLATE)).unwrap()
    }

    #[test]
    fn manifest_from_archives_carries_their_digests_and_passes_krews_rules() {
        let dir = tempfile::tempdir().unwrap();
        let base = "https://github.com/aws-dra/aws-dra-drivers/releases/download/v0.1.0";
        let linux = archive(
            dir.path(),
            "kubectl-dra_v0.1.0_linux_amd64.tar.gz",
            &[
                ("kubectl-dra", b"\x7fELF linux"),
                ("LICENSE", b"Apache-2.0"),
            ],
        );
        let arm = archive(
            dir.path(),
            "kubectl-dra_v0.1.0_linux_arm64.tar.gz",
            &[("./kubectl-dra", b"\x7fELF arm")],
        );
        let platforms = [&linux, &arm]
            .iter()
            .map(|a| platform(a, "v0.1.0", base).unwrap())
            .collect::<Vec<_>>();
        let manifest = render(&template(), "v0.1.0", &platforms).unwrap();
        check(&manifest).unwrap();

        let v: serde_json::Value = serde_saphyr::from_str(&manifest).unwrap();
        assert_eq!(v["spec"]["version"], "v0.1.0");
        let entries = v["spec"]["platforms"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        for (entry, path) in entries.iter().zip([&linux, &arm]) {
            let digest = hex::encode(Sha256::digest(std::fs::read(path).unwrap()));
            assert_eq!(entry["sha256"], digest.as_str());
            let name = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(entry["uri"], format!("{base}/{name}").as_str());
            assert_eq!(entry["bin"], "kubectl-dra");
        }
        assert_eq!(entries[0]["selector"]["matchLabels"]["arch"], "amd64");
        assert_eq!(entries[0]["files"][1]["from"], "LICENSE");
        assert_eq!(entries[1]["files"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn archives_without_the_binary_or_with_odd_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = archive(
            dir.path(),
            "kubectl-dra_v0.1.0_linux_amd64.tar.gz",
            &[("README.md", b"x")],
        );
        let e = platform(&empty, "v0.1.0", "https://x").unwrap_err();
        assert!(e.to_string().contains("no kubectl-dra at the top"), "{e}");
        let e = platform(&empty, "v0.2.0", "https://x").unwrap_err();
        assert!(
            e.to_string().contains("is not named kubectl-dra_v0.2.0_"),
            "{e}"
        );
        let odd = archive(
            dir.path(),
            "kubectl-dra_v0.1.0_plan9_amd64.tar.gz",
            &[("kubectl-dra", b"x")],
        );
        let e = platform(&odd, "v0.1.0", "https://x").unwrap_err();
        assert!(e.to_string().contains("OS \"plan9\""), "{e}");
        let not_gzip = dir.path().join("kubectl-dra_v0.1.0_darwin_arm64.tar.gz");
        std::fs::write(&not_gzip, b"plain text").unwrap();
        assert!(platform(&not_gzip, "v0.1.0", "https://x").is_err());
    }

    #[test]
    fn check_catches_what_krew_rejects() {
        let good = Platform {
            os: "linux".into(),
            arch: "amd64".into(),
            uri: "https://x/a.tar.gz".into(),
            sha256: "0".repeat(64),
            bin: "kubectl-dra".into(),
            has_license: false,
        };
        check(&render(&template(), "v1.2.3", std::slice::from_ref(&good)).unwrap()).unwrap();
        let e =
            check(&render(&template(), "1.2.3", std::slice::from_ref(&good)).unwrap()).unwrap_err();
        assert!(e.to_string().contains("leading v"), "{e}");
        let twice = render(&template(), "v1.2.3", &[good.clone(), good.clone()]).unwrap();
        assert!(
            check(&twice)
                .unwrap_err()
                .to_string()
                .contains("second entry")
        );
        let bad_sha = Platform {
            sha256: "ABC".into(),
            ..good
        };
        let e = check(&render(&template(), "v1.2.3", &[bad_sha]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("sha256"), "{e}");
    }
}
