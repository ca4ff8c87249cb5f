use e2e::DriverKind;

use super::*;

fn nodes() -> Vec<FixtureNode> {
    default_nodes(Path::new("/work/.e2e/fixtures"))
}

#[test]
fn cluster_config_has_cdi_and_one_fixture_per_role() {
    let yaml = cluster_config(&nodes(), false, &ConfigSetup::default()).unwrap();
    let cfg: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(cfg["apiVersion"], "kind.x-k8s.io/v1alpha4");
    assert_eq!(cfg["kind"], "Cluster");
    let patch = cfg["containerdConfigPatches"][0].as_str().unwrap();
    assert!(
        patch.contains("[plugins.\"io.containerd.grpc.v1.cri\"]"),
        "{patch}"
    );
    assert!(patch.contains("enable_cdi = true"), "{patch}");
    assert!(patch.contains("\"/var/run/cdi\""), "{patch}");
    let nodes = cfg["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 8);
    assert_eq!(nodes[0]["role"], "control-plane");
    assert!(nodes[0]["extraMounts"].is_null());
    for (node, (role, ty)) in nodes[1..].iter().zip([
        ("p5", "p5.48xlarge"),
        ("trn2", "trn2.48xlarge"),
        ("trn1", "trn1.32xlarge"),
        ("us-0", "trn2u.48xlarge"),
        ("us-1", "trn2u.48xlarge"),
        ("us-2", "trn2u.48xlarge"),
        ("us-3", "trn2u.48xlarge"),
    ]) {
        assert_eq!(node["role"], "worker");
        assert_eq!(node["labels"]["node.kubernetes.io/instance-type"], ty);
        // The scenarios find kind's generated node names by this label.
        assert_eq!(node["labels"]["e2e.aws-dra.dev/node"], role);
        let m = &node["extraMounts"][0];
        assert_eq!(m["hostPath"], format!("/work/.e2e/fixtures/{role}"));
        assert_eq!(m["containerPath"], FIXTURE_MOUNT);
        assert_eq!(m["readOnly"], true);
    }
}

#[test]
fn the_labelled_instance_types_are_in_the_charts_default_affinity() {
    // Otherwise the DaemonSets would not schedule on the kind workers.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for n in nodes() {
        for (chart, kind) in [
            ("efa-dra-driver", DriverKind::Efa),
            ("neuron-dra-driver", DriverKind::Neuron),
        ] {
            let runs = e2e::kind_host::roles()
                .iter()
                .any(|(r, _, d)| *r == n.role && d.contains(&kind));
            if !runs {
                continue;
            }
            let values: Value = serde_saphyr::from_str(
                &std::fs::read_to_string(root.join("charts").join(chart).join("values.yaml"))
                    .unwrap(),
            )
            .unwrap();
            let types = values["nodeAffinity"]["instanceTypes"].as_array().unwrap();
            assert!(
                types.iter().any(|t| t == n.instance_type()),
                "{chart} does not select {}",
                n.instance_type()
            );
        }
    }
}

#[test]
fn offline_config_has_no_default_cni_and_cgroup_v1_is_allowed() {
    let v1_setup = ConfigSetup {
        cgroup_v1: true,
        kube_proxy_mode: None,
    };
    let cfg: Value =
        serde_saphyr::from_str(&cluster_config(&nodes(), true, &v1_setup).unwrap()).unwrap();
    assert_eq!(cfg["networking"]["disableDefaultCNI"], true);
    let patches: Vec<&str> = cfg["kubeadmConfigPatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert!(patches[0].contains("failCgroupV1: false"), "{patches:?}");
    // A skipPhases patch would replace kind's own list, whose
    // `preflight` (refuses cgroup v1, pulls images) must stay skipped;
    // CoreDNS is built here, so its addon runs.
    assert!(!yaml_has_skip_phases(&patches), "{patches:?}");
    let plain: Value =
        serde_saphyr::from_str(&cluster_config(&nodes(), false, &ConfigSetup::default()).unwrap())
            .unwrap();
    assert!(plain["networking"].is_null() && plain["kubeadmConfigPatches"].is_null());
}

#[test]
fn releases_built_with_the_iptables_stand_in_run_kube_proxy_on_nftables() {
    let v138 = e2e::KubernetesVersion::resolve("1.38").unwrap();
    let v137 = e2e::KubernetesVersion::resolve("1.37").unwrap();
    assert_eq!(kube_proxy_mode(&v138), Some("nftables"));
    assert_eq!(kube_proxy_mode(&v137), None);
    let setup = ConfigSetup {
        cgroup_v1: true,
        kube_proxy_mode: kube_proxy_mode(&v138),
    };
    let cfg: Value =
        serde_saphyr::from_str(&cluster_config(&nodes(), true, &setup).unwrap()).unwrap();
    assert_eq!(cfg["networking"]["kubeProxyMode"], "nftables");
    assert_eq!(cfg["networking"]["disableDefaultCNI"], true);
}

fn yaml_has_skip_phases(patches: &[&str]) -> bool {
    patches.iter().any(|p| p.contains("skipPhases"))
}

#[test]
fn without_docker_the_message_names_cluster_local() {
    let m = no_docker_message("no Docker engine answers");
    assert!(m.contains("--cluster local"), "{m}");
}
