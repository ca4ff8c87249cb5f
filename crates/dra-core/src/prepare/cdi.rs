//! Writes one CDI spec file per prepared claim.
//!
//! Layout follows the DRA conventions: vendor `k8s.<driver>`, file
//! `<vendor>-<class>_<claimUID>.json`, device names `<claimUID>-<device>`
//! (unique per claim, so a runtime's spec cache never serves a stale entry).
//! `cdiVersion` is the lowest version that covers what the file uses, per the
//! CDI spec's version table: 0.3.0 is the earliest tagged release; 0.5.0
//! added `hostPath` on device nodes and device names starting with a digit;
//! 0.6.0 allowed dots in the class (name segment of `kind`).
//!
//! A claim's device attributes files (see [`crate::prepare::attributes_file`])
//! are mounted by one more device per request, `<claimUID>_<request>`: the
//! underscore keeps it apart from every `<claimUID>-<device>` (device names
//! are DNS labels).

use std::path::{Path, PathBuf};

use serde::Serialize;

#[cfg(any(test, feature = "testing"))]
use crate::prepare::atomic::commit;
use crate::prepare::atomic::{Staged, remove_if_exists, stage};
use crate::prepare::driver::{ContainerEdits, DeviceEdits, PreparedDevice};

#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum CdiError {
    #[error("writing CDI spec {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("removing CDI spec {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding CDI spec: {0}")]
    Encode(#[from] serde_json::Error),
}

/// One file to mount: the CDI writer turns it into a mount device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttributesMount {
    /// Base request name.
    pub(crate) request: String,
    pub(crate) host_path: PathBuf,
    pub(crate) container_path: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    cdi_version: &'static str,
    kind: String,
    devices: Vec<SpecDevice<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDevice<'a> {
    name: String,
    container_edits: SpecEdits<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecEdits<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<SpecDeviceNode<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<SpecMount<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecMount<'a> {
    host_path: &'a Path,
    container_path: &'a str,
    options: [&'static str; 2],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDeviceNode<'a> {
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    host_path: Option<&'a str>,
}

/// A claim's spec as found in the CDI root: what recovery from a damaged
/// checkpoint rebuilds the claim from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecOnDisk {
    pub(crate) claim_uid: String,
    pub(crate) path: PathBuf,
    /// The claim's devices, from the spec's `<claimUID>-<device>` entries.
    pub(crate) devices: Vec<String>,
    /// The base requests whose attributes file it mounts (`<claimUID>_<request>`).
    pub(crate) requests: Vec<String>,
}

/// Writes and removes the CDI specs of one driver.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub struct CdiWriter {
    root: PathBuf,
    vendor: String,
    class: String,
}

impl CdiWriter {
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn new(root: &Path, driver_name: &str, class: &str) -> Self {
        Self {
            root: root.to_path_buf(),
            vendor: format!("k8s.{driver_name}"),
            class: class.to_string(),
        }
    }

    /// Removes the temp files of this driver's specs that a writer killed
    /// between staging and committing left in the CDI root (older than
    /// 60 s); returns them.
    pub(crate) fn remove_abandoned(&self) -> std::io::Result<Vec<PathBuf>> {
        let prefix = format!("{}-{}_", self.vendor, self.class);
        crate::prepare::atomic::remove_abandoned(
            &self.root,
            |target| target.starts_with(&prefix) && target.ends_with(".json"),
            crate::prepare::atomic::ABANDONED_AFTER,
        )
    }

