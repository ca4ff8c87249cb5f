//! Device attributes files: a prepared claim's devices, with the attributes
//! we publish for them in ResourceSlices, in a JSON file the container reads.
//!
//! The layout a workload sees is KEP-5304's device metadata protocol as the
//! 1.37 kubelet plugin framework writes it, so a reader written against
//! upstream drivers reads ours:
//! - inside the container, per claim and request,
//!   `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`,
//!   or `.../resourceclaimtemplates/<pod claim name>/<request>/...` for a
//!   claim generated from a template (the pod's own name for the claim, from
//!   the claim's `resource.kubernetes.io/pod-claim-name` annotation; any
//!   claim author can set it, so a value that is not a DNS label, as a pod's
//!   claim names are, is ignored: no `/` or `..` reaches the path);
//!   `<request>` is the base request (`gpu` for subrequest `gpu/big`);
//! - the file is a stream of `DeviceMetadata` objects, the same content once
//!   per API version, newest first (`metadata.resource.k8s.io/v1beta1`, then
//!   `v1alpha1` for readers of 1.36); a reader takes the first it knows.
//!   Each names the claim (`metadata.name`, `namespace`, `uid`,
//!   `generation` 1: we never rewrite a prepared claim's file) and one
//!   request (`name` the full request reference) with its devices
//!   (`driver`, `pool`, `name`, `attributes` typed as in a ResourceSlice).
//!
//! On the host a file is `<dir>/<driver>-<claimUID>-<request>.json` (`<dir>`
//! `/var/run/dra-device-attributes` by default, see [`AttributeFiles`]):
//! named by the claim UID, so
//! unprepare finds it from the UID alone (also after a restart, or for a
//! claim the checkpoint lost), and a start can tell the files of claims no
//! longer prepared. A file is this driver's only in exactly that shape (the
//! UID in its 36-character form, then a request name), so a second
//! instance named `<driver>-canary` sharing the directory keeps its files.
//! The claim's CDI spec mounts each file read-only
//! ([`crate::prepare::cdi`]); the file is put in place with the spec and the
//! checkpoint, in one commit.
//!
//! The attributes are those of the device in the pool as last scanned
//! ([`AttributeSource`]); a device no longer published under that name (a
//! rename by an upgrade) is listed without attributes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};
use serde::Serialize;

use crate::prepare::atomic::{Staged, remove_if_exists, stage};
use crate::prepare::cdi::AttributesMount;
use crate::prepare::checkpoint::PreparedClaim;
use crate::prepare::config::base_request;
use crate::prepare::driver::{ClaimRef, PreparedDevice};

/// Where the files appear inside containers.
pub(crate) const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// Default host directory of the files.
pub(crate) const DEFAULT_HOST_DIR: &str = "/var/run/dra-device-attributes";
/// Set by the resource claim controller on claims made from a template.
const POD_CLAIM_NAME: &str = "resource.kubernetes.io/pod-claim-name";
/// The versions written, newest first.
const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];

/// A device's attributes as published.
pub(crate) type DeviceAttributes = BTreeMap<String, DeviceAttribute>;

/// Looks up a device's published attributes by its name.
type AttributeLookup = dyn Fn(&str) -> Option<DeviceAttributes> + Send + Sync;

/// The published attributes of a device of this driver, by device name.
#[derive(Clone)]
pub(crate) struct AttributeSource(Arc<AttributeLookup>);

impl AttributeSource {
    pub(crate) fn new(
        f: impl Fn(&str) -> Option<DeviceAttributes> + Send + Sync + 'static,
    ) -> Self {
        Self(Arc::new(f))
    }
}

impl fmt::Debug for AttributeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttributeSource")
    }
}

/// Whether and where attributes files are written.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct AttributeFiles {
    /// Off: no file is written nor mounted; files of claims prepared before
    /// are still removed at their unprepare.
    pub enabled: bool,
    /// The host directory; `None`: `dra-device-attributes` beside the CDI
    /// root (`/var/run/dra-device-attributes` for `/var/run/cdi`), which
    /// keeps the files of test nodes that share a host apart as their CDI
    /// roots are.
    pub host_dir: Option<PathBuf>,
    pub(crate) source: Option<AttributeSource>,
    /// Set by [`Self::for_driver`]: the plugin's driver name and the
    /// directory in use.
    pub(crate) driver: String,
    pub(crate) dir: PathBuf,
}

