//! What the pipeline hands the claim-status task: once the group is
//! committed, each claim answered with devices, with the devices it
//! resolved (the task resolves nothing); nothing for a refused claim.

use super::*;
use crate::prepare::status::Event;

#[tokio::test]
async fn each_prepared_claim_goes_to_the_status_task_with_its_resolved_devices() {
    let dir = tempfile::tempdir().unwrap();
    let (driver, claims) = (ExclusiveDriver::default(), InMemoryClaimSource::new());
    let (status, mut events) = ClaimStatus::channel();
    let registry = prometheus::Registry::new();
    let source = Arc::new(claims.clone());
    let p = pipeline_from(
        dir.path(),
        &driver,
        source,
        Duration::ZERO,
        &registry,
        status,
    );
    let a = add(&claims, "a", "dev-1");
    let b = add(&claims, "b", "dev-1");
    let answers = p.prepare(vec![a.clone(), b.clone()]).await.unwrap();
    assert!(answers[&a.uid].is_ok() && answers[&b.uid].is_err());
    let Ok(Event::Prepared(sent)) = events.try_recv() else {
        panic!("no status for the prepared claim");
    };
    assert_eq!(sent.claim, a);
    let devices: Vec<(&str, &str)> = sent
        .devices
        .iter()
        .map(|d| (d.allocated.pool.as_str(), d.allocated.device.as_str()))
        .collect();
    assert_eq!(devices, [("node", "dev-1")]);
    assert!(events.try_recv().is_err(), "the refused claim got status");

    // Answered again from the checkpoint (another pod of the claim): sent
    // again, resolved from the claim as read (the task skips a repeat).
    p.prepare(vec![a.clone()]).await.unwrap()[&a.uid]
        .as_ref()
        .unwrap();
    assert!(matches!(events.try_recv(), Ok(Event::Prepared(again)) if again.claim == a));
}
