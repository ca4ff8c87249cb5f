//! Features no release we run turns on by default, which the suite turns on
//! at bring-up when a scenario it runs names them: the workload APIs of
//! `scheduling.k8s.io` (Workload, PodGroup) and gang scheduling with a
//! topology constraint, which gang jobs on Trn2 UltraServers need.
//!
//! Everything else runs with each release's defaults (the module docs of
//! [`crate::versions`]); these are the exception because without them no
//! release schedules a PodGroup at all, and a user who wants gangs must
//! turn on the same gates (`docs/multi-node.md` says which). The scenario
//! harness collects the features of the scenarios it will run, asks
//! [`Release::enablement`] what that takes, prints it, and passes it to the
//! cluster ([`crate::cluster::ClusterConfig::enable`]); a release that does
//! not serve the API at all skips the scenario with
//! [`Release::lacks_opt_in`] as the reason.
//!
//! Stages from `pkg/features/kube_features.go` of v1.37.2 and
//! v1.38.0-beta.0, the served versions from `pkg/controlplane/instance.go`
//! (`scheduling.k8s.io/v1beta1` is in `betaAPIGroupVersionsDisabledByDefault`
//! in both) and `pkg/registry/scheduling/rest/storage_scheduling.go` (the
//! `podgroups` and `workloads` storage exist only with `GenericWorkload`
//! on). PodGroup v1beta1 is `introduced=1.37`; before 1.37 there is no
//! v1beta1 PodGroup to run the scenarios on.

use super::{Release, Stage};

/// A feature the suite turns on for the scenarios that need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptInFeature {
    /// `scheduling.k8s.io/v1beta1` Workload and PodGroup, a pod's
    /// `spec.schedulingGroup.podGroupName`, the scheduler's `GangScheduling`
    /// plugin (`schedulingPolicy.gang.minCount`) and the controller
    /// manager's PodGroup protection controller.
    GenericWorkload,
    /// A PodGroup's `schedulingConstraints.topology[{key}]` (one node-label
    /// key: every pod of the group in one value of it) and the scheduler's
    /// `TopologyPlacementGenerator` plugin. Depends on `GenericWorkload`.
    TopologyAwareWorkloadScheduling,
}

impl OptInFeature {
    /// The feature gate's name.
    pub fn gate(self) -> &'static str {
        match self {
            Self::GenericWorkload => "GenericWorkload",
            Self::TopologyAwareWorkloadScheduling => "TopologyAwareWorkloadScheduling",
        }
    }

    /// Where the feature stands in release `1.minor`; `None` where the
    /// release has no v1beta1 API for it (before 1.37).
    pub fn stage(self, minor: u32) -> Option<Stage> {
        match (self, minor) {
            (_, ..=36) => None,
            (Self::GenericWorkload, _) => Some(Stage::BetaOff),
            (Self::TopologyAwareWorkloadScheduling, 37) => Some(Stage::Alpha),
            (Self::TopologyAwareWorkloadScheduling, _) => Some(Stage::BetaOff),
        }
    }

    /// The API group versions the apiserver must serve for it
    /// (`--runtime-config`): beta groups are off by default.
    pub fn runtime_config(self) -> &'static [&'static str] {
        match self {
            Self::GenericWorkload => &["scheduling.k8s.io/v1beta1=true"],
            Self::TopologyAwareWorkloadScheduling => &[],
        }
    }

    /// The features this one needs on as well (the gate dependencies of
    /// `kube_features.go`).
    pub fn depends_on(self) -> &'static [OptInFeature] {
        match self {
            Self::GenericWorkload => &[],
            Self::TopologyAwareWorkloadScheduling => &[Self::GenericWorkload],
        }
    }
}

/// What a cluster turns on beyond its release's defaults: gates for every
/// control-plane component, and API group versions for the apiserver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enablement {
    /// `(gate, on)`, passed to kube-apiserver, kube-controller-manager and
    /// kube-scheduler. The kubelets keep their defaults: none of them runs
    /// a pod that names a PodGroup (the gang scenarios bind to shadow
    /// nodes), and a kubelet does not read PodGroups.
    pub feature_gates: Vec<(String, bool)>,
    /// kube-apiserver `--runtime-config` entries.
    pub runtime_config: Vec<String>,
    /// One line per feature: why it is turned on (its stage here).
    pub reasons: Vec<String>,
}

impl Enablement {
    pub fn is_empty(&self) -> bool {
        self.feature_gates.is_empty() && self.runtime_config.is_empty()
    }

