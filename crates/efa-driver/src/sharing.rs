//! Sharing an EFA by capacity (`--sharing capacity`, or the Node label
//! [`SHARING_LABEL`]): each EFA is published with `allowMultipleAllocations`
//! and a `bandwidth` capacity that independent claims consume (Kubernetes
//! consumable capacity, `DRAConsumableCapacity`, beta and on since 1.36).
//!
//! Why bandwidth: it is what a workload knows it needs and what an adapter
//! has, so a claim can say "25G" and the scheduler can add claims up
//! against the adapter. The value is the adapter's share of the instance's
//! EFA bandwidth (p5.48xlarge: 3,200 Gbps over 32 EFAs, 100 Gbps each),
//! written in bits per second (`100G`). It is a scheduling budget, not a
//! limit: the EFA enforces no per-process rate, so claims that use more
//! than they asked for slow their neighbours down, as on any shared link.
//!
//! The request policy: a claim that asks for nothing gets a quarter of the
//! adapter (four such claims per EFA); requests are rounded up to a
//! twentieth of the adapter (5 Gbps on a 100 Gbps EFA), from one twentieth
//! to the whole adapter. Finer steps would let claims fragment an adapter
//! into slivers no collective can use, and a sliver is not a meaningful
//! promise on a link with no rate limits.
//!
//! Where the instance type's bandwidth per EFA is not known, or the API
//! server drops the fields (a gate that is off), the EFAs are published
//! exclusively, as without sharing, and the driver says why once.

use std::collections::BTreeMap;

use dra_core::ApiSupport;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Node label that overrides `--sharing` on its node (`exclusive` or
/// `capacity`), read once when the driver starts: a node pool opts in on
/// its own.
pub const SHARING_LABEL: &str = "efa.networking.k8s.aws/sharing";
/// The capacity claims consume (driver domain), in bits per second.
pub const BANDWIDTH: &str = "bandwidth";
/// A claim that asks for no bandwidth gets this part of the adapter.
pub const DEFAULT_SHARE_DIVISOR: u64 = 4;
/// Requests are rounded up to multiples of this part of the adapter.
pub const STEP_DIVISOR: u64 = 20;

/// `--sharing`: how claims get an EFA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SharingFlag {
    /// One claim per EFA (the default).
    #[default]
    Exclusive,
    /// Claims share an EFA up to its bandwidth, where the API server keeps
    /// the consumable-capacity fields; exclusive elsewhere.
    Capacity,
}

/// The EFA driver's own flags of `run` and `discover`.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct EfaFlags {
    /// How claims get an EFA: exclusive (one claim per EFA) or capacity
    /// (independent claims share an EFA up to its bandwidth, Kubernetes
    /// 1.36+). The Node label `efa.networking.k8s.aws/sharing` overrides it.
    #[arg(long, env = "EFA_SHARING", value_enum, default_value_t = SharingFlag::Exclusive)]
    pub sharing: SharingFlag,
}

impl SharingFlag {
    /// The flag in effect: the Node's [`SHARING_LABEL`] where it has a valid
    /// one, else `self`; and why, when the label was read.
    pub fn with_node_label(self, labels: &BTreeMap<String, String>) -> (Self, Option<String>) {
        let Some(value) = labels.get(SHARING_LABEL) else {
            return (self, None);
        };
        match <Self as clap::ValueEnum>::from_str(value.trim(), true) {
            Ok(flag) => (
                flag,
                Some(format!(
                    "the Node label {SHARING_LABEL}={value} replaces --sharing"
                )),
            ),
            Err(_) => (
                self,
                Some(format!(
                    "the Node label {SHARING_LABEL}={value:?} is neither exclusive nor capacity: \
                     ignored"
                )),
            ),
        }
    }
}

/// Whether EFAs are shared, and why: `capacity` is honoured only where the
/// API server keeps the fields (`discover`, which asks no server, publishes
/// exclusive EFAs, as `run` would on a server it could not ask).
pub fn resolve(flag: SharingFlag, support: &ApiSupport) -> (bool, String) {
    match (flag, support.consumable_capacity) {
        (SharingFlag::Exclusive, _) => (false, "--sharing exclusive".into()),
        (SharingFlag::Capacity, Some(true)) => (
            true,
            format!("--sharing capacity: {}", support.consumable_capacity_reason),
        ),
        (SharingFlag::Capacity, _) => (
            false,
            format!(
                "--sharing capacity, but EFAs are published exclusive: {}",
                support.consumable_capacity_reason
            ),
        ),
    }
}

/// The EFA bandwidth of one adapter of `instance_type` in Gbps: the
/// instance's EFA network bandwidth over its EFA count, as AWS documents
/// them; `None` for a type not listed here.
pub fn adapter_gbps(instance_type: &str) -> Option<u64> {
    Some(match instance_type {
        // 400 Gbps over 4 EFAs.
        "p4d.24xlarge" | "p4de.24xlarge" => 100,
        // 3,200 Gbps over 32 EFAs.
        "p5.48xlarge" | "p5e.48xlarge" => 100,
        // 3,200 Gbps over 16 EFAs.
        "p5en.48xlarge" => 200,
        // 3,200 Gbps over 8 EFAs.
        "p6-b200.48xlarge" => 400,
        // 800 Gbps over 8 EFAs; 1,600 Gbps over 16.
        "trn1.32xlarge" | "trn1n.32xlarge" => 100,
        // 3,200 Gbps over 16 EFAs.
        "trn2.48xlarge" | "trn2u.48xlarge" => 200,
        _ => return None,
    })
}

/// `gbps` as a canonical Kubernetes quantity in bits per second (`100G`,
/// `1T`): the API server stores quantities canonically, and the publisher
/// compares request policies as written.
pub fn bits_per_second(gbps: u64) -> Quantity {
    if gbps.is_multiple_of(1000) {
        Quantity(format!("{}T", gbps / 1000))
    } else {
        Quantity(format!("{gbps}G"))
    }
}

/// The `bandwidth` capacity of an adapter of `gbps`, with its request
/// policy (see the module doc).
pub fn bandwidth_capacity(gbps: u64) -> DeviceCapacity {
    let step = gbps / STEP_DIVISOR;
    DeviceCapacity {
        value: bits_per_second(gbps),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(bits_per_second(gbps / DEFAULT_SHARE_DIVISOR)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: bits_per_second(step),
                max: Some(bits_per_second(gbps)),
                step: Some(bits_per_second(step)),
            }),
            valid_values: None,
        }),
    }
}

/// Makes `device` an EFA shared by capacity.
pub fn share(device: &mut Device, gbps: u64) {
    device.allow_multiple_allocations = Some(true);
    device
        .capacity
        .get_or_insert_with(BTreeMap::new)
        .insert(BANDWIDTH.to_owned(), bandwidth_capacity(gbps));
}

#[cfg(test)]
mod tests;