impl Default for AttributeFiles {
    fn default() -> Self {
        Self {
            enabled: true,
            host_dir: None,
            source: None,
            driver: String::new(),
            dir: PathBuf::from(DEFAULT_HOST_DIR),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum AttributeFilesError {
    #[error("writing device attributes file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding device attributes file: {0}")]
    Encode(#[from] serde_json::Error),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeviceMetadata<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: [MetadataRequest<'a>; 1],
}

#[derive(Serialize)]
struct ObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct MetadataRequest<'a> {
    name: &'a str,
    devices: Vec<MetadataDevice<'a>>,
}

#[derive(Serialize)]
struct MetadataDevice<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attributes: DeviceAttributes,
}

impl AttributeFiles {
    /// These settings for driver `driver` writing CDI specs to `cdi_root`.
    pub(crate) fn for_driver(&self, driver: &str, cdi_root: &Path) -> Self {
        let dir = self.host_dir.clone().unwrap_or_else(|| {
            cdi_root
                .parent()
                .unwrap_or(Path::new("/"))
                .join("dra-device-attributes")
        });
        Self {
            driver: driver.to_owned(),
            dir,
            ..self.clone()
        }
    }

    /// The host file of `request` (base name) of claim `claim_uid`.
    pub(crate) fn host_path(&self, claim_uid: &str, request: &str) -> PathBuf {
        self.dir
            .join(format!("{}-{claim_uid}-{request}.json", self.driver))
    }

    /// Where the file of `request` appears in the container.
    pub(crate) fn container_path(
        &self,
        claim_name: &str,
        pod_claim_name: Option<&str>,
        request: &str,
    ) -> String {
        let (sub, name) = match pod_claim_name.filter(|n| is_dns_label(n)) {
            Some(pod_claim) => ("resourceclaimtemplates", pod_claim),
            None => ("resourceclaims", claim_name),
        };
        format!(
            "{CONTAINER_DIR}/{sub}/{name}/{request}/{}-metadata.json",
            self.driver
        )
    }

    /// Writes (not yet in place) one file per request of `devices`, the
    /// claim's prepared devices in allocation order; `object` is the claim as
    /// read, for the template's claim name and full request references.
    /// Nothing when off.
    pub(crate) fn stage(
        &self,
        claim: &ClaimRef,
        object: Option<&ResourceClaim>,
        devices: &[PreparedDevice],
    ) -> Result<Vec<(AttributesMount, Staged)>, AttributeFilesError> {
        if !self.enabled || devices.is_empty() {
            return Ok(Vec::new());
        }
        let pod_claim_name = object
            .and_then(|o| o.metadata.annotations.as_ref())
            .and_then(|a| a.get(POD_CLAIM_NAME))
            .map(String::as_str)
            .filter(|name| {
                let label = is_dns_label(name);
                if !label {
                    tracing::warn!(claim = %claim, annotation = POD_CLAIM_NAME, value = ?name.chars().take(80).collect::<String>(), "not a DNS label; the file goes under resourceclaims/<claim name>");
                }
                label
            });
        let mut requests: Vec<&str> = Vec::new();
        for d in devices {
            for r in &d.request_names {
                if !requests.contains(&r.as_str()) {
                    requests.push(r);
                }
            }
        }
        let mut out = Vec::with_capacity(requests.len());
        for request in requests {
            let members: Vec<&PreparedDevice> = devices
                .iter()
                .filter(|d| d.request_names.iter().any(|r| r == request))
                .collect();
            let full = full_request(object, &self.driver, request, &members);
            let entry = MetadataRequest {
                name: full,
                devices: members
                    .iter()
                    .map(|d| MetadataDevice {
                        driver: &self.driver,
                        pool: &d.pool,
                        name: &d.device,
                        attributes: self
                            .source
                            .as_ref()
                            .and_then(|s| (s.0)(&d.device))
                            .unwrap_or_default(),
                    })
                    .collect(),
            };
            let bytes = encode(claim, pod_claim_name, entry)?;
            let path = self.host_path(&claim.uid, request);
            let staged = std::fs::create_dir_all(&self.dir)
                .and_then(|()| stage(&path, &bytes))
                .map_err(|source| AttributeFilesError::Write {
                    path: path.clone(),
                    source,
                })?;
            let mount = AttributesMount {
                request: request.to_owned(),
                container_path: self.container_path(&claim.name, pod_claim_name, request),
                host_path: path,
            };
            out.push((mount, staged));
        }
        Ok(out)
    }

    /// The claim UID of a file name of this driver's shape,
    /// `<driver>-<UID>-<request>.json`; `None` for any other name, such as
    /// the files of a driver named `<driver>-canary`.
    fn claim_of<'a>(&self, file_name: &'a str) -> Option<&'a str> {
        let rest = file_name
            .strip_prefix(self.driver.as_str())?
            .strip_prefix('-')?;
        let (uid, rest) = rest.split_at_checked(UID_LEN)?;
        let request = rest.strip_prefix('-')?.strip_suffix(".json")?;
        (is_uid(uid) && is_dns_label(request)).then_some(uid)
    }

