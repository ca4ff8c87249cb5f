use super::*;
use crate::prepare::config::InvalidValue;
use crate::prepare::driver::PreparedDevice;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

const DRIVER: &str = "test.example.com";
const UID: &str = "uid-mine";

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Lanes {
    lanes: u32,
}

impl DriverConfig for Lanes {
    const API_VERSIONS: &'static [&'static str] = &["test.example.com/v1"];
    const KIND: &'static str = "Lanes";
    fn validate(&self) -> Result<(), InvalidValue> {
        Ok(())
    }
}

/// A result: (request, driver, device, admin).
type Result4 = (&'static str, &'static str, &'static str, bool);

fn object(uid: &str, results: &[Result4], configs: &[(&str, &[&str], u32)]) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some("ns".into());
    c.metadata.name = Some("mine".into());
    c.metadata.uid = Some(uid.into());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(
                            |(request, driver, device, admin)| DeviceRequestAllocationResult {
                                request: request.to_string(),
                                driver: driver.to_string(),
                                pool: "node".into(),
                                device: device.to_string(),
                                admin_access: admin.then_some(true),
                                ..Default::default()
                            },
                        )
                        .collect(),
                ),
                config: Some(
                    configs
                        .iter()
                        .map(|(source, requests, lanes)| DeviceAllocationConfiguration {
                            source: source.to_string(),
                            requests: (!requests.is_empty())
                                .then(|| requests.iter().map(|r| r.to_string()).collect()),
                            opaque: Some(OpaqueDeviceConfiguration {
                                driver: DRIVER.into(),
                                parameters: RawExtension(serde_json::json!({
                                    "apiVersion": "test.example.com/v1",
                                    "kind": "Lanes",
                                    "lanes": lanes,
                                })),
                            }),
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

fn holder(name: &str, devices: &[(&str, bool)]) -> PreparedClaim {
    PreparedClaim {
        namespace: "ns".into(),
        name: name.into(),
        devices: devices
            .iter()
            .map(|(device, admin)| PreparedDevice {
                request_names: vec!["r".into()],
                pool: "node".into(),
                device: device.to_string(),
                admin_access: *admin,
                cdi_device_ids: vec![],
                share_ids: vec![],
            })
            .collect(),
        cdi_spec_path: "/cdi/x.json".into(),
    }
}

fn mine() -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "mine".into(),
        uid: UID.into(),
    }
}

/// What a resolution came to, in a form a table can spell:
/// `device:request-names:admin:lanes` per device, or the error text.
fn outcome(
    object: Option<&ResourceClaim>,
    prepared: &BTreeMap<String, PreparedClaim>,
) -> Result<Vec<String>, String> {
    resolve_claim::<Lanes>(DRIVER, Some("node"), &mine(), object, prepared)
        .map(|devices| {
            devices
                .iter()
                .map(|d| {
                    format!(
                        "{}:{}:{}:{}",
                        d.allocated.device,
                        d.request_names.join("+"),
                        if d.allocated.admin_access {
                            "admin"
                        } else {
                            "-"
                        },
                        d.allocated
                            .config
                            .as_ref()
                            .map_or("-".to_owned(), |c| c.lanes.to_string())
                    )
                })
                .collect()
        })
        .map_err(|e| e.to_string())
}

#[test]
fn resolution_table() {
    type Held = &'static [(&'static str, &'static [(&'static str, bool)])];
    struct Case {
        what: &'static str,
        uid: &'static str,
        results: &'static [Result4],
        configs: &'static [(&'static str, &'static [&'static str], u32)],
        held: Held,
        want: Result<&'static [&'static str], &'static str>,
    }
    let cases = [
        Case {
            what: "other drivers' results are left out; request names are base names, merged",
            uid: UID,
            results: &[
                ("a/x", DRIVER, "dev-1", false),
                ("b", DRIVER, "dev-1", false),
                ("g", "gpu.other.com", "gpu-0", false),
                ("c", DRIVER, "dev-2", false),
            ],
            configs: &[],
            held: &[],
            want: Ok(&["dev-1:a+b:-:-", "dev-2:c:-:-"]),
        },
        Case {
            what: "claim config beats class config; the last matching entry wins",
            uid: UID,
            results: &[
                ("a/x", DRIVER, "dev-1", false),
                ("b", DRIVER, "dev-2", false),
            ],
            configs: &[
                ("FromClaim", &["a"], 3),
                ("FromClass", &[], 1),
                ("FromClaim", &["a/x"], 4),
            ],
            held: &[],
            want: Ok(&["dev-1:a:-:4", "dev-2:b:-:1"]),
        },
        Case {
            what: "recreated claim",
            uid: "uid-other",
            results: &[("a", DRIVER, "dev-1", false)],
            configs: &[],
            held: &[],
            want: Err(
                "ResourceClaim ns/mine has UID \"uid-other\" but kubelet asked for \"uid-mine\": the claim was deleted and recreated; delete the pod so that it is scheduled with the new claim",
            ),
        },
        Case {
            what: "regular after regular is refused",
            uid: UID,
            results: &[("a", DRIVER, "dev-1", false)],
            configs: &[],
            held: &[("uid-a", &[("dev-1", false)])],
            want: Err(
                "ResourceClaim ns/mine: device node/dev-1 is already prepared for claim ns/holder (uid uid-a); refusing to give one device to two claims. Wait until that claim is unprepared (its pods are gone), then retry",
            ),
        },
        Case {
            what: "admin after regular is allowed",
            uid: UID,
            results: &[("a", DRIVER, "dev-1", true)],
            configs: &[],
            held: &[("uid-a", &[("dev-1", false)])],
            want: Ok(&["dev-1:a:admin:-"]),
        },
        Case {
            what: "regular after admin is allowed (the bug: it was refused)",
            uid: UID,
            results: &[("a", DRIVER, "dev-1", false)],
            configs: &[],
            held: &[("uid-admin", &[("dev-1", true)])],
            want: Ok(&["dev-1:a:-:-"]),
        },
        Case {
            what: "regular after admin and regular on the same device is refused",
            uid: UID,
            results: &[("a", DRIVER, "dev-1", false)],
            configs: &[],
            held: &[
                ("uid-admin", &[("dev-1", true)]),
                ("uid-b", &[("dev-1", false)]),
            ],
            want: Err(
                "ResourceClaim ns/mine: device node/dev-1 is already prepared for claim ns/holder (uid uid-b); refusing to give one device to two claims. Wait until that claim is unprepared (its pods are gone), then retry",
            ),
        },
        Case {
            what: "another device held by another claim does not matter",
            uid: UID,
            results: &[("a", DRIVER, "dev-2", false)],
            configs: &[],
            held: &[("uid-a", &[("dev-1", false)])],
            want: Ok(&["dev-2:a:-:-"]),
        },
    ];
    for case in cases {
        let object = object(case.uid, case.results, case.configs);
        let prepared: BTreeMap<String, PreparedClaim> = case
            .held
            .iter()
            .map(|(uid, devices)| (uid.to_string(), holder("holder", devices)))
            .collect();
        let want = case
            .want
            .map(|v| v.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .map_err(str::to_owned);
        assert_eq!(outcome(Some(&object), &prepared), want, "{}", case.what);
    }
}

