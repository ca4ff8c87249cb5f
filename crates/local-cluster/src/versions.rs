//! The Kubernetes releases the suite runs on, one table per minor.
//!
//! Everything that differs between releases lives here and nowhere else:
//! the pinned patch (and so the committed Go wrapper module under
//! `e2e/go/kubernetes/v1.MINOR/`), the feature gates and runtime-config we
//! pass, the kubelet configuration that must be spelled out, and which DRA
//! features the release serves with those settings. Scenarios name the
//! features they need ([`DraFeature`]); on a release that lacks one the
//! harness reports the scenario as skipped with [`Release::lacks`] as the
//! reason, never silently.
//!
//! The gate stages come from `shared/reference/dra-features-by-version.md`
//! (the Kubernetes feature-gate table). We run every release with its
//! default gates: that is what users get, and a driver that needs a gate
//! turned on must say so in its docs, not in our test setup. The one
//! exception is [`opt_in`]: features no release has on by default that a
//! scenario names, turned on at bring-up and printed when it runs.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod opt_in;

/// A Kubernetes release `vMAJOR.MINOR.PATCH` with an optional pre-release
/// (`v1.38.0-beta.0`), parsed once and printed exactly as parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The pre-release after `-` (`alpha.1`, `beta.0`, `rc.2`), as Kubernetes
    /// tags its releases before `.0`; `None` for a release.
    pub pre: Option<String>,
}

impl KubernetesVersion {
    /// `vMAJOR.MINOR.PATCH` or `vMAJOR.MINOR.PATCH-PRE`, exactly, where PRE
    /// is one of Kubernetes' pre-release kinds and a number (`beta.0`).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || bad_version(text);
        let rest = text.strip_prefix('v').ok_or_else(bad)?;
        let (numbers, pre) = match rest.split_once('-') {
            Some((numbers, pre)) => (numbers, Some(pre)),
            None => (rest, None),
        };
        let mut parts = numbers.split('.');
        let mut next = || -> Result<u32> {
            let part = parts.next().ok_or_else(bad)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse::<u32>().map_err(|_| bad())
        };
        let (major, minor, patch) = (next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        let pre = match pre {
            None => None,
            Some(pre) if is_pre_release(pre) => Some(pre.to_string()),
            Some(_) => return Err(bad()),
        };
        Ok(Self {
            major,
            minor,
            patch,
            pre,
        })
    }

    /// What a user types after `--kubernetes`: a minor (`1.37`, `v1.37`),
    /// resolved to the patch its [`Release`] pins, or an exact version
    /// (`1.37.2`, `v1.38.0-beta.0`) of a release in [`RELEASES`]. Anything
    /// else is an error that names the releases we have.
    pub fn resolve(text: &str) -> Result<Self> {
        let trimmed = text.trim();
        let bare = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let numbers = bare.split_once('-').map_or(bare, |(n, _)| n);
        let parts: Vec<&str> = numbers.split('.').collect();
        let version = match parts.as_slice() {
            [major, minor] if numbers == bare => {
                let (Ok(major), Ok(minor)) = (major.parse::<u32>(), minor.parse::<u32>()) else {
                    return Err(bad_version(text));
                };
                if major != 1 {
                    return Err(bad_version(text));
                }
                let release = Release::for_minor(minor)?;
                Self::parse(release.pinned)?
            }
            [_, _, _] => Self::parse(&format!("v{bare}"))?,
            _ => return Err(bad_version(text)),
        };
        if version.major != 1 {
            return Err(bad_version(text));
        }
        Release::for_minor(version.minor)?;
        Ok(version)
    }

    /// The `v0.MINOR.PATCH[-PRE]` tag of the staging modules that ship with
    /// this release (`k8s.io/api` v0.38.0-beta.0 with Kubernetes v1.38.0-beta.0).
    pub fn staging_version(&self) -> String {
        match &self.pre {
            Some(pre) => format!("v0.{}.{}-{pre}", self.minor, self.patch),
            None => format!("v0.{}.{}", self.minor, self.patch),
        }
    }

    /// This release's table.
    pub fn release(&self) -> Result<&'static Release> {
        Release::for_minor(self.minor)
    }
}

