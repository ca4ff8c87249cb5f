use super::*;

#[test]
fn parses_exact_versions() {
    for (text, ok) in [
        ("v1.34.4", true),
        ("v1.37.2", true),
        ("1.34.4", false),
        ("v1.34", false),
        ("v1.34.4.1", false),
        ("v1.x.4", false),
        ("v1.38.0-beta.0", true),
        ("v1.38.0-alpha.3", true),
        ("v1.38.0-rc.1", true),
        ("v1.38.0-beta", false),
        ("v1.38.0-beta.", false),
        ("v1.38.0-gamma.0", false),
        ("v1.38.0-beta.0.1", false),
        ("v1.38.+0", false),
    ] {
        assert_eq!(KubernetesVersion::parse(text).is_ok(), ok, "{text}");
    }
    let beta = KubernetesVersion::parse("v1.38.0-beta.0").unwrap();
    assert_eq!(beta.to_string(), "v1.38.0-beta.0");
    assert_eq!(beta.staging_version(), "v0.38.0-beta.0");
    assert_eq!(beta.pre.as_deref(), Some("beta.0"));
    let v = KubernetesVersion::parse("v1.34.4").unwrap();
    assert_eq!(v.staging_version(), "v0.34.4");
    assert_eq!(v.to_string(), "v1.34.4");
}

#[test]
fn resolves_minors_and_exact_versions() {
    for (text, want) in [
        ("1.37", Some("v1.37.2")),
        ("v1.34", Some("v1.34.4")),
        ("1.34.2", Some("v1.34.2")),
        ("v1.37.2", Some("v1.37.2")),
        (" 1.36 ", Some("v1.36.3")),
        ("1.38", Some("v1.38.0-beta.0")),
        ("v1.38.0-beta.0", Some("v1.38.0-beta.0")),
        ("1.38.0-beta.0", Some("v1.38.0-beta.0")),
        ("1.38-beta.0", None),
        ("1.37.2-beta", None),
        ("1.33", None),
        ("1.40.1", None),
        ("2.37", None),
        ("latest", None),
        ("1", None),
    ] {
        let got = KubernetesVersion::resolve(text).ok().map(|v| v.to_string());
        assert_eq!(got.as_deref(), want, "{text}");
    }
    for text in ["1.33", "latest", "1.37.2-beta"] {
        let err = KubernetesVersion::resolve(text).unwrap_err().to_string();
        assert!(
            err.contains("1.34, 1.35, 1.36, 1.37, 1.38"),
            "{text}: {err}"
        );
    }
}

#[test]
fn every_release_lists_every_feature_once() {
    let all = [
        DraFeature::AdminAccess,
        DraFeature::PrioritizedList,
        DraFeature::PartitionableDevices,
        DraFeature::ConsumableCapacity,
        DraFeature::DeviceTaints,
        DraFeature::DeviceTaintRules,
        DraFeature::ExtendedResource,
        DraFeature::ResourceClaimDeviceStatus,
        DraFeature::ResourceHealthStatus,
    ];
    for r in RELEASES {
        assert_eq!(r.features.len(), all.len(), "1.{}", r.minor);
        for f in all {
            assert!(r.stage(f).is_some(), "1.{} lacks {f:?}", r.minor);
        }
        assert_eq!(r.version().to_string(), r.pinned);
    }
    for minor in CI_RELEASES {
        assert!(Release::for_minor(minor).is_ok());
    }
}

#[test]
fn reasons_name_the_gate_and_its_stage() {
    let old = Release::for_minor(34).unwrap();
    let new = Release::for_minor(37).unwrap();
    assert_eq!(new.lacks(&[DraFeature::DeviceTaintRules]), None);
    assert_eq!(old.lacks(&[DraFeature::AdminAccess]), None);
    let why = old
        .lacks(&[DraFeature::AdminAccess, DraFeature::DeviceTaintRules])
        .unwrap();
    assert_eq!(
        why,
        "needs DRADeviceTaintRules (alpha and off by default in 1.34)"
    );
    let r36 = Release::for_minor(36).unwrap();
    assert!(r36.has(DraFeature::DeviceTaints));
    assert!(!r36.has(DraFeature::DeviceTaintRules));
    assert_eq!(old.feature_gates_flag(), None);
    assert!(old.control_plane_flags(true).is_empty());
    let mut config = serde_json::json!({"kind": "KubeletConfiguration"});
    new.apply_to_kubelet_config(&mut config).unwrap();
    assert_eq!(config["failCgroupV1"], serde_json::json!(false));
    assert!(config.get("featureGates").is_none());
}

#[test]
fn gates_we_set_reach_every_component() {
    let release = Release {
        minor: 99,
        pinned: "v1.99.0",
        feature_gates: &[("DRADeviceTaintRules", true), ("DRAAdminAccess", false)],
        runtime_config: &["resource.k8s.io/v1alpha3=true"],
        kubelet_config: &[("maxPods", "12")],
        features: &[
            (DraFeature::DeviceTaintRules, Stage::Alpha),
            (DraFeature::AdminAccess, Stage::Ga),
        ],
    };
    assert!(release.has(DraFeature::DeviceTaintRules));
    assert!(!release.has(DraFeature::AdminAccess));
    assert_eq!(
        release.control_plane_flags(true),
        [
            "--feature-gates=DRADeviceTaintRules=true,DRAAdminAccess=false",
            "--runtime-config=resource.k8s.io/v1alpha3=true"
        ]
    );
    assert_eq!(release.control_plane_flags(false).len(), 1);
    let mut config = serde_json::json!({});
    release.apply_to_kubelet_config(&mut config).unwrap();
    assert_eq!(config["maxPods"], serde_json::json!(12));
    assert_eq!(
        config["featureGates"],
        serde_json::json!({"DRADeviceTaintRules": true, "DRAAdminAccess": false})
    );
}
