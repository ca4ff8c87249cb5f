use super::*;
use k8s_openapi::api::resource::v1::ResourceClaim;

#[test]
fn the_p5_node_is_8_gpus_each_with_the_4_efas_of_its_pcie_root() {
    let (name, claims) = whole_node_claims(Shape::P5, "p");
    assert_eq!(name, "8gpu-32efa-by-pcieroot");
    assert_eq!(claims.len(), 2);
    let (mut gpus, mut efas) = (0, 0);
    for (j, c) in claims.into_iter().enumerate() {
        assert_eq!(c["metadata"]["name"], format!("p-{j}"));
        let devices = &c["spec"]["devices"];
        let requests = devices["requests"].as_array().unwrap();
        let count = |class: &str| -> u64 {
            (requests.iter())
                .filter(|r| r["exactly"]["deviceClassName"] == class)
                .map(|r| r["exactly"]["count"].as_u64().unwrap())
                .sum()
        };
        let here = count(GPU_DRIVER) + count(EFA_DRIVER);
        assert!(here <= u64::from(CLAIM_DEVICE_LIMIT), "{here} devices");
        gpus += count(GPU_DRIVER);
        efas += count(EFA_DRIVER);
        let constraints = devices["constraints"].as_array().unwrap();
        assert_eq!(constraints.len(), 4);
        for (k, c) in constraints.iter().enumerate() {
            let i = j * 4 + k;
            assert_eq!(
                c["requests"],
                json!([format!("gpu{i}"), format!("efas{i}")])
            );
            assert_eq!(c["matchAttribute"], "resource.kubernetes.io/pcieRoot");
        }
        let _: ResourceClaim = serde_json::from_value(c).unwrap();
    }
    assert_eq!((gpus, efas), (8, 32));
}

#[test]
fn the_trn2_node_is_16_chips_and_16_efas_of_one_device_group() {
    for shape in [Shape::Trn2Chips, Shape::Trn2Cores, Shape::Trn2Aws] {
        let (name, claims) = whole_node_claims(shape, "c");
        assert_eq!(name, "neuron16-16efa");
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0]["metadata"]["name"], "c-0");
        assert_eq!(
            claims[0]["spec"]["devices"]["constraints"][0]["matchAttribute"],
            "resource.aws.com/devicegroup16_id"
        );
    }
}

#[test]
fn gang_pods_name_their_group_and_independent_pods_none() {
    let g = pod_group("gang-r0", 16);
    assert_eq!(g["apiVersion"], "scheduling.k8s.io/v1beta1");
    assert_eq!(g["spec"]["schedulingPolicy"]["gang"]["minCount"], 16);
    assert!(g["spec"].get("schedulingConstraints").is_none());
    let claims = ["gang-r0-000-0".to_string(), "gang-r0-000-1".to_string()];
    let p = member("gang-r0-000", &claims, Some("gang-r0"), ("k", "v"));
    assert_eq!(p["spec"]["schedulingGroup"]["podGroupName"], "gang-r0");
    assert_eq!(
        p["spec"]["resourceClaims"],
        json!([
            {"name": "c0", "resourceClaimName": "gang-r0-000-0"},
            {"name": "c1", "resourceClaimName": "gang-r0-000-1"},
        ])
    );
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["claims"],
        json!([{"name": "c0"}, {"name": "c1"}])
    );
    let _: k8s_openapi::api::core::v1::Pod = serde_json::from_value(p).unwrap();
    let p = member("solo-r0-000", &claims[..1], None, ("k", "v"));
    assert!(p["spec"].get("schedulingGroup").is_none());
}

#[test]
fn times_keep_every_repetition_their_median_and_whether_all_bound() {
    let mut t = GangTimes::default();
    t.push(3.0, 16, 16);
    t.push(1.0, 16, 16);
    t.push(2.0, 16, 16);
    assert_eq!(t.median_bind_s, Some(2.0));
    assert!(t.all_bound);
    t.push(9.0, 15, 16);
    assert_eq!(t.median_bind_s, Some(2.5));
    assert!(!t.all_bound);
    assert_eq!(t.bound, vec![16, 16, 16, 15]);
}
