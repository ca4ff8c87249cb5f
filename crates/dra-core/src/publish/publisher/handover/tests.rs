use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;

const KEY: &str = "neuron.aws.com/publisher";

fn at(epoch: u64, id: &str) -> Instance {
    Instance {
        epoch,
        id: id.into(),
    }
}

fn stamped(value: Option<&str>) -> ResourceSlice {
    let mut s = ResourceSlice::default();
    if let Some(v) = value {
        s.metadata.annotations = Some(BTreeMap::from([(KEY.to_string(), v.to_string())]));
    }
    s
}

#[test]
fn stamps_round_trip_and_foreign_values_are_ignored() {
    let i = at(1_733_000_000_123_456_789, "0b7c6f5e-pod");
    assert_eq!(i.stamp(), "1733000000123456789/0b7c6f5e-pod");
    assert_eq!(Instance::parse(&i.stamp()), Some(i));
    for bad in [
        "",
        "12",
        "12/",
        "x/pod",
        "/pod",
        "-1/pod",
        "1/../../run/x",
        "1/a b",
    ] {
        assert_eq!(Instance::parse(bad), None, "{bad:?}");
    }
    assert_eq!(
        stamp_key("efa.networking.k8s.aws"),
        "efa.networking.k8s.aws/publisher"
    );
    let this = Instance::this_process(Some("uid-1"));
    assert_eq!(this.id, "uid-1");
    assert!(this.epoch > 0);
    let plain = Instance::this_process(Some(""));
    assert_eq!(plain.id, format!("pid-{}", std::process::id()));
}

#[test]
fn the_newest_live_instance_publishes() {
    let me = at(200, "me");
    let alive = Liveness::assume_alive();
    let dead = |gone: &'static str| Liveness::new(move |id| id != gone);
    let newer = |slices: &[ResourceSlice], alive: &Liveness| {
        newer_publisher(slices, KEY, &me, alive).map(|i| i.id)
    };
    let s = |v| stamped(Some(v));
    let cases: Vec<(&str, Vec<ResourceSlice>, Liveness, Option<&str>)> = vec![
        ("no slices", vec![], alive.clone(), None),
        (
            "unstamped (older version)",
            vec![stamped(None)],
            alive.clone(),
            None,
        ),
        ("own stamp", vec![s("200/me")], alive.clone(), None),
        (
            "own stamp, later start (container restart)",
            vec![s("900/me")],
            alive.clone(),
            None,
        ),
        ("older instance", vec![s("100/old")], alive.clone(), None),
        ("not our value", vec![s("garbage")], alive.clone(), None),
        (
            "newer instance",
            vec![s("100/old"), s("300/new")],
            alive.clone(),
            Some("new"),
        ),
        (
            "same start, larger id",
            vec![s("200/zz")],
            alive.clone(),
            Some("zz"),
        ),
        (
            "same start, smaller id",
            vec![s("200/aa")],
            alive.clone(),
            None,
        ),
        ("newer instance gone", vec![s("300/new")], dead("new"), None),
        (
            "the newest gone, a newer one alive",
            vec![s("300/new"), s("400/newest")],
            dead("newest"),
            Some("new"),
        ),
        (
            "two newer: the newest",
            vec![s("300/new"), s("400/newest")],
            alive.clone(),
            Some("newest"),
        ),
    ];
    for (name, slices, liveness, want) in cases {
        assert_eq!(newer(&slices, &liveness).as_deref(), want, "case: {name}");
    }
}

#[test]
fn stamping_keeps_other_annotations_and_yielding_sets_a_recheck() {
    let mut slices = vec![stamped(None), stamped(Some("1/old"))];
    slices[0].metadata.annotations = Some(BTreeMap::from([("team".into(), "ml".into())]));
    let me = at(5, "me");
    stamp_all(&mut slices, KEY, &me);
    for s in &slices {
        assert_eq!(s.metadata.annotations.as_ref().unwrap()[KEY], "5/me");
    }
    assert_eq!(
        slices[0].metadata.annotations.as_ref().unwrap()["team"],
        "ml"
    );

    let mut h = Handover::default();
    let alive = Liveness::assume_alive();
    assert!(!h.must_yield(&slices, KEY, &me, &alive));
    assert_eq!(h.recheck_at(), None);
    let newer = vec![stamped(Some("9/new"))];
    assert!(h.must_yield(&newer, KEY, &me, &alive));
    assert!(h.recheck_at().is_some());
    h.recheck_due();
    assert_eq!(h.recheck_at(), None);
    assert!(!h.must_yield(&newer, KEY, &me, &Liveness::new(|_| false)));
    assert_eq!(h.recheck_at(), None);
}