#[test]
fn missing_unallocated_and_bad_config() {
    let none = BTreeMap::new();
    assert_eq!(
        outcome(None, &none),
        Err("ResourceClaim ns/mine not found; it may have been deleted".to_owned())
    );
    let mut unallocated = object(UID, &[], &[]);
    unallocated.status = None;
    assert_eq!(
        outcome(Some(&unallocated), &none),
        Err("ResourceClaim ns/mine is not allocated (status.allocation is empty); wait for the scheduler to allocate it".to_owned())
    );
    let mut bad = object(
        UID,
        &[("a", DRIVER, "dev-1", false)],
        &[("FromClaim", &[], 1)],
    );
    if let Some(entry) = bad
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.config.as_mut())
        .and_then(|c| c.first_mut())
        .and_then(|e| e.opaque.as_mut())
    {
        entry.parameters.0["speed"] = serde_json::json!(9);
    }
    let err = outcome(Some(&bad), &none).unwrap_err();
    assert!(
        err.starts_with("ResourceClaim ns/mine: ") && err.contains("speed"),
        "{err}"
    );
}

#[test]
fn a_result_in_another_pool_is_refused() {
    let none = BTreeMap::new();
    let mut claim = object(
        UID,
        &[
            ("a", DRIVER, "dev-1", false),
            ("b", DRIVER, "dev-2", false),
            ("g", "gpu.other.com", "gpu-0", false),
        ],
        &[],
    );
    let set_pool = |claim: &mut ResourceClaim, index: usize| {
        if let Some(r) = claim
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .and_then(|r| r.get_mut(index))
        {
            r.pool = "node-b".into();
        }
    };
    // Another driver's device elsewhere is none of our business.
    set_pool(&mut claim, 2);
    assert_eq!(
        outcome(Some(&claim), &none),
        Ok(vec!["dev-1:a:-:-".to_owned(), "dev-2:b:-:-".to_owned()])
    );
    set_pool(&mut claim, 1);
    assert_eq!(
        outcome(Some(&claim), &none),
        Err("ResourceClaim ns/mine: device dev-2 of request b is in pool node-b, but this node's pool is node: the claim was allocated devices of another node; delete the pod so that it is scheduled where its devices are".to_owned())
    );
    // Only another driver's results: nothing of ours to prepare.
    let theirs = object(UID, &[("g", "gpu.other.com", "gpu-0", false)], &[]);
    assert_eq!(
        outcome(Some(&theirs), &none),
        Err("ResourceClaim ns/mine has no device of driver test.example.com in status.allocation (results are for: gpu.other.com); the allocation changed after the pod was scheduled: delete the pod so that it is scheduled again".to_owned())
    );
    // Without a pool to compare with, any pool is taken.
    let any = resolve_claim::<Lanes>(DRIVER, None, &mine(), Some(&claim), &none).unwrap();
    assert_eq!(any.len(), 2);
}

