use super::*;

fn phase(claim: &str, bind_s: f64, cpu_s: f64, filter_p50: f64) -> Phase {
    Phase {
        claim: claim.into(),
        pods: 10,
        bound: 10,
        create_s: 0.1,
        bind_s,
        pods_per_s: 10.0 / bind_s,
        sli: Latency::default(),
        attempt: Latency::default(),
        filter: Latency {
            n: 10,
            p50_ms: Some(filter_p50),
            p99_ms: Some(filter_p50 * 2.0),
            mean_ms: Some(filter_p50),
        },
        dra_filter: Latency::default(),
        attempts_scheduled: 10,
        attempts_unschedulable: 0,
        attempts_error: 0,
        apiserver_cpu_s: 1.0,
        scheduler_cpu_s: cpu_s,
        apiserver_rss_kib: 1,
        scheduler_rss_kib: 1,
    }
}

fn run(shape: &str, phases: Vec<Phase>) -> ShapeRun {
    ShapeRun {
        shape: shape.into(),
        nodes: 50,
        slices_per_node: 2,
        devices_per_node: 32,
        counter_sets_per_node: 0,
        slice_bytes_per_node: 1024,
        publish_s: 1.0,
        publish_apiserver_cpu_s: 1.0,
        etcd_db_bytes_start: 0,
        etcd_db_bytes_after_slices: 0,
        etcd_db_bytes_end: 1048576,
        etcd_in_use_bytes_after_slices: 0,
        apiserver_rss_kib_after_slices: 1024,
        apiserver_peak_rss_kib: 1024,
        scheduler_rss_kib_after_slices: 1024,
        scheduler_peak_rss_kib: 1024,
        phases,
        gang: None,
        notes: vec![],
        run_dir: String::new(),
    }
}

#[test]
fn cores_and_aws_compare_to_chips_on_the_claims_they_share() {
    let report = SchedulerReport {
        kubernetes_version: "v1.37.2".into(),
        finished_unix: 0.0,
        runs: vec![
            run(
                "trn2-chips",
                vec![
                    phase("neuron1", 2.0, 1.0, 1.0),
                    phase("neuron4", 2.0, 1.0, 1.0),
                ],
            ),
            run(
                "trn2-cores",
                vec![
                    phase("neuron1", 2.0, 1.0, 2.0),
                    phase("neuron4", 6.0, 5.0, 10.0),
                ],
            ),
            run("p5", vec![phase("gpu-4efa", 1.0, 1.0, 1.0)]),
        ],
        profiles: vec![],
    };
    let lines = report.comparison();
    assert_eq!(lines.len(), 1, "no trn2-aws run, no line for it: {lines:?}");
    assert_eq!(
        lines[0],
        "50 nodes: trn2-cores / trn2-chips: time to bind 2.00x in all, scheduler CPU 3.00x \
         (neuron1 1.00x (filter mean 2.00x), neuron4 3.00x (filter mean 10.00x))"
    );
    let table = report.table();
    assert!(
        table
            .iter()
            .any(|l| l.starts_with("trn2-cores     50 neuron4"))
    );
    assert!(table.iter().any(|l| l == &lines[0]));
}

#[test]
fn a_missing_baseline_gives_no_comparison() {
    let report = SchedulerReport {
        kubernetes_version: "v1.37.2".into(),
        finished_unix: 0.0,
        runs: vec![run("trn2-cores", vec![phase("neuron1", 2.0, 1.0, 1.0)])],
        profiles: vec![],
    };
    assert!(report.comparison().is_empty());
}

#[test]
fn a_gang_run_prints_both_ways_and_no_empty_phase_header() {
    let mut r = run("p5", vec![]);
    let times = |s: &[f64], bound: usize| GangTimes {
        bind_s: s.to_vec(),
        bound: vec![bound; s.len()],
        median_bind_s: Some(s[s.len() / 2]),
        all_bound: bound == 16,
    };
    r.gang = Some(GangRun {
        claim: "8gpu-32efa-by-pcieroot".into(),
        pods: 16,
        repetitions: 1,
        scheduling_group_kept: true,
        gang: times(&[5.0], 16),
        independent: times(&[2.0], 15),
    });
    let report = SchedulerReport {
        kubernetes_version: "v1.37.2".into(),
        finished_unix: 0.0,
        runs: vec![r],
        profiles: vec![],
    };
    let table = report.table();
    assert!(!table.iter().any(|l| l.contains("sli p50/p99")));
    assert!(
        table
            .iter()
            .any(|l| l.contains("gang: median 5.00 s, all bound: true"))
    );
    assert!(
        table
            .iter()
            .any(|l| l.contains("independent: median 2.00 s, all bound: false; 2.00 s (15/16)"))
    );
}
