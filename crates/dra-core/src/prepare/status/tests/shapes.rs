//! The task's device matching on the allocations the drivers really get: a
//! trn2 claim of Neuron chips or cores and an EFA, one allocation read by
//! each driver's task, and an EFA shared by capacity (a result per share).

use super::*;

const NEURON: &str = "neuron.aws.com";
const EFA: &str = "efa.networking.k8s.aws";
const POOL: &str = "trn2";

/// The task of `driver` on the node `trn2`.
fn tracker_of(driver: &str, api: Arc<Recorder>) -> Tracker<Reporting> {
    let metrics = StatusMetrics::register(&Registry::new()).unwrap();
    Tracker::new(Arc::new(Reporting), driver.into(), api, metrics)
}

/// A claim allocated `(request, driver, device, shareID)` in pool `trn2`,
/// as the pipeline of `driver` hands it over.
fn allocated(driver: &str, results: &[(&str, &str, &str, Option<&str>)]) -> Event<NoConfig> {
    let (claim, mut object) = claim("mixed", &[], 1);
    let results = results
        .iter()
        .map(
            |(request, driver, device, share)| DeviceRequestAllocationResult {
                request: (*request).into(),
                driver: (*driver).into(),
                pool: POOL.into(),
                device: (*device).into(),
                share_id: share.map(str::to_owned),
                ..Default::default()
            },
        )
        .collect();
    let status = object.status.as_mut().unwrap();
    let devices = status
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap();
    devices.results = Some(results);
    prepared_event(driver, POOL, claim, &object)
}

/// `(driver, pool, device, shareID)` of each entry applied.
fn written(api: &Recorder) -> Vec<(String, String, String, Option<String>)> {
    let bodies = api.bodies();
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    entries(&bodies[0].1)
        .iter()
        .map(|e| {
            assert_eq!(ready(e), ("True", "Prepared"));
            let s = |k: &str| e[k].as_str().map(str::to_owned);
            (
                s("driver").unwrap(),
                s("pool").unwrap(),
                s("device").unwrap(),
                s("shareID"),
            )
        })
        .collect()
}

fn own(
    driver: &str,
    device: &str,
    share: Option<&str>,
) -> (String, String, String, Option<String>) {
    (
        driver.into(),
        POOL.into(),
        device.into(),
        share.map(str::to_owned),
    )
}

#[tokio::test(start_paused = true)]
async fn each_driver_writes_an_entry_per_own_device_in_cores_and_chip_mode() {
    // Cores mode: two core devices of chip 1 and the EFA of its group;
    // chips mode: a whole chip.
    let cores = [
        ("chip", NEURON, "neurondevice1-core-2", None),
        ("chip", NEURON, "neurondevice1-core-3", None),
        ("efa", EFA, "efa-0000-4f-00-0", None),
    ];
    let chip = [
        ("efa", EFA, "efa-0000-4f-00-0", None),
        ("chip", NEURON, "neurondevice0", None),
    ];
    let cases: [(&[_], &str, Vec<_>); 4] = [
        (
            &cores,
            NEURON,
            vec![
                own(NEURON, "neurondevice1-core-2", None),
                own(NEURON, "neurondevice1-core-3", None),
            ],
        ),
        (&cores, EFA, vec![own(EFA, "efa-0000-4f-00-0", None)]),
        (&chip, NEURON, vec![own(NEURON, "neurondevice0", None)]),
        (&chip, EFA, vec![own(EFA, "efa-0000-4f-00-0", None)]),
    ];
    for (results, driver, want) in cases {
        let api = Arc::new(Recorder::default());
        let mut t = tracker_of(driver, api.clone());
        t.on_event(allocated(driver, results));
        settle().await;
        assert_eq!(written(&api), want, "{driver} on {results:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_efa_shared_by_capacity_gets_an_entry_per_share() {
    let api = Arc::new(Recorder::default());
    let mut t = tracker_of(EFA, api.clone());
    t.on_event(allocated(
        EFA,
        &[
            ("a", EFA, "efa-0000-4f-00-0", Some("s1")),
            ("b", EFA, "efa-0000-4f-00-0", Some("s2")),
            ("chip", NEURON, "neurondevice0", None),
        ],
    ));
    settle().await;
    assert_eq!(
        written(&api),
        [
            own(EFA, "efa-0000-4f-00-0", Some("s1")),
            own(EFA, "efa-0000-4f-00-0", Some("s2")),
        ]
    );
}
