//! Resolving a claim into the devices this driver must prepare: a pure
//! function of the claim as the API server has it, what kubelet asked for,
//! and what is already prepared on the node.
//!
//! In order: the claim must exist and have kubelet's UID (a claim deleted and
//! recreated under the same name is another claim); it must be allocated;
//! only the results of this driver count, and each must be in this node's
//! pool (a device of the same name on another node is not ours to give);
//! every opaque config of this driver
//! is decoded strictly (class configs first, the last matching entry wins);
//! and a device may not be handed to two claims.
//!
//! That last guard is for exclusive use only. A claim with `adminAccess`
//! (monitoring, diagnostics) shares the device by design, so an admin
//! result never blocks nor is blocked: it is only a regular claim beside
//! another regular claim on one device that is refused (e.g. after a
//! force-deleted pod whose claim was never unprepared). A share of a device
//! published with `allowMultipleAllocations` (a result with a `shareID`,
//! which the scheduler sets on such devices only, after checking the
//! shares' consumed capacity) sits beside other shares of the device, but
//! never beside an exclusive holder, in either order: that happens only
//! when sharing was switched on or off while claims held the device.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::prepare::checkpoint::PreparedClaim;
use crate::prepare::config::{
    ConfigEntryError, DriverConfig, base_request, config_for_request, decode_allocation_configs,
};
use crate::prepare::driver::{AllocatedDevice, ClaimRef};

/// Why a claim cannot be prepared; shown to the user as the pod's event,
/// so each message says what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("ResourceClaim {claim} not found; it may have been deleted")]
    NotFound { claim: String },
    #[error(
        "ResourceClaim {claim} has UID {found:?} but kubelet asked for {wanted:?}: the claim was \
         deleted and recreated; delete the pod so that it is scheduled with the new claim"
    )]
    UidMismatch {
        claim: String,
        found: String,
        wanted: String,
    },
    #[error(
        "ResourceClaim {claim} is not allocated (status.allocation is empty); wait for the \
         scheduler to allocate it"
    )]
    NotAllocated { claim: String },
    #[error("ResourceClaim {claim}: {source}")]
    Config {
        claim: String,
        #[source]
        source: Box<ConfigEntryError>,
    },
    #[error(
        "ResourceClaim {claim} has no device of driver {driver} in status.allocation (results \
         are for: {others}); the allocation changed after the pod was scheduled: delete the pod \
         so that it is scheduled again"
    )]
    NoResults {
        claim: String,
        driver: String,
        others: String,
    },
    #[error(
        "ResourceClaim {claim}: device {device} of request {request} is in pool {pool}, but this \
         node's pool is {ours}: the claim was allocated devices of another node; delete the pod \
         so that it is scheduled where its devices are"
    )]
    ForeignPool {
        claim: String,
        request: String,
        device: String,
        pool: String,
        ours: String,
    },
    /// `device` is `<pool>/<device>`, `holder` `<namespace>/<name>`.
    #[error(
        "ResourceClaim {claim}: device {device} is already prepared for claim {holder} (uid \
         {holder_uid}); refusing to give one device to two claims. Wait until that claim is \
         unprepared (its pods are gone), then retry"
    )]
    DeviceHeld {
        claim: String,
        device: String,
        holder: String,
        holder_uid: String,
    },
}

/// One device to prepare, and every base request of the claim that got it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResolvedDevice<C> {
    pub(crate) allocated: AllocatedDevice<C>,
    pub(crate) request_names: Vec<String>,
    /// The shares of the device the claim got (`shareID`s, sorted); empty
    /// when it holds the device exclusively.
    pub(crate) share_ids: Vec<String>,
}

/// The devices of `driver_name` allocated to `claim` (`object` is the claim
/// as read from the API server, `None` when it is gone), in allocation
/// order, each once; `prepared` is the checkpoint's claims by UID; `pool`
/// is this node's pool (`None`: any).
#[cfg(test)]
pub(crate) fn resolve_claim<C: DriverConfig>(
    driver_name: &str,
    pool: Option<&str>,
    claim: &ClaimRef,
    object: Option<&ResourceClaim>,
    prepared: &BTreeMap<String, PreparedClaim>,
) -> Result<Vec<ResolvedDevice<C>>, ResolveError> {
    resolve_claim_with::<C>(driver_name, pool, claim, object, prepared, &|d| {
        vec![d.to_owned()]
    })
}

