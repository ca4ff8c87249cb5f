//! Scenarios over our drivers' real `discover` output (p5, trn2, trn1) and
//! claims shaped like those in `examples/`.

use std::path::Path;

use super::*;
use crate::inventory::Inventory;

const CLASSES: &str = include_str!("../../tests/fixtures/classes.yaml");
const P5_EFA: &str = include_str!("../../tests/fixtures/p5-efa.yaml");
const TRN1_EFA: &str = include_str!("../../tests/fixtures/trn1-efa.yaml");
const TRN1_NEURON: &str = include_str!("../../tests/fixtures/trn1-neuron.yaml");
const TRN2_EFA: &str = include_str!("../../tests/fixtures/trn2-efa.yaml");
const TRN2_NEURON: &str = include_str!("../../tests/fixtures/trn2-neuron.yaml");
const NEURON_4: &str = include_str!("../../../../examples/neuron/neuron-4-chips-with-efas.yaml");

fn inventory(docs: &[&str]) -> Inventory {
    let mut inv = Inventory::default();
    for (i, d) in docs.iter().enumerate() {
        inv.add_text(Path::new(&format!("doc{i}")), d)
            .unwrap_or_else(|e| panic!("doc{i}: {e}"));
    }
    inv
}

fn claim(name: &str, body: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{body}"
    )
}

/// Explains claim `name` (or, with `pod:` prefix, that pod's claims) and
/// returns the first explanation.
fn explain_one(inv: &Inventory, what: &str) -> Explanation {
    let world = World::new(inv);
    let (subjects, scope) = match what.strip_prefix("pod:") {
        Some(pod) => subjects_for_pod(inv, "default", pod).unwrap_or_else(|e| panic!("{e}")),
        None => (
            subjects_for_claim(inv, "default", what).unwrap_or_else(|e| panic!("{e}")),
            Scope::default(),
        ),
    };
    let first = subjects
        .first()
        .unwrap_or_else(|| panic!("no subject for {what}"));
    explain(&world, first, &scope)
}

struct Case {
    name: &'static str,
    docs: Vec<String>,
    subject: &'static str,
    allocatable: Allocatable,
    /// Words the verdict, advice or rejection reasons must contain.
    words: &'static [&'static str],
}

fn text(e: &Explanation) -> String {
    format!("{}\n{}", e.verdict, crate::render::explanation(e))
}

