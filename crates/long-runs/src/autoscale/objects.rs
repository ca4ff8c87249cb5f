//! What the Karpenter run writes and applies besides `examples/`: the
//! instance types it offers Karpenter (kwok's file format), the
//! KWOKNodeClass and NodePool, and the claims no offered type can satisfy.

use serde_json::{Value, json};

/// Names of the NodePool and KWOKNodeClass the run creates.
pub const NODE_POOL: &str = "aws-dra";
/// The one zone of every offering.
pub const ZONE: &str = "test-zone-a";

/// An instance type as the run offers it: what kwok's loader needs. Prices
/// are on-demand list prices of us-east-1 rounded to the dollar, there only
/// so that Karpenter's cheapest-first choice among the types that fit acts
/// as it would on AWS; nothing else reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offer {
    pub name: &'static str,
    pub vcpus: u32,
    pub memory_gib: u32,
    pub price: f64,
}

/// Every instance type both drivers have a model of, with its offer.
pub const OFFERS: [Offer; 8] = [
    offer("p4d.24xlarge", 96, 1152, 33.0),
    offer("p5.48xlarge", 192, 2048, 55.0),
    offer("p5en.48xlarge", 192, 2048, 63.0),
    offer("trn1.32xlarge", 128, 512, 22.0),
    offer("trn1n.32xlarge", 128, 512, 25.0),
    offer("trn2.48xlarge", 192, 2048, 45.0),
    offer("trn2u.48xlarge", 192, 2048, 60.0),
    offer("inf2.48xlarge", 192, 768, 13.0),
];

const fn offer(name: &'static str, vcpus: u32, memory_gib: u32, price: f64) -> Offer {
    Offer {
        name,
        vcpus,
        memory_gib,
        price,
    }
}

/// The offers of `names`, in that order; an unknown name is an error
/// naming the known ones.
pub fn offers(names: &[String]) -> Result<Vec<Offer>, String> {
    names
        .iter()
        .map(|n| {
            OFFERS.iter().find(|o| o.name == n).copied().ok_or_else(|| {
                let known: Vec<_> = OFFERS.iter().map(|o| o.name).collect();
                format!("no offer for {n}: the run offers {}", known.join(", "))
            })
        })
        .collect()
}

/// The instance-types file of Karpenter's kwok provider
/// (`INSTANCE_TYPES_FILE_PATH`, kwok's `InstanceTypeOptions`): one
/// on-demand offering in [`ZONE`] per type.
pub fn kwok_instance_types(offers: &[Offer]) -> Value {
    Value::Array(
        offers
            .iter()
            .map(|o| {
                json!({
                    "name": o.name,
                    "architecture": "amd64",
                    "operatingSystems": ["linux"],
                    "resources": {
                        "cpu": o.vcpus.to_string(),
                        "memory": format!("{}Gi", o.memory_gib),
                        "pods": "110",
                    },
                    "offerings": [{
                        "Price": o.price,
                        "Available": true,
                        "Requirements": [
                            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                        ],
                    }],
                })
            })
            .collect(),
    )
}

/// The KWOKNodeClass (its CRD defaults its status to Ready).
pub fn node_class() -> Value {
    json!({
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_POOL},
        "spec": {},
    })
}

/// The NodePool: any offered type, on-demand, never consolidated or
/// expired during the run.
pub fn node_pool(offers: &[Offer]) -> Value {
    let names: Vec<_> = offers.iter().map(|o| o.name).collect();
    json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": NODE_POOL},
        "spec": {
            "template": {"spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_POOL},
                "requirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": names},
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                ],
                "expireAfter": "Never",
            }},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"},
        },
    })
}

/// A claim template and the pod using it, shaped as `examples/` writes them.
fn claim_and_pod(name: &str, devices: Value) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}},
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": name}],
                "containers": [{
                    "name": "app",
                    "image": "public.ecr.aws/docker/library/busybox:1.36",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "devices"}]},
                }],
            },
        }),
    ]
}

/// Claims no offered type can satisfy, each as (what it asks, its objects):
/// AWS's 4-chip shape with 8 EFAs in the chips' group of 4 (a trn2 group of
/// 4 chips has 4 EFAs, a trn1 group 2), and 2 EFAs on distinct PCIe root
/// complexes (`distinctAttribute`, which the scheduler allocates on a p5
/// and Karpenter's allocator does not implement).
pub fn unsatisfiable() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        (
            "4 chips and 8 EFAs sharing devicegroup4_id",
            claim_and_pod(
                "four-chips-eight-efas",
                json!({
                    "requests": [
                        {"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com", "count": 4}},
                        {"name": "efas", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 8}},
                    ],
                    "constraints": [
                        {"requests": ["neurons", "efas"], "matchAttribute": "resource.aws.com/devicegroup4_id"},
                    ],
                }),
            ),
        ),
        (
            "2 EFAs on distinct PCIe roots (distinctAttribute)",
            claim_and_pod(
                "two-efas-distinct-roots",
                json!({
                    "requests": [
                        {"name": "efas", "exactly": {"deviceClassName": "efa.networking.k8s.aws", "count": 2}},
                    ],
                    "constraints": [
                        {"requests": ["efas"], "distinctAttribute": "resource.kubernetes.io/pcieRoot"},
                    ],
                }),
            ),
        ),
    ]
}