    /// The files of this driver in the host directory, with their claim UID.
    fn ours(&self) -> std::io::Result<Vec<(PathBuf, String)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if let Some(uid) = name.to_str().and_then(|n| self.claim_of(n)) {
                found.push((entry.path(), uid.to_owned()));
            }
        }
        Ok(found)
    }

    /// Removes every file of claim `claim_uid`.
    pub(crate) fn remove_claim(&self, claim_uid: &str) -> std::io::Result<()> {
        for (path, uid) in self.ours()? {
            if uid == claim_uid {
                remove_if_exists(&path)?;
            }
        }
        Ok(())
    }

    /// What the files of claim `claim_uid` record, one per base request
    /// (recovery from a damaged checkpoint); a file that cannot be read or
    /// is not of that claim is skipped with a warning.
    pub(crate) fn recorded(&self, claim_uid: &str) -> Vec<RecordedRequest> {
        let files = self.ours().unwrap_or_else(|e| {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list device attributes files");
            Vec::new()
        });
        let mut out = Vec::new();
        for (path, _) in files.into_iter().filter(|(_, uid)| uid == claim_uid) {
            match self.read_recorded(&path, claim_uid) {
                Ok(recorded) => out.push(recorded),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = e, "cannot read a device attributes file")
                }
            }
        }
        out.sort_by(|a, b| a.request.cmp(&b.request));
        out
    }

    fn read_recorded(&self, path: &Path, claim_uid: &str) -> Result<RecordedRequest, String> {
        let request = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.strip_prefix(&format!("{}-{claim_uid}-", self.driver)))
            .ok_or("not named for the claim")?
            .to_owned();
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        // The first object of the stream (every one holds the same).
        let doc: serde_json::Value = serde_json::Deserializer::from_slice(&bytes)
            .into_iter()
            .next()
            .ok_or("empty")?
            .map_err(|e| e.to_string())?;
        let meta = &doc["metadata"];
        if meta["uid"] != claim_uid {
            return Err(format!("records claim {} instead", meta["uid"]));
        }
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let devices = doc["requests"][0]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["driver"] == self.driver.as_str())
            .map(|d| (text(&d["pool"]), text(&d["name"])))
            .collect();
        Ok(RecordedRequest {
            request,
            namespace: text(&meta["namespace"]),
            name: text(&meta["name"]),
            devices,
        })
    }

    /// Removes the files of claims that `prepared` (the checkpoint's claims
    /// by UID) does not hold; returns them. Call under the node lock, so
    /// that no file of a claim being prepared is taken for a stale one.
    pub(crate) fn remove_stale(
        &self,
        prepared: &BTreeMap<String, PreparedClaim>,
    ) -> std::io::Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for (path, uid) in self.ours()? {
            if !prepared.contains_key(&uid) {
                remove_if_exists(&path)?;
                removed.push(path);
            }
        }
        Ok(removed)
    }

    /// Removes the temp files a writer killed between staging and
    /// committing left (see [`crate::prepare::atomic::remove_abandoned`]).
    pub(crate) fn remove_abandoned(&self) -> std::io::Result<Vec<PathBuf>> {
        crate::prepare::atomic::remove_abandoned(
            &self.dir,
            |target| self.claim_of(target).is_some(),
            crate::prepare::atomic::ABANDONED_AFTER,
        )
    }

    /// The host directory (for the sweep's log line).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets where the published attributes come from.
    pub(crate) fn with_source(mut self, source: AttributeSource) -> Self {
        self.source = Some(source);
        self
    }
}

/// One attributes file as read back ([`AttributeFiles::recorded`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordedRequest {
    /// Base request name, from the file name.
    pub(crate) request: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// `(pool, device)` of each device of this driver.
    pub(crate) devices: Vec<(String, String)>,
}

/// Length of a claim UID in its text form (RFC 4122, `8-4-4-4-12` hex).
const UID_LEN: usize = 36;

/// Whether `s` is a UID as the API server writes one: RFC 4122 text, hex
/// digits with hyphens at 8, 13, 18 and 23 (kubelet's claim UIDs are
/// refused in any other shape before they get here).
fn is_uid(s: &str) -> bool {
    s.len() == UID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Whether `s` is a DNS label (RFC 1123): 1 to 63 lowercase letters, digits
/// or `-`, starting and ending with a letter or digit. Request names and a
/// pod's claim names are; nothing else becomes a path component.
fn is_dns_label(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= 63
                && alnum(first)
                && alnum(last)
                && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// The full reference (`<request>/<subrequest>` where one was chosen) of
/// base request `request`, from the claim's allocation results of `driver`.
fn full_request<'a>(
    object: Option<&'a ResourceClaim>,
    driver: &str,
    request: &'a str,
    members: &[&PreparedDevice],
) -> &'a str {
    object
        .and_then(|o| o.status.as_ref())
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|results| {
            results.iter().find(|r| {
                r.driver == driver
                    && base_request(&r.request) == request
                    && members.iter().any(|m| m.device == r.device)
            })
        })
        .map_or(request, |r| r.request.as_str())
}

/// The stream of one `DeviceMetadata` object per version.
fn encode(
    claim: &ClaimRef,
    pod_claim_name: Option<&str>,
    request: MetadataRequest<'_>,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut doc = DeviceMetadata {
        kind: "DeviceMetadata",
        api_version: API_VERSIONS[0],
        metadata: ObjectMeta {
            name: &claim.name,
            namespace: &claim.namespace,
            uid: &claim.uid,
            generation: 1,
        },
        pod_claim_name,
        requests: [request],
    };
    let mut out = Vec::new();
    for version in API_VERSIONS {
        doc.api_version = version;
        serde_json::to_writer_pretty(&mut out, &doc)?;
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
