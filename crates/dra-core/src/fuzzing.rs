//! Fuzz entry points, behind the `fuzzing` feature (the fuzz crate at
//! `fuzz/`, `cargo xtask fuzz`): the byte parsers that face other processes.
//! Each item is declared `pub` where it lives, marked
//! `cfg_attr(not(any(feature = "testing", feature = "fuzzing")),
//! allow(unreachable_pub))`: without these features it is reachable from
//! nowhere outside the crate.

pub use crate::daemon::ops::fuzz::ops_exchange;
pub use crate::kubelet::authority::{
    AdapterError, Frame, InboundStream, MAX_IN_FRAME, PREFACE, Rewrite, parse_frame,
};
pub use crate::prepare::checkpoint::{Checkpoint, CheckpointError, CheckpointStore, PreparedClaim};
pub use crate::prepare::metrics::PluginMetrics;
pub use crate::scan::uevent::{Uevent, UeventError};

/// Claim resolution as the plugin runs it before a prepare: `claim` is the
/// API server's JSON of the claim kubelet named (its own UID, so the UID
/// check passes), resolved for `driver_name` in `pool` against the claims
/// the checkpoint already holds, with each device occupying only itself.
/// `None` when `claim` is not a ResourceClaim; otherwise the claim's UID
/// and the devices to prepare, or the message kubelet would get.
pub fn resolve_claim_json<C: crate::DriverConfig>(
    driver_name: &str,
    pool: Option<&str>,
    claim: &[u8],
    prepared: &std::collections::BTreeMap<String, PreparedClaim>,
) -> Option<(String, Result<Vec<ResolvedForFuzzing>, String>)> {
    let object: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_slice(claim).ok()?;
    let claim_ref = crate::ClaimRef {
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
        uid: object.metadata.uid.clone().unwrap_or_default(),
    };
    let resolved = crate::prepare::resolve::resolve_claim_with::<C>(
        driver_name,
        pool,
        &claim_ref,
        Some(&object),
        prepared,
        &|device| vec![device.to_owned()],
    );
    Some((
        claim_ref.uid.clone(),
        resolved
            .map(|devices| {
                devices
                    .into_iter()
                    .map(|d| ResolvedForFuzzing {
                        pool: d.allocated.pool,
                        device: d.allocated.device,
                        admin_access: d.allocated.admin_access,
                        share_ids: d.share_ids,
                    })
                    .collect()
            })
            .map_err(|e| e.to_string()),
    ))
}

/// One device [`resolve_claim_json`] resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedForFuzzing {
    pub pool: String,
    pub device: String,
    pub admin_access: bool,
    pub share_ids: Vec<String>,
}
