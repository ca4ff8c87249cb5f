//! OCI image archives written by our own code.
//!
//! No registry is reachable where the local cluster runs, so its two images
//! (the pod sandbox and the probe) are single-binary images packed here as an
//! OCI image layout in a tar (`oci-layout`, `index.json`, `blobs/sha256/…`:
//! one uncompressed layer, its config and manifest) and imported with
//! `ctr images import`. Archives are deterministic: same binary, same digests.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result, io};

/// Bumped whenever the archive layout written here changes, so cached
/// archives are rebuilt.
pub const FORMAT_REVISION: &str = "oci-archive-1";

const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// One single-binary image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// Full reference containerd will know it by, e.g. `localhost/aws-dra-e2e/probe:v1`.
    pub reference: String,
    /// The static executable to put in the image.
    pub binary: PathBuf,
    /// Where it lives inside the image, e.g. `/probe`; also the entrypoint.
    pub entrypoint: String,
    /// More files: `(source on this host, absolute path in the image)`,
    /// e.g. more executables and the shared libraries they load.
    pub files: Vec<(PathBuf, String)>,
}

/// The shared objects `binary` loads, as `ldd` resolves them on this host
/// (the dynamic loader included), by the paths the binary will look them up
/// under; empty for a static binary.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(io("running ldd on", binary))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // ldd says "not a dynamic executable" (exit 1) for static binaries.
        let err = String::from_utf8_lossy(&out.stderr);
        if text.contains("not a dynamic executable") || err.contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        return Err(Error::Host(format!(
            "ldd {} failed: {}",
            binary.display(),
            err.trim()
        )));
    }
    parse_ldd(&text)
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("not found") {
            return Err(Error::Host(format!("a shared library is missing: {line}")));
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or the loader
        // `/lib64/ld-linux-x86-64.so.2 (0x…)`; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    libs.sort();
    libs.dedup();
    Ok(libs)
}

struct Blob {
    digest: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        Self { digest, bytes }
    }
    fn descriptor(&self, media_type: &str) -> serde_json::Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.bytes.len()})
    }
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn tar_file(builder: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(data.len() as u64);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder
        .append_data(&mut header, path, data)
        .map_err(io("adding to image archive", path))
}

fn tar_dir(builder: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(0);
    header.set_mode(0o755);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Directory);
    builder
        .append_data(&mut header, path, std::io::empty())
        .map_err(io("adding to image archive", path))
}

fn json_blob(value: &serde_json::Value, what: &str) -> Result<Blob> {
    serde_json::to_vec(value)
        .map(Blob::new)
        .map_err(|source| Error::Json {
            what: what.to_string(),
            source,
        })
}

/// Builds the archive bytes for `spec` (pure apart from reading the binary).
pub fn archive_bytes(spec: &ImageSpec) -> Result<Vec<u8>> {
    let binary = fs::read(&spec.binary).map_err(io("reading", &spec.binary))?;
    let inside = spec.entrypoint.trim_start_matches('/');

    let mut layer = tar::Builder::new(Vec::new());
    // Mount points the runtime fills in; present so nothing has to create them.
    for dir in ["dev/", "proc/", "sys/", "etc/", "tmp/"] {
        tar_dir(&mut layer, dir)?;
    }
    tar_file(&mut layer, inside, 0o755, &binary)?;
    let mut dirs = std::collections::BTreeSet::new();
    let mut files = std::collections::BTreeMap::new();
    for (source, target) in &spec.files {
        let inside = target.trim_start_matches('/');
        // Parents first (tar order), each once.
        let mut parent = Path::new(inside).parent();
        let mut chain = Vec::new();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            chain.push(format!("{}/", p.display()));
            parent = p.parent();
        }
        dirs.extend(chain);
        // Follows symlinks: the image holds the file's content at this path.
        files.insert(
            inside.to_string(),
            fs::read(source).map_err(io("reading", source))?,
        );
    }
    for dir in dirs
        .iter()
        .filter(|d| !matches!(d.as_str(), "dev/" | "proc/" | "sys/" | "etc/" | "tmp/"))
    {
        tar_dir(&mut layer, dir)?;
    }
    for (inside, data) in &files {
        tar_file(&mut layer, inside, 0o755, data)?;
    }
    let layer = Blob::new(
        layer
            .into_inner()
            .map_err(io("finishing image layer of", &spec.binary))?,
    );

    let config = json_blob(
        &json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {
                "Entrypoint": [spec.entrypoint],
                "Env": ["PATH=/"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        }),
        "image config",
    )?;
    let manifest = json_blob(
        &json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": config.descriptor(CONFIG_MEDIA_TYPE),
            "layers": [layer.descriptor(LAYER_MEDIA_TYPE)],
        }),
        "image manifest",
    )?;
    let tag = spec
        .reference
        .rsplit_once(':')
        .map_or("latest", |(_, tag)| tag);
    let mut manifest_descriptor = manifest.descriptor(MANIFEST_MEDIA_TYPE);
    manifest_descriptor["annotations"] = json!({
        // ctr reads the full name from this one; the OCI one is the tag.
        "io.containerd.image.name": spec.reference,
        "org.opencontainers.image.ref.name": tag,
    });
    manifest_descriptor["platform"] = json!({"architecture": oci_arch(), "os": "linux"});
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))
    .map_err(|source| Error::Json {
        what: "image index".into(),
        source,
    })?;

    let mut archive = tar::Builder::new(Vec::new());
    tar_file(
        &mut archive,
        "oci-layout",
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    tar_file(&mut archive, "index.json", 0o644, &index)?;
    tar_dir(&mut archive, "blobs/")?;
    tar_dir(&mut archive, "blobs/sha256/")?;
    for blob in [&layer, &config, &manifest] {
        let name = format!("blobs/sha256/{}", blob.digest.trim_start_matches("sha256:"));
        tar_file(&mut archive, &name, 0o644, &blob.bytes)?;
    }
    archive
        .into_inner()
        .map_err(io("finishing image archive for", &spec.binary))
}

