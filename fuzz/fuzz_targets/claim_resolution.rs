//! Claim resolution before a prepare: the claim as the API server hands it
//! (any JSON a ResourceClaim deserialises from: allocation results of any
//! drivers and pools, admin access, share ids, opaque configs of both
//! drivers) against the claims a checkpoint already holds. Never a panic;
//! what resolves is in this node's pool, each device once, and never beside
//! another claim's hold of it (shares beside shares, admin access aside);
//! what is refused says why.
//!
//! Input: the claim's JSON, then optionally a NUL byte and the JSON of the
//! checkpoint's claims by UID.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use dra_core::fuzzing::{PreparedClaim, ResolvedForFuzzing, resolve_claim_json};
use efa_driver::EfaConfig;
use libfuzzer_sys::fuzz_target;
use neuron_driver::NeuronConfig;

const POOL: &str = "node-a";

fn check(
    outcome: Option<(String, Result<Vec<ResolvedForFuzzing>, String>)>,
    prepared: &BTreeMap<String, PreparedClaim>,
) {
    let Some((uid, outcome)) = outcome else {
        return;
    };
    match outcome {
        Err(message) => assert!(!message.is_empty()),
        Ok(devices) => {
            assert!(!devices.is_empty(), "resolved to nothing without an error");
            let mut seen = BTreeSet::new();
            for d in &devices {
                assert_eq!(d.pool, POOL);
                assert!(seen.insert(&d.device), "{} resolved twice", d.device);
                if d.admin_access {
                    continue; // shares the device by design
                }
                // Every other claim's non-admin hold of the same device.
                let holds = prepared
                    .iter()
                    .filter(|(holder, _)| **holder != uid)
                    .flat_map(|(_, c)| &c.devices)
                    .filter(|h| h.pool == d.pool && h.device == d.device && !h.admin_access);
                for hold in holds {
                    // An exclusive claim sits beside nobody; a share only
                    // beside other shares.
                    assert!(
                        !d.share_ids.is_empty() && !hold.share_ids.is_empty(),
                        "{} given beside another claim's hold",
                        d.device
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (claim, rest) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let prepared: BTreeMap<String, PreparedClaim> = if rest.is_empty() {
        BTreeMap::new()
    } else {
        match serde_json::from_slice(rest) {
            Ok(p) => p,
            Err(_) => return,
        }
    };
    check(
        resolve_claim_json::<EfaConfig>(efa_driver::DRIVER_NAME, Some(POOL), claim, &prepared),
        &prepared,
    );
    check(
        resolve_claim_json::<NeuronConfig>(
            neuron_driver::DRIVER_NAME,
            Some(POOL),
            claim,
            &prepared,
        ),
        &prepared,
    );
});