/// [`resolve_claim`] with the driver's [`crate::Driver::occupies`]: two
/// devices conflict when they occupy a common piece of hardware (a chip and
/// one of its cores; a device under its name of before an upgrade and
/// under its current one).
pub(crate) fn resolve_claim_with<C: DriverConfig>(
    driver_name: &str,
    pool: Option<&str>,
    claim: &ClaimRef,
    object: Option<&ResourceClaim>,
    prepared: &BTreeMap<String, PreparedClaim>,
    occupies: &dyn Fn(&str) -> Vec<String>,
) -> Result<Vec<ResolvedDevice<C>>, ResolveError> {
    let who = format!("{}/{}", claim.namespace, claim.name);
    let object = object.ok_or_else(|| ResolveError::NotFound { claim: who.clone() })?;
    let uid = object.metadata.uid.as_deref().unwrap_or_default();
    if uid != claim.uid {
        return Err(ResolveError::UidMismatch {
            claim: who,
            found: uid.to_owned(),
            wanted: claim.uid.clone(),
        });
    }
    let allocation = object
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| ResolveError::NotAllocated { claim: who.clone() })?;
    let results: Vec<_> = allocation
        .results
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|r| r.driver == driver_name)
        .collect();
    if results.is_empty() {
        let others: BTreeSet<&str> = allocation
            .results
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|r| r.driver.as_str())
            .collect();
        return Err(ResolveError::NoResults {
            claim: who,
            driver: driver_name.to_owned(),
            others: if others.is_empty() {
                "no driver".to_owned()
            } else {
                others.into_iter().collect::<Vec<_>>().join(", ")
            },
        });
    }
    if let Some(ours) = pool
        && let Some(foreign) = results.iter().find(|r| r.pool != ours)
    {
        return Err(ResolveError::ForeignPool {
            claim: who,
            request: foreign.request.clone(),
            device: foreign.device.clone(),
            pool: foreign.pool.clone(),
            ours: ours.to_owned(),
        });
    }
    let configs = decode_allocation_configs::<C>(
        driver_name,
        allocation.config.as_deref().unwrap_or_default(),
    )
    .map_err(|source| ResolveError::Config {
        claim: who.clone(),
        source: Box::new(source),
    })?;

    // The hardware other claims hold (admin holds do not count), by pool
    // and piece: exclusively, and as shares.
    type Holders<'a> = BTreeMap<(&'a str, String), (&'a str, &'a PreparedClaim)>;
    let (mut held, mut shared): (Holders<'_>, Holders<'_>) = Default::default();
    for (holder_uid, holder) in prepared {
        if *holder_uid == claim.uid {
            continue;
        }
        for d in holder.devices.iter().filter(|d| !d.admin_access) {
            let map = if d.share_ids.is_empty() {
                &mut held
            } else {
                &mut shared
            };
            for piece in occupies(&d.device) {
                map.insert((&d.pool, piece), (holder_uid, holder));
            }
        }
    }

    let mut resolved: Vec<ResolvedDevice<C>> = Vec::new();
    let mut seen = BTreeSet::new();
    for result in &results {
        let admin_access = result.admin_access.unwrap_or(false);
        let is_share = result.share_id.is_some();
        let holder_of = |piece: String| {
            let key = (result.pool.as_str(), piece);
            held.get(&key)
                .or_else(|| (!is_share).then(|| shared.get(&key)).flatten())
        };
        if !admin_access
            && let Some((holder_uid, holder)) =
                occupies(&result.device).into_iter().find_map(holder_of)
        {
            return Err(ResolveError::DeviceHeld {
                claim: who,
                device: format!("{}/{}", result.pool, result.device),
                holder: format!("{}/{}", holder.namespace, holder.name),
                holder_uid: (*holder_uid).to_owned(),
            });
        }
        if !seen.insert((result.pool.as_str(), result.device.as_str())) {
            continue;
        }
        let same_device = || {
            results
                .iter()
                .filter(|r| r.pool == result.pool && r.device == result.device)
        };
        let request_names: BTreeSet<&str> =
            same_device().map(|r| base_request(&r.request)).collect();
        let share_ids: BTreeSet<&str> = same_device()
            .filter_map(|r| r.share_id.as_deref())
            .collect();
        resolved.push(ResolvedDevice {
            allocated: AllocatedDevice {
                request: base_request(&result.request).to_owned(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                admin_access,
                config: config_for_request(&configs, &result.request),
            },
            request_names: request_names.into_iter().map(str::to_owned).collect(),
            share_ids: share_ids.into_iter().map(str::to_owned).collect(),
        });
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests;