/// The error for a version we cannot read, naming the releases we have.
fn bad_version(text: &str) -> Error {
    Error::BadVersion {
        text: text.to_string(),
        known: known_releases(),
    }
}

/// `1.34, 1.35, ...`: the minors of [`RELEASES`].
fn known_releases() -> String {
    RELEASES
        .iter()
        .map(|r| format!("1.{}", r.minor))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kubernetes' pre-release suffixes: `alpha.N`, `beta.N`, `rc.N`.
fn is_pre_release(pre: &str) -> bool {
    let Some((kind, number)) = pre.split_once('.') else {
        return false;
    };
    matches!(kind, "alpha" | "beta" | "rc")
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
}

impl std::fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(pre) = &self.pre {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}

/// A DRA feature a scenario may need, by its feature gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DraFeature {
    AdminAccess,
    PrioritizedList,
    PartitionableDevices,
    ConsumableCapacity,
    /// Device `taints` in ResourceSlices, `tolerations` in requests.
    DeviceTaints,
    /// The `DeviceTaintRule` API.
    DeviceTaintRules,
    /// `DeviceClass.spec.extendedResourceName`.
    ExtendedResource,
    /// Claim `status.devices`.
    ResourceClaimDeviceStatus,
    /// Kubelet fills `allocatedResourcesStatus` from `DRAResourceHealth`.
    ResourceHealthStatus,
}

impl DraFeature {
    /// The feature gate's name.
    pub fn gate(self) -> &'static str {
        match self {
            Self::AdminAccess => "DRAAdminAccess",
            Self::PrioritizedList => "DRAPrioritizedList",
            Self::PartitionableDevices => "DRAPartitionableDevices",
            Self::ConsumableCapacity => "DRAConsumableCapacity",
            Self::DeviceTaints => "DRADeviceTaints",
            Self::DeviceTaintRules => "DRADeviceTaintRules",
            Self::ExtendedResource => "DRAExtendedResource",
            Self::ResourceClaimDeviceStatus => "DRAResourceClaimDeviceStatus",
            Self::ResourceHealthStatus => "ResourceHealthStatus",
        }
    }
}

/// Where a feature stands in a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    /// Alpha: off unless its gate is turned on.
    Alpha,
    /// Beta, off by default.
    BetaOff,
    /// Beta, on by default.
    BetaOn,
    /// Generally available: always on.
    Ga,
}

impl Stage {
    fn on_by_default(self) -> bool {
        matches!(self, Stage::BetaOn | Stage::Ga)
    }

    fn describe(self) -> &'static str {
        match self {
            Stage::Alpha => "alpha and off by default",
            Stage::BetaOff => "beta and off by default",
            Stage::BetaOn => "beta and on by default",
            Stage::Ga => "GA",
        }
    }
}

/// One Kubernetes minor release as the suite runs it.
#[derive(Debug)]
pub struct Release {
    pub minor: u32,
    /// The patch we build: the newest the Go module proxy served when the
    /// table was last updated. Its wrapper module is committed when the
    /// release is in [`CI_RELEASES`], generated into the cache otherwise.
    pub pinned: &'static str,
    /// Feature gates passed to every component (`--feature-gates`, and the
    /// kubelet's `featureGates`): none, on purpose (see the module docs).
    pub feature_gates: &'static [(&'static str, bool)],
    /// kube-apiserver `--runtime-config` entries (API groups/versions to serve).
    pub runtime_config: &'static [&'static str],
    /// KubeletConfiguration fields this release needs spelled out, as JSON values.
    pub kubelet_config: &'static [(&'static str, &'static str)],
    /// Every DRA feature and its stage in this release.
    pub features: &'static [(DraFeature, Stage)],
}

/// Kubelet settings every release needs on our cgroup v1 machines: 1.35
/// turned `failCgroupV1` on by default, and 1.34 honours it too.
const CGROUP_V1: &[(&str, &str)] = &[("failCgroupV1", "false")];

