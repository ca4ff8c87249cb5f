use super::*;

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

/// Every listed adapter gives whole Gbps for the default and the step, so
/// the policy holds only canonical quantities the API server keeps as
/// written, and the default is a multiple of the step (the API's rule).
#[test]
fn listed_adapters_give_valid_policies() {
    for it in [
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
        "trn2u.48xlarge",
    ] {
        let gbps = adapter_gbps(it).unwrap();
        assert_eq!(gbps % STEP_DIVISOR, 0, "{it}");
        let step = gbps / STEP_DIVISOR;
        let default = gbps / DEFAULT_SHARE_DIVISOR;
        assert_eq!(default % step, 0, "{it}: default on the step grid");
        assert!(step <= default && default <= gbps, "{it}");
    }
    assert_eq!(adapter_gbps("m5.8xlarge"), None);
    assert_eq!(adapter_gbps("inf2.48xlarge"), None);
}

#[test]
fn the_policy_of_a_100_and_a_200_gbps_adapter() {
    let c = bandwidth_capacity(100);
    assert_eq!(c.value, q("100G"));
    let p = c.request_policy.unwrap();
    assert_eq!(p.default, Some(q("25G")));
    let r = p.valid_range.unwrap();
    assert_eq!(
        (r.min, r.max, r.step),
        (q("5G"), Some(q("100G")), Some(q("5G")))
    );
    assert_eq!(p.valid_values, None);

    let c = bandwidth_capacity(200);
    assert_eq!(c.value, q("200G"));
    assert_eq!(c.request_policy.unwrap().default, Some(q("50G")));
    assert_eq!(bits_per_second(1000), q("1T"));
    assert_eq!(bits_per_second(400), q("400G"));
}

#[test]
fn share_marks_the_device_and_keeps_its_attributes() {
    let mut d = Device {
        name: "efa-0000-4f-00-0".into(),
        attributes: Some(BTreeMap::new()),
        ..Default::default()
    };
    share(&mut d, 100);
    assert_eq!(d.allow_multiple_allocations, Some(true));
    assert_eq!(d.attributes, Some(BTreeMap::new()));
    let cap = d.capacity.as_ref().unwrap();
    assert_eq!(cap.keys().collect::<Vec<_>>(), [BANDWIDTH]);
    assert_eq!(cap[BANDWIDTH].value, q("100G"));
}

#[test]
fn capacity_only_where_the_server_keeps_the_fields() {
    let support = |kept: Option<bool>| ApiSupport {
        consumable_capacity: kept,
        consumable_capacity_reason: "why".into(),
        ..ApiSupport::unknown()
    };
    let cases = [
        (SharingFlag::Exclusive, Some(true), false),
        (SharingFlag::Exclusive, None, false),
        (SharingFlag::Capacity, Some(true), true),
        (SharingFlag::Capacity, Some(false), false),
        (SharingFlag::Capacity, None, false),
    ];
    for (flag, kept, want) in cases {
        let (on, why) = resolve(flag, &support(kept));
        assert_eq!(on, want, "{flag:?} {kept:?}");
        if flag == SharingFlag::Capacity {
            assert!(why.contains("why"), "{why}");
        }
    }
}

#[test]
fn the_node_label_overrides_the_flag() {
    let label = |v: &str| BTreeMap::from([(SHARING_LABEL.to_owned(), v.to_owned())]);
    let none = BTreeMap::new();
    assert_eq!(
        SharingFlag::Exclusive.with_node_label(&none),
        (SharingFlag::Exclusive, None)
    );
    let (flag, why) = SharingFlag::Exclusive.with_node_label(&label("capacity"));
    assert_eq!(flag, SharingFlag::Capacity);
    assert!(why.unwrap().contains("replaces --sharing"));
    let (flag, _) = SharingFlag::Capacity.with_node_label(&label("Exclusive"));
    assert_eq!(flag, SharingFlag::Exclusive);
    let (flag, why) = SharingFlag::Capacity.with_node_label(&label("bandwidth"));
    assert_eq!(flag, SharingFlag::Capacity);
    assert!(why.unwrap().contains("ignored"));
}

#[test]
fn the_flag_and_its_environment_twin() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        efa: EfaFlags,
    }
    let cli = Cli::try_parse_from(["x"]).unwrap();
    assert_eq!(cli.efa.sharing, SharingFlag::Exclusive);
    let cli = Cli::try_parse_from(["x", "--sharing", "capacity"]).unwrap();
    assert_eq!(cli.efa.sharing, SharingFlag::Capacity);
    assert!(Cli::try_parse_from(["x", "--sharing", "bandwidth"]).is_err());
}
