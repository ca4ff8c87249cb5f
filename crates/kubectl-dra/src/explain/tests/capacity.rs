//! EFAs shared by capacity: `explain` adds the claims' shares up against
//! the adapter as the scheduler does, so a claim waits exactly when the
//! scheduler keeps it Pending.

use super::*;

/// One p5 EFA published for sharing, as `efa-driver --sharing capacity`
/// publishes it.
const SHARED_EFA: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: p5-efa}
spec:
  driver: efa.networking.k8s.aws
  nodeName: p5
  pool: {name: p5, generation: 1, resourceSliceCount: 1}
  devices:
  - name: efa-0000-4f-00-0
    allowMultipleAllocations: true
    capacity:
      bandwidth:
        value: 100G
        requestPolicy:
          default: 25G
          validRange: {min: 5G, max: 100G, step: 5G}
"#;

fn share_claim(name: &str, bandwidth: Option<&str>) -> String {
    let capacity = bandwidth
        .map(|b| format!("        capacity:\n          requests: {{bandwidth: {b}}}\n"))
        .unwrap_or_default();
    claim(
        name,
        &format!(
            "  devices:\n    requests:\n    - name: efa\n      exactly:\n        deviceClassName: efa.networking.k8s.aws\n{capacity}"
        ),
    )
}

/// `share_claim` allocated a share consuming `consumed`.
fn allocated(name: &str, consumed: &str) -> String {
    format!(
        "{}status:\n  allocation:\n    devices:\n      results:\n      - {{request: efa, driver: efa.networking.k8s.aws, pool: p5, device: efa-0000-4f-00-0, shareID: {name}-0000-4000-8000-000000000000, consumedCapacity: {{bandwidth: {consumed}}}}}\n",
        share_claim(name, None)
    )
}

#[test]
fn shares_fill_an_efa_and_the_next_claim_waits() {
    let holders: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| allocated(&format!("1{n}"), "25G"))
        .collect();
    let mut docs: Vec<&str> = vec![CLASSES, SHARED_EFA];
    docs.extend(holders.iter().map(String::as_str));
    // Three quarters taken: a fourth claim of the default share fits, and
    // so does one asking for 23G (a 25G share).
    let fourth = share_claim("fourth", Some("23G"));
    let inv = inventory(&[&docs[..], &[fourth.as_str()]].concat());
    let e = explain_one(&inv, "fourth");
    assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
    // 30G does not fit in the 25G left.
    let big = share_claim("big", Some("30G"));
    let inv = inventory(&[&docs[..], &[big.as_str()]].concat());
    let e = explain_one(&inv, "big");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    let all = text(&e);
    assert!(
        all.contains("not enough bandwidth left to share: needs 30G, 25G left"),
        "{all}"
    );
    // The adapter full: a fifth default share waits.
    let full = allocated("1d", "25G");
    let fifth = share_claim("fifth", None);
    let inv = inventory(&[&docs[..], &[full.as_str(), fifth.as_str()]].concat());
    let e = explain_one(&inv, "fifth");
    assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
    let all = text(&e);
    assert!(all.contains("needs 25G, 0 left"), "{all}");
    // An allocated share is checked without counting itself.
    let e = explain_one(&inv, "1d");
    assert_eq!(e.allocatable, Allocatable::Allocated, "{}", text(&e));
    assert!(e.problems.is_empty(), "{:?}", e.problems);
}

#[test]
fn a_share_outside_the_policy_is_refused() {
    for (bandwidth, why) in [
        (
            "150G",
            "150G of capacity bandwidth is outside the device's request policy",
        ),
        ("0", ""),
    ] {
        let c = share_claim("c", Some(bandwidth));
        let inv = inventory(&[CLASSES, SHARED_EFA, &c]);
        let e = explain_one(&inv, "c");
        if why.is_empty() {
            // Below the minimum: rounded up to 5G, which fits.
            assert_eq!(e.allocatable, Allocatable::Yes, "{}", text(&e));
        } else {
            assert_eq!(e.allocatable, Allocatable::No, "{}", text(&e));
            assert!(text(&e).contains(why), "{}", text(&e));
        }
    }
}