/// Writes the archive for `spec` to `out` atomically.
pub fn write_archive(spec: &ImageSpec, out: &Path) -> Result<()> {
    let bytes = archive_bytes(spec)?;
    let tmp = out.with_extension("tmp");
    let mut file = fs::File::create(&tmp).map_err(io("creating", &tmp))?;
    file.write_all(&bytes).map_err(io("writing", &tmp))?;
    file.sync_all().map_err(io("syncing", &tmp))?;
    fs::rename(&tmp, out).map_err(io("renaming into", out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    fn entries(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(bytes);
        let mut out = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.insert(path, data);
        }
        out
    }

    #[test]
    fn archive_is_a_consistent_oci_layout() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("probe");
        fs::write(&bin, b"\x7fELF fake binary").unwrap();
        let spec = ImageSpec {
            reference: "localhost/aws-dra-e2e/probe:v1".into(),
            binary: bin.clone(),
            entrypoint: "/probe".into(),
            files: vec![(bin, "/usr/local/lib/x/libfake.so".into())],
        };
        let bytes = archive_bytes(&spec).unwrap();
        assert_eq!(bytes, archive_bytes(&spec).unwrap(), "deterministic");
        let files = entries(&bytes);
        assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let desc = &index["manifests"][0];
        assert_eq!(
            desc["annotations"]["io.containerd.image.name"],
            "localhost/aws-dra-e2e/probe:v1"
        );
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"],
            "v1"
        );
        // Every descriptor points at a blob whose digest and size match.
        let blob = |d: &serde_json::Value| {
            let digest = d["digest"].as_str().unwrap();
            let data = &files[&format!("blobs/sha256/{}", &digest[7..])];
            assert_eq!(
                format!("sha256:{}", hex::encode(Sha256::digest(data))),
                digest
            );
            assert_eq!(d["size"].as_u64().unwrap(), data.len() as u64);
            data.clone()
        };
        let manifest: serde_json::Value = serde_json::from_slice(&blob(desc)).unwrap();
        let config: serde_json::Value = serde_json::from_slice(&blob(&manifest["config"])).unwrap();
        let layer = blob(&manifest["layers"][0]);
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
        assert_eq!(config["config"]["Entrypoint"][0], "/probe");
        let layer_files = entries(&layer);
        assert_eq!(layer_files["probe"], b"\x7fELF fake binary");
        assert_eq!(
            layer_files["usr/local/lib/x/libfake.so"],
            b"\x7fELF fake binary"
        );
        for dir in ["usr/", "usr/local/", "usr/local/lib/", "usr/local/lib/x/"] {
            assert!(layer_files.contains_key(dir), "{dir} missing");
        }
    }

    #[test]
    fn ldd_output_gives_library_paths_and_the_loader() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so => not found\n").is_err());
    }

    #[test]
    fn this_test_binary_needs_libc() {
        let exe = std::env::current_exe().unwrap();
        let libs = shared_libraries(&exe).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }
}