/// 1.35 changed no DRA feature's stage: both releases share one list.
const FEATURES_1_34_AND_1_35: &[(DraFeature, Stage)] = &[
    (DraFeature::AdminAccess, Stage::BetaOn),
    (DraFeature::PrioritizedList, Stage::BetaOn),
    (DraFeature::PartitionableDevices, Stage::Alpha),
    (DraFeature::ConsumableCapacity, Stage::Alpha),
    (DraFeature::DeviceTaints, Stage::Alpha),
    (DraFeature::DeviceTaintRules, Stage::Alpha),
    (DraFeature::ExtendedResource, Stage::Alpha),
    (DraFeature::ResourceClaimDeviceStatus, Stage::BetaOn),
    (DraFeature::ResourceHealthStatus, Stage::Alpha),
];

/// The releases we know, oldest first.
pub const RELEASES: &[Release] = &[
    Release {
        minor: 34,
        pinned: "v1.34.4",
        feature_gates: &[],
        runtime_config: &[],
        kubelet_config: CGROUP_V1,
        features: FEATURES_1_34_AND_1_35,
    },
    Release {
        minor: 35,
        pinned: "v1.35.4",
        feature_gates: &[],
        runtime_config: &[],
        kubelet_config: CGROUP_V1,
        features: FEATURES_1_34_AND_1_35,
    },
    Release {
        minor: 36,
        pinned: "v1.36.3",
        feature_gates: &[],
        runtime_config: &[],
        kubelet_config: CGROUP_V1,
        features: &[
            (DraFeature::AdminAccess, Stage::Ga),
            (DraFeature::PrioritizedList, Stage::Ga),
            (DraFeature::PartitionableDevices, Stage::BetaOn),
            (DraFeature::ConsumableCapacity, Stage::BetaOn),
            (DraFeature::DeviceTaints, Stage::BetaOn),
            (DraFeature::DeviceTaintRules, Stage::BetaOff),
            (DraFeature::ExtendedResource, Stage::BetaOn),
            (DraFeature::ResourceClaimDeviceStatus, Stage::BetaOn),
            (DraFeature::ResourceHealthStatus, Stage::BetaOn),
        ],
    },
    Release {
        minor: 37,
        pinned: "v1.37.2",
        feature_gates: &[],
        runtime_config: &[],
        kubelet_config: CGROUP_V1,
        features: &[
            (DraFeature::AdminAccess, Stage::Ga),
            (DraFeature::PrioritizedList, Stage::Ga),
            (DraFeature::PartitionableDevices, Stage::BetaOn),
            (DraFeature::ConsumableCapacity, Stage::BetaOn),
            (DraFeature::DeviceTaints, Stage::Ga),
            (DraFeature::DeviceTaintRules, Stage::Ga),
            (DraFeature::ExtendedResource, Stage::Ga),
            (DraFeature::ResourceClaimDeviceStatus, Stage::Ga),
            (DraFeature::ResourceHealthStatus, Stage::BetaOn),
        ],
    },
    // The first beta: GA follows within weeks, and moving the pin is one
    // line here plus `cargo xtask k8s gen-module --kubernetes 1.38.0`. Its
    // go.mod asks for Go 1.27, which the build fetches through the Go proxy
    // (`crate::go_build::GO_TOOLCHAINS`). Stages from its
    // `pkg/features/kube_features.go`: partitionable devices and consumable
    // capacity reach GA (the first locked on), device taints and taint rules
    // are locked on, and the `DynamicResourceAllocation` gate is gone.
    Release {
        minor: 38,
        pinned: "v1.38.0-beta.0",
        feature_gates: &[],
        runtime_config: &[],
        kubelet_config: CGROUP_V1,
        features: &[
            (DraFeature::AdminAccess, Stage::Ga),
            (DraFeature::PrioritizedList, Stage::Ga),
            (DraFeature::PartitionableDevices, Stage::Ga),
            (DraFeature::ConsumableCapacity, Stage::Ga),
            (DraFeature::DeviceTaints, Stage::Ga),
            (DraFeature::DeviceTaintRules, Stage::Ga),
            (DraFeature::ExtendedResource, Stage::Ga),
            (DraFeature::ResourceClaimDeviceStatus, Stage::Ga),
            (DraFeature::ResourceHealthStatus, Stage::BetaOn),
        ],
    },
];

