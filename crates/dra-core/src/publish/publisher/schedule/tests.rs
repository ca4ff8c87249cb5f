use super::*;
use k8s_openapi::api::resource::v1::ResourceSlice;

fn config() -> BackoffConfig {
    BackoffConfig {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(8),
    }
}

#[test]
fn nothing_runs_before_the_first_list() {
    let mut s = Schedule::new(config());
    assert!(!s.start());
    s.watch_event::<ResourceSlice>(&Event::Init);
    assert!(!s.start());
    s.watch_event(&Event::InitApply(ResourceSlice::default()));
    assert!(!s.start());
    s.watch_event::<ResourceSlice>(&Event::InitDone);
    assert!(s.start());
    // Once per change.
    assert!(!s.start());
    s.watch_event(&Event::Apply(ResourceSlice::default()));
    assert!(s.start());
    s.changed();
    assert!(s.start());
}

#[tokio::test(start_paused = true)]
async fn a_failed_round_waits_for_its_retry() {
    let mut s = Schedule::new(config());
    s.watch_event::<ResourceSlice>(&Event::InitDone);
    assert!(s.start());
    let now = Instant::now();
    let delay = s.failed(now);
    assert!(delay >= Duration::from_millis(500) && delay <= Duration::from_secs(1));
    assert_eq!(s.retry_at(), Some(now + delay));
    // Changes do not cut the backoff short...
    s.watch_event(&Event::Apply(ResourceSlice::default()));
    s.changed();
    assert!(!s.start());
    s.retry_due();
    assert!(s.start());
    // ... and it grows until a success resets it.
    let second = s.failed(now);
    assert!(second >= Duration::from_secs(1) && second <= Duration::from_secs(2));
    s.retry_due();
    s.succeeded();
    let third = s.failed(now);
    assert!(third <= Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn the_watch_coming_back_cuts_the_backoff_short() {
    let mut s = Schedule::new(config());
    s.watch_event::<ResourceSlice>(&Event::InitDone);
    assert!(s.start());
    s.failed(Instant::now());
    s.watch_failed();
    assert!(!s.start());
    s.watch_event::<ResourceSlice>(&Event::Init);
    assert_eq!(s.retry_at(), None);
    assert!(s.start());
    // Only the first event after a failure does so.
    s.failed(Instant::now());
    s.watch_event(&Event::Apply(ResourceSlice::default()));
    assert!(s.retry_at().is_some());
}