    pub(crate) fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.root
            .join(format!("{}-{}_{claim_uid}.json", self.vendor, self.class))
    }

    /// The fully qualified CDI id of one device of a claim.
    fn device_id(&self, claim_uid: &str, device: &str) -> String {
        format!("{}/{}={claim_uid}-{device}", self.vendor, self.class)
    }

    /// Sets the CDI ids of a claim's devices, the one place they are
    /// built: each device's own, and on the first device of each request in
    /// `mounted` (the requests whose attributes file the spec mounts) that
    /// request's mount device. Kubelet hands a container the ids of the
    /// devices of the requests it names, so the file reaches every such
    /// container, once.
    pub(crate) fn set_device_ids<'a>(
        &self,
        claim_uid: &str,
        devices: &mut [PreparedDevice],
        mounted: impl IntoIterator<Item = &'a str>,
    ) {
        for d in devices.iter_mut() {
            d.cdi_device_ids = vec![self.device_id(claim_uid, &d.device)];
        }
        for request in mounted {
            if let Some(d) = devices
                .iter_mut()
                .find(|d| d.request_names.iter().any(|r| r == request))
            {
                d.cdi_device_ids
                    .push(self.mount_device_id(claim_uid, request));
            }
        }
    }

    /// Writes the claim's spec atomically and returns its path.
    #[cfg(any(test, feature = "testing"))]
    #[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
    pub fn write(&self, claim_uid: &str, devices: &[DeviceEdits]) -> Result<PathBuf, CdiError> {
        let (path, staged) = self.stage(claim_uid, devices)?;
        commit(vec![staged]).map_err(|(path, source)| CdiError::Write { path, source })?;
        Ok(path)
    }

    /// The CDI id of the device that mounts the attributes file of
    /// `request` of a claim.
    fn mount_device_id(&self, claim_uid: &str, request: &str) -> String {
        format!("{}/{}={claim_uid}_{request}", self.vendor, self.class)
    }

    /// The claim's spec written beside its final path, to be put in place
    /// with the checkpoint ([`crate::prepare::atomic::commit`]).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn stage(
        &self,
        claim_uid: &str,
        devices: &[DeviceEdits],
    ) -> Result<(PathBuf, Staged), CdiError> {
        self.stage_with(claim_uid, devices, &[])
    }

    /// [`Self::stage`] with a read-only bind mount device per attributes file.
    pub(crate) fn stage_with(
        &self,
        claim_uid: &str,
        devices: &[DeviceEdits],
        mounts: &[AttributesMount],
    ) -> Result<(PathBuf, Staged), CdiError> {
        let mut devices: Vec<SpecDevice<'_>> = devices
            .iter()
            .map(|d| SpecDevice {
                name: format!("{claim_uid}-{}", d.device),
                container_edits: spec_edits(&d.edits),
            })
            .collect();
        devices.extend(mounts.iter().map(|m| SpecDevice {
            name: format!("{claim_uid}_{}", m.request),
            container_edits: SpecEdits {
                env: Vec::new(),
                device_nodes: Vec::new(),
                mounts: vec![SpecMount {
                    host_path: &m.host_path,
                    container_path: &m.container_path,
                    options: ["ro", "bind"],
                }],
            },
        }));
        let spec = Spec {
            cdi_version: self.minimum_version(&devices),
            kind: format!("{}/{}", self.vendor, self.class),
            devices,
        };
        let bytes = serde_json::to_vec_pretty(&spec)?;
        let path = self.spec_path(claim_uid);
        let staged = std::fs::create_dir_all(&self.root)
            .and_then(|()| stage(&path, &bytes))
            .map_err(|source| CdiError::Write {
                path: path.clone(),
                source,
            })?;
        Ok((path, staged))
    }

    pub(crate) fn remove(&self, path: &Path) -> Result<(), CdiError> {
        remove_if_exists(path).map_err(|source| CdiError::Remove {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Every claim spec of this writer in the CDI root (named as
    /// [`Self::spec_path`] names them), read back; a file of that name that
    /// does not parse as one of ours is an error of its own (left alone).
    pub(crate) fn specs_on_disk(&self) -> std::io::Result<Vec<Result<SpecOnDisk, String>>> {
        let prefix = format!("{}-{}_", self.vendor, self.class);
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut found = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            let uid = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix)?.strip_suffix(".json"))
                .filter(|uid| !uid.is_empty() && !uid.contains(['/', '.']));
            if let Some(uid) = uid {
                found.push(self.read_spec(uid));
            }
        }
        found.sort_by(|a, b| match (a, b) {
            (Ok(a), Ok(b)) => a.claim_uid.cmp(&b.claim_uid),
            _ => a.is_err().cmp(&b.is_err()),
        });
        Ok(found)
    }

    fn read_spec(&self, claim_uid: &str) -> Result<SpecOnDisk, String> {
        let path = self.spec_path(claim_uid);
        let what = |e: &dyn std::fmt::Display| format!("CDI spec {}: {e}", path.display());
        let bytes = std::fs::read(&path).map_err(|e| what(&e))?;
        let spec: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| what(&e))?;
        let kind = format!("{}/{}", self.vendor, self.class);
        if spec["kind"] != kind.as_str() {
            return Err(what(&format!("kind is not {kind}")));
        }
        let (mut devices, mut requests) = (Vec::new(), Vec::new());
        let names = spec["devices"].as_array().into_iter().flatten();
        for name in names.map(|d| d["name"].as_str().unwrap_or_default()) {
            if let Some(device) = name.strip_prefix(&format!("{claim_uid}-")) {
                devices.push(device.to_owned());
            } else if let Some(request) = name.strip_prefix(&format!("{claim_uid}_")) {
                requests.push(request.to_owned());
            } else {
                return Err(what(&format!(
                    "device {name:?} is not of claim {claim_uid}"
                )));
            }
        }
        Ok(SpecOnDisk {
            claim_uid: claim_uid.to_owned(),
            path,
            devices,
            requests,
        })
    }

    /// Whether `path` is the spec this writer writes for `claim_uid`: in
    /// our CDI root itself, under our vendor and class, for that claim.
    /// Compared as written (a recorded path is one [`Self::spec_path`] gave).
    pub(crate) fn owns(&self, claim_uid: &str, path: &Path) -> bool {
        path == self.spec_path(claim_uid)
    }

    /// Removes the spec recorded for `claim_uid` if it is ours
    /// ([`Self::owns`]). A recorded path that is not (a checkpoint edited on
    /// the node, or written with another `--cdi-root`) is left alone with a
    /// warning, and the claim's spec where ours would be is removed instead.
    pub(crate) fn remove_claim_spec(
        &self,
        claim_uid: &str,
        recorded: &Path,
    ) -> Result<(), CdiError> {
        if !self.owns(claim_uid, recorded) {
            tracing::warn!(
                claim_uid,
                path = %recorded.display(),
                "checkpoint names a CDI spec that is not this claim's in our CDI root; not removing it"
            );
        }
        self.remove(&self.spec_path(claim_uid))
    }

    fn minimum_version(&self, devices: &[SpecDevice<'_>]) -> &'static str {
        if self.class.contains('.') {
            return "0.6.0";
        }
        let host_path = devices.iter().any(|d| {
            d.container_edits
                .device_nodes
                .iter()
                .any(|n| n.host_path.is_some())
        });
        let digit_name = devices
            .iter()
            .any(|d| !d.name.starts_with(|c: char| c.is_ascii_alphabetic()));
        if host_path || digit_name {
            "0.5.0"
        } else {
            "0.3.0"
        }
    }
}

fn spec_edits(edits: &ContainerEdits) -> SpecEdits<'_> {
    SpecEdits {
        env: edits.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        device_nodes: edits
            .device_nodes
            .iter()
            .map(|n| SpecDeviceNode {
                path: &n.path,
                host_path: n.host_path.as_deref().filter(|h| *h != n.path),
            })
            .collect(),
        mounts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::driver::DeviceNode;
    use std::collections::BTreeMap;

    #[test]
    fn a_killed_writers_spec_temp_file_goes_once_old_and_only_ours() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CdiWriter::new(dir.path(), "efa.example.com", "efa");
        let temp_files = || -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().contains(".tmp-"))
                .collect();
            v.sort();
            v
        };
        // Killed between stage and commit: the destructor never runs.
        let (_, staged) = writer.stage("uid-old", &[edits(None)]).unwrap();
        std::mem::forget(staged);
        let old = temp_files().pop().unwrap();
        let hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hours_ago)
            .unwrap();
        // A writer at work now (or another instance's, in a rolling update).
        let (_, young) = writer.stage("uid-new", &[edits(None)]).unwrap();
        // Another driver's, as old.
        let other = dir.path().join(".k8s.gpu.example.com-gpu_u.json.tmp-1-1");
        std::fs::write(&other, "{}").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(hours_ago)
            .unwrap();

        assert_eq!(
            writer.remove_abandoned().unwrap(),
            std::slice::from_ref(&old)
        );
        assert!(!old.exists());
        assert!(other.exists());
        assert_eq!(
            temp_files().len(),
            2,
            "the young one and the other driver's"
        );
        drop(young);
    }

    fn edits(host: Option<&str>) -> DeviceEdits {
        DeviceEdits {
            device: "neuron-device-0".into(),
            edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/neuron0".into(),
                    host_path: host.map(str::to_string),
                }],
                env: BTreeMap::from([("NEURON_RT_VISIBLE_CORES".into(), "0-7".into())]),
            },
        }
    }

    fn read_with_cdi_crate(path: &Path) -> container_device_interface::spec::Spec {
        container_device_interface::spec::read_spec(&path.to_path_buf(), 0)
            .unwrap_or_else(|e| panic!("CDI crate rejected {}: {e:#}", path.display()))
    }

    #[test]
    fn spec_is_accepted_by_an_independent_cdi_parser() {
        let dir = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(dir.path(), "neuron.aws.com", "neuron");
        let uid = "0b7c6a58-2f3e-4f7e-9d55-0a4f0f5f1c11";
        let path = w
            .write(uid, &[edits(Some("/fixture/dev/neuron0"))])
            .unwrap();
        assert_eq!(
            path.file_name().unwrap().to_string_lossy(),
            format!("k8s.neuron.aws.com-neuron_{uid}.json")
        );
        let spec = read_with_cdi_crate(&path);
        assert_eq!(spec.get_vendor(), "k8s.neuron.aws.com");
        assert_eq!(spec.get_class(), "neuron");
        let device = spec
            .get_device(&format!("{uid}-neuron-device-0"))
            .expect("device present");
        assert_eq!(
            device.get_qualified_name(),
            w.device_id(uid, "neuron-device-0")
        );
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(raw["cdiVersion"], "0.5.0");
        assert_eq!(
            raw["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/fixture/dev/neuron0"
        );
        w.remove(&path).unwrap();
        assert!(!path.exists());
        w.remove(&path).unwrap();
    }

    #[test]
    fn version_is_the_lowest_that_covers_the_fields() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("neuron", "abc", None, "0.3.0"),
            ("neuron", "abc", Some("/h/dev/neuron0"), "0.5.0"),
            ("neuron", "1bc", None, "0.5.0"),
            ("neuron.x", "abc", None, "0.6.0"),
        ];
        for (class, uid, host, want) in cases {
            let w = CdiWriter::new(dir.path(), "neuron.aws.com", class);
            let path = w.write(uid, &[edits(host)]).unwrap();
            read_with_cdi_crate(&path);
            let mut raw: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            assert_eq!(
                raw["cdiVersion"], want,
                "class {class} uid {uid} host {host:?}"
            );
            // One version lower is rejected by the independent parser.
            let lower = match want {
                "0.6.0" => "0.5.0",
                "0.5.0" => "0.4.0",
                _ => continue,
            };
            raw["cdiVersion"] = lower.into();
            std::fs::write(&path, serde_json::to_vec(&raw).unwrap()).unwrap();
            assert!(
                container_device_interface::spec::read_spec(&path, 0).is_err(),
                "{lower} accepted for class {class} uid {uid} host {host:?}"
            );
        }
    }
}
