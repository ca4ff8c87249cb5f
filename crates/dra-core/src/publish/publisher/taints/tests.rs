use super::*;
use k8s_openapi::api::resource::v1::Device;

#[test]
fn dropped_taints_are_noticed() {
    use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSliceSpec};
    let slice = |tainted: bool| ResourceSlice {
        spec: ResourceSliceSpec {
            devices: Some(vec![Device {
                name: "d".into(),
                taints: tainted.then(|| {
                    vec![DeviceTaint {
                        key: "x.example.com/y".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(taints_dropped(&slice(true), &slice(false)));
    assert!(!taints_dropped(&slice(true), &slice(true)));
    assert!(!taints_dropped(&slice(false), &slice(false)));
}

#[test]
fn taint_support_is_given_up_once() {
    let gauge = IntGauge::new("g", "g").expect("gauge");
    let mut t = TaintSupport::default();
    assert!(t.supported());
    assert!(!t.after_writes(false, &gauge));
    assert_eq!(gauge.get(), 0);
    assert!(t.after_writes(true, &gauge));
    assert!(!t.supported());
    assert_eq!(gauge.get(), 1);
    // Later writes without taints say nothing new.
    assert!(!t.after_writes(true, &gauge));
}