#[test]
fn a_claim_never_blocks_itself() {
    // Re-resolving a claim already in the checkpoint (kubelet retries)
    // must not find its own devices held.
    let object = object(UID, &[("a", DRIVER, "dev-1", false)], &[]);
    let prepared = BTreeMap::from([(UID.to_owned(), holder("mine", &[("dev-1", false)]))]);
    assert_eq!(
        outcome(Some(&object), &prepared),
        Ok(vec!["dev-1:a:-:-".to_owned()])
    );
}

/// The guard compares what devices occupy, not their names: a device
/// held under an old name, or a part of a held device, is held.
#[test]
fn devices_that_occupy_the_same_hardware_conflict() {
    // `old-N` is `dev-N` under an earlier name; `dev-N/p` is a part of
    // `dev-N`; `whole` is every device.
    let occupies = |d: &str| -> Vec<String> {
        if d == "whole" {
            return vec!["1".into(), "2".into()];
        }
        let base = d.trim_start_matches("old-").trim_start_matches("dev-");
        vec![base.split('/').next().unwrap_or(base).to_owned()]
    };
    let resolve = |device: &'static str, held: &'static str| {
        let object = object(UID, &[("a", DRIVER, device, false)], &[]);
        let prepared =
            BTreeMap::from([("uid-other".to_owned(), holder("other", &[(held, false)]))]);
        resolve_claim_with::<Lanes>(
            DRIVER,
            Some("node"),
            &mine(),
            Some(&object),
            &prepared,
            &occupies,
        )
        .map(|d| d.len())
        .map_err(|e| e.to_string())
    };
    for (device, held) in [
        ("dev-1", "old-1"),
        ("old-1", "dev-1"),
        ("dev-1/p", "dev-1"),
        ("whole", "dev-2"),
    ] {
        let got = resolve(device, held);
        assert!(
            got.as_ref().is_err_and(|e| e.contains("ns/other")),
            "{device} beside {held}: {got:?}"
        );
    }
    assert_eq!(resolve("dev-1", "dev-2"), Ok(1));
    assert_eq!(resolve("dev-1/p", "old-2"), Ok(1));
}