/// The release users deploy next: the demo's, and the first CI runs.
pub const MAIN_MINOR: u32 = 37;
/// The oldest release we support (the first with `resource.k8s.io/v1`).
pub const OLDEST_MINOR: u32 = 34;
/// The next release, on the proxy as a pre-release: CI runs the host
/// testbed on it so a break shows before users upgrade. When its `.0` is
/// out, the main release moves to it ([`MAIN_MINOR`], one line).
pub const NEXT_MINOR: u32 = 38;
/// The releases `cargo xtask ci` runs the whole suite on, the main one
/// first. Their wrapper modules are committed under `e2e/go/kubernetes/`.
pub const CI_RELEASES: [u32; 3] = [MAIN_MINOR, NEXT_MINOR, OLDEST_MINOR];

impl Release {
    pub fn for_minor(minor: u32) -> Result<&'static Release> {
        RELEASES
            .iter()
            .find(|r| r.minor == minor)
            .ok_or_else(|| Error::UnknownRelease {
                minor,
                known: known_releases(),
            })
    }

    /// The pinned version, parsed (the table's own test proves every pin parses).
    pub fn version(&self) -> KubernetesVersion {
        KubernetesVersion::parse(self.pinned).unwrap_or(KubernetesVersion {
            major: 1,
            minor: self.minor,
            patch: 0,
            pre: None,
        })
    }

    /// The committed wrapper module's directory, relative to the repository root.
    pub fn module_dir(&self) -> String {
        format!("e2e/go/kubernetes/v1.{}", self.minor)
    }

    /// Whether the release serves `feature` with our settings.
    pub fn has(&self, feature: DraFeature) -> bool {
        if let Some((_, on)) = self
            .feature_gates
            .iter()
            .find(|(gate, _)| *gate == feature.gate())
        {
            return *on;
        }
        self.stage(feature).is_some_and(Stage::on_by_default)
    }

    pub fn stage(&self, feature: DraFeature) -> Option<Stage> {
        self.features
            .iter()
            .find(|(f, _)| *f == feature)
            .map(|(_, s)| *s)
    }

    /// Why a scenario that needs `needs` cannot run here, or `None` when it can.
    pub fn lacks(&self, needs: &[DraFeature]) -> Option<String> {
        let missing: Vec<String> = needs
            .iter()
            .filter(|f| !self.has(**f))
            .map(|f| {
                format!(
                    "{} ({} in 1.{})",
                    f.gate(),
                    self.stage(*f).map_or("not known", Stage::describe),
                    self.minor
                )
            })
            .collect();
        (!missing.is_empty()).then(|| format!("needs {}", missing.join("; ")))
    }

    /// Flags for kube-apiserver (`apiserver`) or the other control-plane
    /// components: the feature gates, and the runtime-config.
    pub fn control_plane_flags(&self, apiserver: bool) -> Vec<String> {
        let mut flags: Vec<String> = self
            .feature_gates_flag()
            .map(|g| format!("--feature-gates={g}"))
            .into_iter()
            .collect();
        if apiserver && !self.runtime_config.is_empty() {
            flags.push(format!(
                "--runtime-config={}",
                self.runtime_config.join(",")
            ));
        }
        flags
    }

    /// Sets this release's kubelet fields and feature gates in a
    /// KubeletConfiguration object.
    pub fn apply_to_kubelet_config(&self, config: &mut serde_json::Value) -> Result<()> {
        let Some(object) = config.as_object_mut() else {
            return Err(Error::Host("kubelet configuration is not an object".into()));
        };
        for (key, json) in self.kubelet_config {
            let value = serde_json::from_str(json).map_err(|source| Error::Json {
                what: format!("kubelet setting {key} of 1.{}", self.minor),
                source,
            })?;
            object.insert((*key).to_string(), value);
        }
        if !self.feature_gates.is_empty() {
            let gates: serde_json::Map<String, serde_json::Value> = self
                .feature_gates
                .iter()
                .map(|(g, on)| ((*g).to_string(), serde_json::Value::Bool(*on)))
                .collect();
            object.insert("featureGates".into(), serde_json::Value::Object(gates));
        }
        Ok(())
    }

    /// The `--feature-gates` value, when there are gates to set.
    pub fn feature_gates_flag(&self) -> Option<String> {
        (!self.feature_gates.is_empty()).then(|| {
            self.feature_gates
                .iter()
                .map(|(g, on)| format!("{g}={on}"))
                .collect::<Vec<_>>()
                .join(",")
        })
    }
}

#[cfg(test)]
mod tests;