#[test]
fn verdicts_and_reasons() {
    let s = |x: &str| x.to_string();
    let one_efa = claim(
        "one-efa",
        "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n",
    );
    let allocated_holder = format!(
        "{}status:\n  allocation:\n    devices:\n      results:\n{}",
        claim("holder", "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        allocationMode: All\n"),
        (0..8)
            .map(|i| {
                let bus = ["10", "20", "90", "a0"][i / 2];
                let dev = ["19", "1a"][i % 2];
                format!("      - {{request: efas, driver: efa.networking.k8s.aws, pool: trn1, device: efa-0000-{bus}-{dev}-0}}\n")
            })
            .collect::<String>()
    );
    let trn1_one_efa = claim(
        "trn1-efa",
        "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"efa.networking.k8s.aws\"].instanceType == \"trn1.32xlarge\"'}\n",
    );
    let cases = vec![
        Case {
            name: "trn1 cannot pair 4 chips with 4 EFAs (one EFA per two chips)",
            docs: vec![s(CLASSES), s(TRN1_EFA), s(TRN1_NEURON), s(NEURON_4)],
            subject: "pod:neuron-4-chips-with-efas",
            allocatable: Allocatable::No,
            words: &[
                "matchAttribute",
                "resource.aws.com/devicegroup4_id",
                "\"efas\" has 2 of 4",
                "to 2",
            ],
        },
        Case {
            name: "trn2 pairs 4 chips with 4 EFAs",
            docs: vec![s(CLASSES), s(TRN2_EFA), s(TRN2_NEURON), s(NEURON_4)],
            subject: "pod:neuron-4-chips-with-efas",
            allocatable: Allocatable::Yes,
            words: &["Allocatable now", "trn2"],
        },
        Case {
            name: "one EFA on a p5",
            docs: vec![s(CLASSES), s(P5_EFA), one_efa.clone()],
            subject: "one-efa",
            allocatable: Allocatable::Yes,
            words: &["p5"],
        },
        Case {
            name: "every trn1 EFA is held by another claim",
            docs: vec![
                s(CLASSES),
                s(TRN1_EFA),
                s(TRN1_NEURON),
                allocated_holder.clone(),
                trn1_one_efa.clone(),
            ],
            subject: "trn1-efa",
            allocatable: Allocatable::No,
            words: &[
                "already allocated to claim default/holder",
                "Free the devices",
            ],
        },
        Case {
            name: "the holder itself is allocated, and says why its devices fit",
            docs: vec![s(CLASSES), s(TRN1_EFA), allocated_holder.clone()],
            subject: "holder",
            allocatable: Allocatable::Allocated,
            words: &[
                "Allocated: 8 device(s) on node trn1",
                "DeviceClass \"efa.networking.k8s.aws\" selects it",
            ],
        },
        Case {
            name: "a selector that no device satisfies",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "numa7",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        count: 2\n        selectors:\n        - cel: {expression: 'device.attributes[\"resource.kubernetes.io\"].?numaNode.orValue(-1) == 7'}\n",
                ),
            ],
            subject: "numa7",
            allocatable: Allocatable::No,
            words: &[
                "request selector #0",
                "numaNode.orValue(-1) == 7",
                "is false",
                "Change or drop that selector",
            ],
        },
        Case {
            name: "a selector that fails at run time (unguarded read of a missing attribute)",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "unguarded",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"resource.aws.com\"].devicegroup4_id == \"x\"'}\n",
                ),
            ],
            subject: "unguarded",
            allocatable: Allocatable::No,
            words: &["fails at run time", "has(...)"],
        },
        Case {
            name: "a runtime error on one node stops the pod even where the claim fits",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                s(TRN1_EFA),
                claim(
                    "by-group",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"resource.aws.com\"].devicegroup4_id == \"88a3c6ad1661fe1d\"'}\n",
                ),
            ],
            subject: "by-group",
            allocatable: Allocatable::No,
            words: &[
                "of node p5 (no such key: devicegroup4_id)",
                "whole attempt for the pod, on every node",
            ],
        },
        Case {
            name: "a selector the API server refuses is called invalid, not a verdict on devices",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "ext",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"efa.networking.k8s.aws\"].rdmaDevice.noSuchFunction() == \"x\"'}\n",
                ),
            ],
            subject: "ext",
            allocatable: Allocatable::No,
            words: &[
                "invalid selector",
                "undeclared reference to 'noSuchFunction'",
            ],
        },
        Case {
            name: "string reverse() is a run-time error in the scheduler (strings v2 has none)",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "rev",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"efa.networking.k8s.aws\"].rdmaDevice.reverse() == \"x\"'}\n",
                ),
            ],
            subject: "rev",
            allocatable: Allocatable::No,
            words: &["runtime error"],
        },
        Case {
            name: "a DeviceClass that does not exist",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "nogpu",
                    "  devices:\n    requests:\n    - name: gpu\n      exactly:\n        deviceClassName: gpu.nvidia.com\n",
                ),
            ],
            subject: "nogpu",
            allocatable: Allocatable::No,
            words: &["DeviceClass \"gpu.nvidia.com\", which does not exist"],
        },
        Case {
            name: "All EFAs across roots cannot share one pcieRoot",
            docs: vec![
                s(CLASSES),
                s(P5_EFA),
                claim(
                    "all-roots",
                    "  devices:\n    requests:\n    - name: first\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        allocationMode: All\n    constraints:\n    - requests: [first, efas]\n      matchAttribute: resource.kubernetes.io/pcieRoot\n",
                ),
            ],
            subject: "all-roots",
            allocatable: Allocatable::No,
            words: &[
                "resource.kubernetes.io/pcieRoot",
                "cannot be met",
                "request \"efas\" has 4 of 32 (all matching devices)",
                "narrow its selectors to one value",
            ],
        },
        Case {
            name: "firstAvailable falls back to the alternative that fits",
            docs: vec![
                s(CLASSES),
                s(TRN1_EFA),
                claim(
                    "fallback",
                    "  devices:\n    requests:\n    - name: efas\n      firstAvailable:\n      - name: many\n        deviceClassName: efa.networking.k8s.aws\n        count: 64\n      - name: few\n        deviceClassName: efa.networking.k8s.aws\n        count: 2\n",
                ),
            ],
            subject: "fallback",
            allocatable: Allocatable::Yes,
            words: &["efas/few ->"],
        },
        Case {
            name: "too few devices on any node",
            docs: vec![
                s(CLASSES),
                s(TRN1_EFA),
                s(P5_EFA),
                claim(
                    "greedy",
                    "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        count: 40\n",
                ),
            ],
            subject: "greedy",
            allocatable: Allocatable::No,
            words: &[
                "wants 40 devices but at most 32",
                "node p5 has 32",
                "Lower the count of request \"efas\" to 32",
            ],
        },
    ];
    let mut failures = Vec::new();
    for case in cases {
        let docs: Vec<&str> = case.docs.iter().map(String::as_str).collect();
        let e = explain_one(&inventory(&docs), case.subject);
        let all = text(&e);
        if e.allocatable != case.allocatable {
            failures.push(format!(
                "{}: allocatable {:?}, want {:?}\n{all}",
                case.name, e.allocatable, case.allocatable
            ));
            continue;
        }
        for w in case.words {
            if !all.contains(w) {
                failures.push(format!("{}: missing {w:?} in\n{all}", case.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A device tainted NoSchedule is rejected unless the request tolerates it.
#[test]
fn taints_are_honoured_and_tolerations_lift_them() {
    let tainted = TRN1_EFA.replacen(
        "      name: efa-0000-10-19-0\n",
        "      name: efa-0000-10-19-0\n      taints:\n      - {key: efa.networking.k8s.aws/admin-queue-closed, value: \"true\", effect: NoSchedule}\n",
        1,
    );
    assert_ne!(tainted, TRN1_EFA, "fixture layout changed");
    let all = |tolerate: bool| {
        claim(
            "all-efas",
            &format!(
                "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        count: 8\n{}",
                if tolerate {
                    "        tolerations:\n        - {key: efa.networking.k8s.aws/admin-queue-closed, operator: Exists, effect: NoSchedule}\n"
                } else {
                    ""
                }
            ),
        )
    };
    let e = explain_one(&inventory(&[CLASSES, &tainted, &all(false)]), "all-efas");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    assert!(
        text(&e).contains(
            "taint efa.networking.k8s.aws/admin-queue-closed=true:NoSchedule is not tolerated"
        ),
        "{}",
        text(&e)
    );
    let e = explain_one(&inventory(&[CLASSES, &tainted, &all(true)]), "all-efas");
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
}

/// A DeviceTaintRule taints a device its slice does not: the rejection
/// names the taint and the rule, and a toleration lifts it.
#[test]
fn device_taint_rules_taint_without_the_slice() {
    let rule = "apiVersion: resource.k8s.io/v1\nkind: DeviceTaintRule\nmetadata: {name: maint-efa}\nspec:\n  deviceSelector: {driver: efa.networking.k8s.aws, pool: trn1, device: efa-0000-10-19-0}\n  taint: {key: example.com/maintenance, value: s14, effect: NoSchedule}\n";
    let pinned = |tolerate: bool| {
        claim(
            "pinned",
            &format!(
                "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {{expression: 'device.attributes[\"resource.kubernetes.io\"].pciBusID == \"0000:10:19.0\"'}}\n{}",
                if tolerate {
                    "        tolerations:\n        - {key: example.com/maintenance, operator: Exists, effect: NoSchedule}\n"
                } else {
                    ""
                }
            ),
        )
    };
    let e = explain_one(
        &inventory(&[CLASSES, TRN1_EFA, rule, &pinned(false)]),
        "pinned",
    );
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    assert!(
        text(&e).contains(
            "taint example.com/maintenance=s14:NoSchedule (from DeviceTaintRule maint-efa) is not tolerated"
        ),
        "{}",
        text(&e)
    );
    let e = explain_one(
        &inventory(&[CLASSES, TRN1_EFA, rule, &pinned(true)]),
        "pinned",
    );
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
    // Without the rule the same claim fits.
    let e = explain_one(&inventory(&[CLASSES, TRN1_EFA, &pinned(false)]), "pinned");
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
}

/// An allocation is checked against the claim: a sound one has no
/// problems; devices on two roots under a pcieRoot constraint, a count not
/// met, a selector now false and a device gone are each named.
#[test]
fn allocations_are_checked_against_the_claim() {
    let allocated = |results: &[(&str, &str)]| {
        format!(
            "{}status:\n  allocation:\n    devices:\n      results:\n{}",
            claim(
                "two",
                "  devices:\n    requests:\n    - name: efas\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        count: 2\n        selectors:\n        - cel: {expression: 'device.attributes[\"efa.networking.k8s.aws\"].instanceType == \"trn1.32xlarge\"'}\n    constraints:\n    - {requests: [efas], matchAttribute: resource.kubernetes.io/pcieRoot}\n"
            ),
            results
                .iter()
                .map(|(pool, dev)| format!("      - {{request: efas, driver: efa.networking.k8s.aws, pool: {pool}, device: {dev}}}\n"))
                .collect::<String>()
        )
    };
    let check = |results: &[(&str, &str)]| {
        let inv = inventory(&[CLASSES, TRN1_EFA, P5_EFA, &allocated(results)]);
        let e = explain_one(&inv, "two");
        assert_eq!(e.allocatable, Allocatable::Allocated, "{}", text(&e));
        e.problems
    };
    let sound = check(&[("trn1", "efa-0000-10-19-0"), ("trn1", "efa-0000-10-1a-0")]);
    assert!(sound.is_empty(), "{sound:?}");
    let roots = check(&[("trn1", "efa-0000-10-19-0"), ("trn1", "efa-0000-20-19-0")]);
    assert!(
        roots
            .iter()
            .any(|p| p
                .contains("matchAttribute resource.kubernetes.io/pcieRoot: the devices differ")),
        "{roots:?}"
    );
    let short = check(&[("trn1", "efa-0000-10-19-0")]);
    assert!(
        short
            .iter()
            .any(|p| p.contains("wants 2 device(s), 1 allocated")),
        "{short:?}"
    );
    let p5 = kubectl_dra_first_p5_efa();
    let wrong = check(&[("trn1", "efa-0000-10-19-0"), ("p5", &p5)]);
    assert!(
        wrong
            .iter()
            .any(|p| p.contains("selector #0") && p.contains("is now false")),
        "{wrong:?}"
    );
    let gone = check(&[("trn1", "efa-0000-10-19-0"), ("trn1", "efa-9999")]);
    assert!(
        gone.iter()
            .any(|p| p.contains("efa-9999 is no longer published")),
        "{gone:?}"
    );
}

/// The name of the first EFA in the p5 fixture.
fn kubectl_dra_first_p5_efa() -> String {
    P5_EFA
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: efa-"))
        .map(|n| format!("efa-{n}"))
        .unwrap_or_default()
}

/// Partitions of one chip share its counters: once one partition is
/// allocated, a second that needs more than is left is rejected.
#[test]
fn shared_counters_run_out() {
    let slice = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-neuron}
spec:
  driver: neuron.aws.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  sharedCounters:
  - name: chip-0
    counters:
      cores: {value: "8"}
  devices:
  - name: chip-0-cores-0-5
    consumesCounters:
    - counterSet: chip-0
      counters:
        cores: {value: "6"}
  - name: chip-0-cores-6-7
    consumesCounters:
    - counterSet: chip-0
      counters:
        cores: {value: "2"}
  - name: chip-0-cores-2-7
    consumesCounters:
    - counterSet: chip-0
      counters:
        cores: {value: "6"}
"#;
    let holder = format!(
        "{}status:\n  allocation:\n    devices:\n      results:\n      - {{request: r, driver: neuron.aws.com, pool: n1, device: chip-0-cores-0-5}}\n",
        claim(
            "holder",
            "  devices:\n    requests:\n    - name: r\n      exactly:\n        deviceClassName: neuron.aws.com\n"
        )
    );
    let wants_six = claim(
        "six",
        "  devices:\n    requests:\n    - name: r\n      exactly:\n        deviceClassName: neuron.aws.com\n        selectors:\n        - cel: {expression: 'device.driver == \"neuron.aws.com\" && device.attributes[\"neuron.aws.com\"].size() == 0'}\n",
    );
    let inv = inventory(&[CLASSES, slice, &holder, &wants_six]);
    let e = explain_one(&inv, "six");
    // chip-0-cores-6-7 (2 cores) still fits in the 2 cores left; the 6-core one does not.
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
    let all = text(&e);
    assert!(
        all.contains("not enough counters left: chip-0/cores needs 6, 2 left"),
        "{all}"
    );
    assert!(
        all.contains("already allocated to claim default/holder"),
        "{all}"
    );
    assert!(all.contains("chip-0-cores-6-7"), "{all}");
}

#[test]
fn pods_bound_to_a_node_only_see_that_node() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  nodeName: p5\n  resourceClaims:\n  - {name: efa, resourceClaimName: trn1-efa}\n  containers:\n  - {name: c, image: x}\n";
    let c = claim(
        "trn1-efa",
        "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n        selectors:\n        - cel: {expression: 'device.attributes[\"efa.networking.k8s.aws\"].instanceType == \"trn1.32xlarge\"'}\n",
    );
    let inv = inventory(&[CLASSES, P5_EFA, TRN1_EFA, pod, &c]);
    let e = explain_one(&inv, "pod:p");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    let all = text(&e);
    assert!(
        all.contains("on node trn1, but the pod may only run on node p5"),
        "{all}"
    );
    assert!(
        all.contains("instanceType == \"trn1.32xlarge\"` is false"),
        "{all}"
    );
}

#[test]
fn extended_resources_served_by_a_device_class() {
    let class = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: efa-ext}\nspec:\n  extendedResourceName: vpc.amazonaws.com/efa\n  selectors:\n  - cel: {expression: 'device.driver == \"efa.networking.k8s.aws\"'}\n";
    let pod = |n: u32| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: x\n    resources:\n      limits: {{vpc.amazonaws.com/efa: \"{n}\"}}\n      requests: {{vpc.amazonaws.com/efa: \"{n}\"}}\n"
        )
    };
    let e = explain_one(&inventory(&[class, TRN1_EFA, &pod(4)]), "pod:p");
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
    assert!(e.subject.contains("extended resources"), "{}", e.subject);
    let e = explain_one(&inventory(&[class, TRN1_EFA, &pod(9)]), "pod:p");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    assert!(
        e.verdict.contains("wants 9 devices but at most 8"),
        "{}",
        e.verdict
    );
}

#[test]
fn an_incomplete_pool_is_not_used() {
    let incomplete = TRN1_EFA.replace("resourceSliceCount: 1", "resourceSliceCount: 2");
    assert_ne!(incomplete, TRN1_EFA, "fixture layout changed");
    let c = claim(
        "one",
        "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n",
    );
    let e = explain_one(&inventory(&[CLASSES, &incomplete, &c]), "one");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    assert!(
        text(&e).contains("is incomplete (1 of 2 slices"),
        "{}",
        text(&e)
    );
}

#[test]
fn a_device_plugin_resource_of_the_bound_node_is_not_a_claim() {
    let class = "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: efa-ext}\nspec:\n  extendedResourceName: vpc.amazonaws.com/efa\n  selectors:\n  - cel: {expression: 'device.driver == \"efa.networking.k8s.aws\"'}\n";
    let node = |q: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: trn1}}\nstatus:\n  allocatable: {{vpc.amazonaws.com/efa: \"{q}\"}}\n"
        )
    };
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default}\nspec:\n  nodeName: trn1\n  containers:\n  - name: c\n    image: x\n    resources:\n      limits: {vpc.amazonaws.com/efa: \"2\"}\n";
    // A device plugin advertises it on the node: the scheduler served the
    // pod from the node, no claim is involved.
    let inv = inventory(&[class, TRN1_EFA, &node("8"), pod]);
    let subjects = subjects_for_pod(&inv, "default", "p").map(|(s, _)| s.len());
    assert!(matches!(subjects, Ok(0) | Err(_)), "{subjects:?}");
    // At 0 (the device plugin gone) the resource is DRA-served.
    let inv = inventory(&[class, TRN1_EFA, &node("0"), pod]);
    let (subjects, _) = subjects_for_pod(&inv, "default", "p").unwrap();
    assert_eq!(subjects.len(), 1);
}

mod capacity;