/// The DeviceClasses the claims among `objects` request, sorted, without
/// repeats. Our charts name each class after its driver, so these are the
/// drivers Karpenter should name in `karpenter.sh/requested-dra-drivers`.
pub fn requested_classes(objects: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = objects
        .iter()
        .filter_map(|o| match o["kind"].as_str() {
            Some("ResourceClaimTemplate") => Some(&o["spec"]["spec"]["devices"]["requests"]),
            Some("ResourceClaim") => Some(&o["spec"]["devices"]["requests"]),
            _ => None,
        })
        .filter_map(Value::as_array)
        .flatten()
        .flat_map(|r| {
            let mut names = vec![r["exactly"]["deviceClassName"].clone()];
            if let Some(subs) = r["firstAvailable"].as_array() {
                names.extend(subs.iter().map(|s| s["deviceClassName"].clone()));
            }
            names
        })
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The name of the first Pod among `objects`.
pub fn pod_name(objects: &[Value]) -> Option<String> {
    objects
        .iter()
        .find(|o| o["kind"] == "Pod")
        .and_then(|o| o["metadata"]["name"].as_str())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offer_has_a_fixture_for_the_drivers_to_run_on() {
        let fixtures = sysfs_fixtures::instance_types();
        for o in OFFERS {
            assert!(fixtures.contains(&o.name), "{} has no fixture", o.name);
        }
    }

    #[test]
    fn offers_keep_the_order_asked_and_reject_unknown_types() {
        let got = offers(&["trn2.48xlarge".into(), "p5.48xlarge".into()]).unwrap();
        assert_eq!(
            got.iter().map(|o| o.name).collect::<Vec<_>>(),
            ["trn2.48xlarge", "p5.48xlarge"]
        );
        let err = offers(&["m5.large".into()]).unwrap_err();
        assert!(
            err.contains("m5.large") && err.contains("trn2.48xlarge"),
            "{err}"
        );
    }

    #[test]
    fn the_instance_types_file_has_kwoks_field_names() {
        let file = kwok_instance_types(&offers(&["trn2.48xlarge".into()]).unwrap());
        let t = &file[0];
        assert_eq!(t["name"], "trn2.48xlarge");
        assert_eq!(t["resources"]["cpu"], "192");
        assert_eq!(t["resources"]["memory"], "2048Gi");
        // kwok's KWOKOffering: capitalised Go field names, no json tags.
        let o = &t["offerings"][0];
        assert_eq!(o["Available"], true);
        assert_eq!(o["Requirements"][1]["values"][0], ZONE);
    }

    #[test]
    fn the_node_pool_offers_exactly_the_types_asked() {
        let pool = node_pool(&offers(&["trn1.32xlarge".into(), "trn2.48xlarge".into()]).unwrap());
        let reqs = pool["spec"]["template"]["spec"]["requirements"]
            .as_array()
            .unwrap();
        assert_eq!(reqs[0]["values"], json!(["trn1.32xlarge", "trn2.48xlarge"]));
        assert_eq!(
            pool["spec"]["template"]["spec"]["nodeClassRef"]["name"],
            NODE_POOL
        );
    }

    #[test]
    fn the_requested_classes_of_the_4_chip_example_are_both_drivers() {
        let path =
            local_cluster::paths::repo_root().join("examples/neuron/neuron-4-chips-with-efas.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let objs = e2e::manifests::parse("example", &text).unwrap();
        assert_eq!(
            requested_classes(&objs),
            ["efa.networking.k8s.aws", "neuron.aws.com"]
        );
        let (_, distinct) = &unsatisfiable()[1];
        assert_eq!(requested_classes(distinct), ["efa.networking.k8s.aws"]);
    }

    #[test]
    fn each_unsatisfiable_case_is_a_template_and_its_pod() {
        for (what, objs) in unsatisfiable() {
            let pod = pod_name(&objs).unwrap();
            let template = objs
                .iter()
                .find(|o| o["kind"] == "ResourceClaimTemplate")
                .unwrap();
            assert_eq!(template["metadata"]["name"], pod.as_str(), "{what}");
            let pod_obj = objs.iter().find(|o| o["kind"] == "Pod").unwrap();
            assert_eq!(
                pod_obj["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
                pod.as_str()
            );
        }
    }
}
