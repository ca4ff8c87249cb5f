use super::*;

#[test]
fn neuron_claims_pair_chips_and_efas_on_their_device_group() {
    for chips in [1, 4, 8, 16] {
        let c = ClaimKind::NeuronWithEfas { chips, efas: chips }.claim("c");
        let devices = &c["spec"]["devices"];
        let requests = devices["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0]["exactly"]["deviceClassName"], "neuron.aws.com");
        assert_eq!(requests[0]["exactly"]["count"], chips);
        assert_eq!(
            requests[1]["exactly"]["deviceClassName"],
            "efa.networking.k8s.aws"
        );
        assert_eq!(requests[1]["exactly"]["count"], chips);
        assert_eq!(
            devices["constraints"][0]["matchAttribute"],
            format!("resource.aws.com/devicegroup{chips}_id")
        );
        assert_eq!(
            devices["constraints"][0]["requests"],
            serde_json::json!(["neurons", "efas"])
        );
        // The API types accept it.
        let _: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(c).unwrap();
    }
}

#[test]
fn the_gpu_claim_takes_the_efas_of_its_pcie_root() {
    let c = ClaimKind::GpuWithEfas { efas: 4 }.claim("g");
    let devices = &c["spec"]["devices"];
    assert_eq!(
        devices["requests"][0]["exactly"]["deviceClassName"],
        "gpu.nvidia.com"
    );
    assert_eq!(devices["requests"][0]["exactly"]["count"], 1);
    assert_eq!(devices["requests"][1]["exactly"]["count"], 4);
    assert_eq!(
        devices["constraints"][0]["matchAttribute"],
        "resource.kubernetes.io/pcieRoot"
    );
    assert!(devices.get("config").is_none());
}

#[test]
fn the_ultraserver_claim_selects_the_whole_node_device_with_its_mode() {
    let c = ClaimKind::UltraServerNode.claim("u");
    let devices = &c["spec"]["devices"];
    let request = &devices["requests"][0]["exactly"];
    assert_eq!(request["count"], 1);
    assert!(
        request["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap()
            .contains("neuron_node")
    );
    assert!(devices.get("constraints").is_none());
    assert_eq!(
        devices["config"][0]["opaque"]["parameters"]["ultraserverMode"],
        4
    );
    let _: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(c).unwrap();
}

#[test]
fn kinds_have_distinct_dns_label_names() {
    let kinds = [
        ClaimKind::GpuWithEfas { efas: 4 },
        ClaimKind::NeuronWithEfas { chips: 1, efas: 1 },
        ClaimKind::NeuronWithEfas {
            chips: 16,
            efas: 16,
        },
        ClaimKind::UltraServerNode,
    ];
    let names: std::collections::BTreeSet<String> = kinds.iter().map(|k| k.name()).collect();
    assert_eq!(names.len(), kinds.len());
    for n in &names {
        assert!(
            n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
            "{n}"
        );
    }
}

#[test]
fn pods_use_their_own_claim_and_only_the_bench_nodes() {
    let p = pod("neuron4-4efa-00007", "claim-7", ("bench/label", "true"));
    assert_eq!(
        p["spec"]["resourceClaims"][0]["resourceClaimName"],
        "claim-7"
    );
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["claims"][0]["name"],
        "devices"
    );
    assert_eq!(p["spec"]["nodeSelector"]["bench/label"], "true");
    assert_eq!(p["spec"]["tolerations"][0]["operator"], "Exists");
    let _: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
}