/// Shares of a device published with `allowMultipleAllocations` (results
/// with a `shareID`): each claim records its shares, shares of several
/// claims sit beside each other, but a share never sits beside an exclusive
/// holder, in either order, and admin access still passes everything.
#[test]
fn shares_sit_beside_shares_only() {
    // (request, device, shareID, admin)
    type Share = (&'static str, &'static str, Option<&'static str>, bool);
    let claim = |results: &[Share]| {
        let mut c = object(UID, &[], &[]);
        let devices = c.status.as_mut().unwrap().allocation.as_mut().unwrap();
        let devices = devices.devices.as_mut().unwrap();
        devices.results = Some(
            results
                .iter()
                .map(
                    |(request, device, share, admin)| DeviceRequestAllocationResult {
                        request: request.to_string(),
                        driver: DRIVER.into(),
                        pool: "node".into(),
                        device: device.to_string(),
                        share_id: share.map(str::to_owned),
                        admin_access: admin.then_some(true),
                        ..Default::default()
                    },
                )
                .collect(),
        );
        c
    };
    // The holder "other" holds dev-1 exclusively or as a share.
    let held_by_other = |share: Option<&str>| {
        let mut h = holder("other", &[("dev-1", false)]);
        h.devices[0].share_ids = share.iter().map(|s| s.to_string()).collect();
        BTreeMap::from([("uid-other".to_owned(), h)])
    };
    let resolve = |results: &[Share], prepared: &BTreeMap<String, PreparedClaim>| {
        resolve_claim::<Lanes>(
            DRIVER,
            Some("node"),
            &mine(),
            Some(&claim(results)),
            prepared,
        )
        .map(|d| {
            d.iter()
                .map(|d| format!("{}:{}", d.allocated.device, d.share_ids.join("+")))
                .collect::<Vec<_>>()
        })
        .map_err(|e| e.to_string())
    };
    let nobody = BTreeMap::new();
    let share_a = held_by_other(Some("share-a"));
    let exclusive = held_by_other(None);
    let refused = |got: Result<Vec<String>, String>| {
        got.is_err_and(|e| e.contains("already prepared for claim ns/other"))
    };

    // A share alone, and two shares of one device in one claim: one device
    // to prepare, both shares recorded.
    assert_eq!(
        resolve(&[("a", "dev-1", Some("s1"), false)], &nobody),
        Ok(vec!["dev-1:s1".to_owned()])
    );
    assert_eq!(
        resolve(
            &[
                ("b", "dev-1", Some("s2"), false),
                ("a", "dev-1", Some("s1"), false)
            ],
            &nobody
        ),
        Ok(vec!["dev-1:s1+s2".to_owned()])
    );
    // Beside another claim's share: allowed.
    assert_eq!(
        resolve(&[("a", "dev-1", Some("s1"), false)], &share_a),
        Ok(vec!["dev-1:s1".to_owned()])
    );
    // A share beside an exclusive holder, and an exclusive result beside
    // a share: refused.
    assert!(refused(resolve(
        &[("a", "dev-1", Some("s1"), false)],
        &exclusive
    )));
    assert!(refused(resolve(&[("a", "dev-1", None, false)], &share_a)));
    // Exclusive beside exclusive stays refused; admin passes both.
    assert!(refused(resolve(&[("a", "dev-1", None, false)], &exclusive)));
    assert_eq!(
        resolve(&[("a", "dev-1", None, true)], &share_a),
        Ok(vec!["dev-1:".to_owned()])
    );
    // Another device is free whatever dev-1 is held as.
    assert_eq!(
        resolve(&[("a", "dev-2", None, false)], &share_a),
        Ok(vec!["dev-2:".to_owned()])
    );
}

/// A record without shares is written as before (no `shareIds` key), so a
/// driver that does not know the field reads it; one with shares keeps them.
#[test]
fn share_ids_in_the_record() {
    let mut device = holder("c", &[("dev-1", false)]).devices.remove(0);
    let plain = serde_json::to_value(&device).unwrap();
    assert!(plain.get("shareIds").is_none(), "{plain}");
    device.share_ids = vec!["s1".into(), "s2".into()];
    let shared = serde_json::to_value(&device).unwrap();
    assert_eq!(shared["shareIds"], serde_json::json!(["s1", "s2"]));
    let back: PreparedDevice = serde_json::from_value(shared).unwrap();
    assert_eq!(back, device);
    let old: PreparedDevice = serde_json::from_value(plain).unwrap();
    assert!(old.share_ids.is_empty());
}
