use std::time::Duration;

use super::*;

fn gauge(registry: &Registry, what: &str) -> i64 {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == "aws_dra_waiting_for")
        .and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| m.get_label().iter().any(|l| l.value() == what))
                .map(|m| m.get_gauge().value() as i64)
        })
        .expect("gauge present")
}

#[tokio::test]
async fn ready_only_once_the_api_server_answered_registered_and_published() {
    let registry = Registry::new();
    let readiness = Readiness::default();
    let waits = StartupWaits::register(&registry, readiness.clone()).unwrap();
    let (registered, registered_rx) = watch::channel(false);
    let (published, published_rx) = watch::channel(false);
    let registration = tokio::spawn(mark_when(
        registered_rx,
        Awaited::Registration,
        waits.clone(),
    ));
    let publish = tokio::spawn(mark_when(
        published_rx,
        Awaited::FirstPublish,
        waits.clone(),
    ));
    assert!(!readiness.is_ready(), "nothing yet");
    assert!(readiness.waiting_for().contains("the API server"));
    for what in ["apiserver", "kubelet_registration", "first_publish"] {
        assert_eq!(gauge(&registry, what), 1, "{what}");
    }

    registered.send_replace(false);
    registered.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), registration)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gauge(&registry, "kubelet_registration"), 0);
    assert!(!readiness.is_ready(), "registered only");
    assert!(!readiness.waiting_for().contains("registration"));

    published.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), publish)
        .await
        .unwrap()
        .unwrap();
    assert!(!readiness.is_ready(), "the API server is still awaited");
    let words = readiness.waiting_for();
    assert!(
        words.contains("the API server") && !words.contains("first publish"),
        "{words}"
    );
    assert_eq!(gauge(&registry, "apiserver"), 1);

    waits.done(Awaited::ApiServer);
    assert!(readiness.is_ready());
    assert!(!waits.is_waiting_for(Awaited::ApiServer));
    assert_eq!(gauge(&registry, "apiserver"), 0);
}

#[tokio::test]
async fn a_stopped_component_ends_the_wait_unready() {
    let readiness = Readiness::default();
    let waits = StartupWaits::register(&Registry::new(), readiness.clone()).unwrap();
    let (published, published_rx) = watch::channel(false);
    let task = tokio::spawn(mark_when(
        published_rx,
        Awaited::FirstPublish,
        waits.clone(),
    ));
    drop(published);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
    assert!(waits.is_waiting_for(Awaited::FirstPublish));
    assert!(!readiness.is_ready());
}

/// The signals come from the components themselves: a publisher config
/// hands out receivers of its one flag, unset at first.
#[test]
fn the_publisher_signal_starts_unset() {
    let metrics =
        crate::publish::publisher::PublishMetrics::register(&prometheus::Registry::new()).unwrap();
    let config = crate::publish::publisher::PublisherConfig::new(
        "efa.networking.k8s.aws",
        "n",
        None,
        metrics,
    )
    .unwrap();
    assert!(!*config.published().borrow());
}

/// A checkpoint written by a newer driver takes readiness back after the
/// start (and keeps it from coming before), saying why; one this build
/// reads again gives it back.
#[tokio::test]
async fn a_newer_checkpoint_makes_the_driver_not_ready_and_says_why() {
    let readiness = Readiness::default();
    let waits = StartupWaits::register(&Registry::new(), readiness.clone()).unwrap();
    let (newer, newer_rx) = watch::channel(None::<String>);
    let follow = tokio::spawn(follow_checkpoint(newer_rx, waits.clone()));
    let refusal = "checkpoint /d/checkpoint.json has version 2, newer than this build's 1";
    newer.send_replace(Some(refusal.into()));
    let settle = || tokio::time::sleep(Duration::from_millis(50));
    settle().await;
    for what in Awaited::ALL {
        waits.done(what);
    }
    assert!(
        !readiness.is_ready(),
        "started, but the checkpoint is newer"
    );
    assert_eq!(
        readiness.waiting_for(),
        format!("waiting for a checkpoint this build can read ({refusal})")
    );

    newer.send_replace(None);
    settle().await;
    assert!(readiness.is_ready());
    newer.send_replace(Some(refusal.into()));
    settle().await;
    assert!(!readiness.is_ready(), "taken back after the start");
    assert!(readiness.waiting_for().contains(refusal));

    drop(newer);
    tokio::time::timeout(Duration::from_secs(5), follow)
        .await
        .unwrap()
        .unwrap();
}