    /// `GenericWorkload=true, ...; runtime-config scheduling.k8s.io/v1beta1=true`,
    /// for the logs; `nothing` when empty.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "nothing".into();
        }
        let gates: Vec<String> = (self.feature_gates.iter())
            .map(|(g, on)| format!("{g}={on}"))
            .collect();
        let mut text = format!("feature gates {}", gates.join(","));
        if !self.runtime_config.is_empty() {
            text.push_str(&format!(
                "; --runtime-config={}",
                self.runtime_config.join(",")
            ));
        }
        text
    }

    /// The flags of one control-plane component (`apiserver`: with the
    /// runtime-config) on `release`: the release's own gates and
    /// runtime-config merged with these, ours last, as one flag each.
    pub fn control_plane_flags(&self, release: &Release, apiserver: bool) -> Vec<String> {
        let mut gates: Vec<(String, bool)> = (release.feature_gates.iter())
            .map(|(g, on)| ((*g).to_string(), *on))
            .collect();
        for (gate, on) in &self.feature_gates {
            gates.retain(|(g, _)| g != gate);
            gates.push((gate.clone(), *on));
        }
        let mut flags = Vec::new();
        if !gates.is_empty() {
            let text: Vec<String> = gates.iter().map(|(g, on)| format!("{g}={on}")).collect();
            flags.push(format!("--feature-gates={}", text.join(",")));
        }
        let mut runtime: Vec<String> = release
            .runtime_config
            .iter()
            .map(|s| s.to_string())
            .collect();
        for entry in &self.runtime_config {
            if !runtime.contains(entry) {
                runtime.push(entry.clone());
            }
        }
        if apiserver && !runtime.is_empty() {
            flags.push(format!("--runtime-config={}", runtime.join(",")));
        }
        flags
    }
}

impl Release {
    /// Why scenarios needing `needs` cannot run here (the API is not in
    /// this release), or `None` when they can, with [`Self::enablement`].
    pub fn lacks_opt_in(&self, needs: &[OptInFeature]) -> Option<String> {
        let missing: Vec<&str> = (needs.iter())
            .filter(|f| f.stage(self.minor).is_none())
            .map(|f| f.gate())
            .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "needs {}: no scheduling.k8s.io/v1beta1 PodGroup in 1.{} (introduced in 1.37)",
                missing.join(" and "),
                self.minor
            )
        })
    }

    /// What it takes to run scenarios needing `needs` here: each feature
    /// (and what it depends on) that is not on by default gets its gate
    /// and its runtime-config. Features this release lacks are left out
    /// ([`Self::lacks_opt_in`] skips their scenarios).
    pub fn enablement(&self, needs: &[OptInFeature]) -> Enablement {
        let mut all: Vec<OptInFeature> = Vec::new();
        for feature in needs {
            for f in feature.depends_on().iter().chain([feature]) {
                if !all.contains(f) {
                    all.push(*f);
                }
            }
        }
        all.sort();
        let mut out = Enablement::default();
        for f in all {
            let Some(stage) = f.stage(self.minor) else {
                continue;
            };
            if stage.on_by_default() {
                continue;
            }
            out.feature_gates.push((f.gate().to_string(), true));
            for entry in f.runtime_config() {
                if !out.runtime_config.iter().any(|e| e == entry) {
                    out.runtime_config.push((*entry).to_string());
                }
            }
            out.reasons.push(format!(
                "{} is {} in 1.{}",
                f.gate(),
                stage.describe(),
                self.minor
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_turned_on_where_they_exist_and_skipped_before() {
        let needs = [OptInFeature::TopologyAwareWorkloadScheduling];
        for minor in [37, 38] {
            let release = Release::for_minor(minor).unwrap();
            assert_eq!(release.lacks_opt_in(&needs), None, "1.{minor}");
            let e = release.enablement(&needs);
            // The dependency comes along.
            assert_eq!(
                e.feature_gates,
                vec![
                    ("GenericWorkload".to_string(), true),
                    ("TopologyAwareWorkloadScheduling".to_string(), true)
                ],
                "1.{minor}"
            );
            assert_eq!(e.runtime_config, vec!["scheduling.k8s.io/v1beta1=true"]);
            let flags = e.control_plane_flags(release, true);
            assert_eq!(
                flags,
                vec![
                    "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true",
                    "--runtime-config=scheduling.k8s.io/v1beta1=true",
                ]
            );
            assert_eq!(e.control_plane_flags(release, false).len(), 1);
        }
        let r37 = Release::for_minor(37).unwrap();
        assert!(r37.enablement(&needs).reasons[1].contains("alpha"));
        for minor in [34, 35, 36] {
            let release = Release::for_minor(minor).unwrap();
            let why = release.lacks_opt_in(&needs).unwrap();
            assert!(why.contains("TopologyAwareWorkloadScheduling"), "{why}");
            assert!(release.enablement(&needs).is_empty());
        }
    }

    #[test]
    fn nothing_asked_changes_nothing() {
        let r37 = Release::for_minor(37).unwrap();
        let none = r37.enablement(&[]);
        assert!(none.is_empty());
        assert_eq!(none.describe(), "nothing");
        assert_eq!(
            none.control_plane_flags(r37, true),
            r37.control_plane_flags(true)
        );
    }
}
