use super::*;

const SCRAPE: &str = r#"# HELP scheduler_pod_scheduling_sli_duration_seconds [BETA] E2e latency
# TYPE scheduler_pod_scheduling_sli_duration_seconds histogram
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.01"} 2
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="0.1"} 6
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="1"} 8
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="1",le="+Inf"} 8
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="1"} 1.5
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="1"} 8
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.01"} 0
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="0.1"} 0
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="1"} 1
scheduler_pod_scheduling_sli_duration_seconds_bucket{attempts="2",le="+Inf"} 2
scheduler_pod_scheduling_sli_duration_seconds_sum{attempts="2"} 3.5
scheduler_pod_scheduling_sli_duration_seconds_count{attempts="2"} 2
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 10
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 3
"#;

#[test]
fn histograms_add_up_their_series_per_bound() {
    let h = Histogram::parse(
        SCRAPE,
        "scheduler_pod_scheduling_sli_duration_seconds",
        |_| true,
    );
    assert_eq!(
        h.buckets,
        [(0.01, 2.0), (0.1, 6.0), (1.0, 9.0), (f64::INFINITY, 10.0)]
    );
    assert_eq!((h.sum, h.count), (5.0, 10.0));
    let first = Histogram::parse(
        SCRAPE,
        "scheduler_pod_scheduling_sli_duration_seconds",
        |l| crate::bench::measure::label(l, "attempts") == Some("1"),
    );
    assert_eq!(first.count, 8.0);
    assert!(
        Histogram::parse(SCRAPE, "no_such_metric", |_| true)
            .buckets
            .is_empty()
    );
}

#[test]
fn quantiles_interpolate_inside_the_bucket_like_prometheus() {
    let h = Histogram::parse(
        SCRAPE,
        "scheduler_pod_scheduling_sli_duration_seconds",
        |_| true,
    );
    // Rank 5 of 10 lies in (0.01, 0.1] holding ranks 3..6: 3/4 of the way.
    let p50 = h.quantile(0.5).unwrap();
    assert!((p50 - (0.01 + 0.09 * 0.75)).abs() < 1e-12, "{p50}");
    // Rank 1 of 10, in the first bucket, interpolates from 0.
    assert!((h.quantile(0.1).unwrap() - 0.005).abs() < 1e-12);
    // Rank 9.9 is in +Inf: the highest finite bound answers.
    assert_eq!(h.quantile(0.99), Some(1.0));
    assert_eq!(Histogram::default().quantile(0.5), None);
}

#[test]
fn the_difference_of_two_scrapes_is_what_happened_between_them() {
    let before = Histogram {
        buckets: vec![(0.1, 4.0), (1.0, 5.0), (f64::INFINITY, 5.0)],
        sum: 0.5,
        count: 5.0,
    };
    let after = Histogram {
        buckets: vec![(0.1, 4.0), (1.0, 9.0), (f64::INFINITY, 10.0)],
        sum: 4.5,
        count: 10.0,
    };
    let d = after.since(&before);
    assert_eq!(d.buckets, [(0.1, 0.0), (1.0, 4.0), (f64::INFINITY, 5.0)]);
    assert_eq!((d.sum, d.count), (4.0, 5.0));
    // Every new observation above 0.1: the median is inside (0.1, 1].
    let p50 = d.quantile(0.5).unwrap();
    assert!(p50 > 0.1 && p50 <= 1.0, "{p50}");
    // A series the earlier scrape lacked counts from zero.
    let empty = after.since(&Histogram::default());
    assert_eq!(empty, after);
}

#[test]
fn counters_sum_over_the_series_that_pass() {
    let scheduled = total(SCRAPE, "scheduler_schedule_attempts_total", |l| {
        crate::bench::measure::label(l, "result") == Some("scheduled")
    });
    assert_eq!(scheduled, 10.0);
    assert_eq!(
        total(SCRAPE, "scheduler_schedule_attempts_total", |_| true),
        13.0
    );
}

#[test]
fn ports_come_from_the_command_line() {
    let args: Vec<String> = [
        "/cache/etcd",
        "--name=e2e",
        "--listen-client-urls=http://127.0.0.1:23791,http://[::1]:23792",
        "--secure-port=10259",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(flag_value(&args, "--secure-port"), Some("10259"));
    assert_eq!(flag_value(&args, "--secure"), None);
    assert_eq!(
        flag_value(&args, "--listen-client-urls").and_then(url_port),
        Some(23791)
    );
    assert_eq!(url_port("http://127.0.0.1:2379/"), Some(2379));
    assert_eq!(url_port("127.0.0.1"), None);
}
