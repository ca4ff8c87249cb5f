//! No silent clash: which of our devices another driver already publishes.
//!
//! Two publishers of one piece of hardware on one node are worse than
//! either alone:
//!
//! * AWS's Neuron DRA driver uses our driver name (`neuron.aws.com`) and our
//!   pool name (the node name). Each reconciler would delete the other's
//!   slices as stale, and the scheduler would see one pool with two
//!   writers. Every device of ours is then in the clash (same pool), so we
//!   withdraw the whole pool and never touch their slices.
//! * DRANET (`dra.net`) publishes the node's EFAs under its own name. The
//!   scheduler would hand one EFA to a claim through each driver. We
//!   withhold exactly the devices whose PCI address it lists.
//!
//! Everything here is pure: the slices the publisher's watch sees (every
//! driver on this node) and our devices in, the devices to withhold and
//! why out, so that each rule is a table test. The publisher
//! ([`super::publisher`]) logs, counts and reports the result.
//!
//! **Which slices are ours.** A slice of our driver on our node is ours when
//! its `managedFields` name our field manager [`FIELD_MANAGER`] (set on every
//! write since this check exists), or when its name is one of the
//! deterministic names we give our slices ([`super::slice_name`]:
//! `<node>-<driver>-<index>`): that covers slices written by a version
//! without the field manager, and slices whose fields someone else has since
//! taken over entirely. A publisher built on Kubernetes' Go helper
//! (`k8s.io/dynamic-resource-allocation/resourceslice`) names its slices
//! with `generateName` `<node>-<driver>-` and five random characters, never
//! a plain index, so it is never taken for us. A foreign publisher that chose
//! exactly our names would be taken for us; it would also collide with our
//! creates, which the publisher reports as failed writes.
//!
//! **Foreign identities** are data ([`FOREIGN_PUBLISHERS`]): a driver name
//! and the attributes that hold a device's PCI address in its slices. A
//! third driver is one more row.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};

use super::desired::slice_name;

/// Field manager of every write of the publisher: the positive mark of our
/// slices in their `managedFields`.
pub(crate) const FIELD_MANAGER: &str = "aws-dra-publisher";

/// The standard attribute that holds a device's PCI address, on our devices.
pub(crate) const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// Highest slice index recognised by name alone: far above any real pool
/// (a trn2 pool is 3 device slices and 2 counter slices), and short enough
/// that the five random characters of a `generateName` never match.
const MAX_INDEX_BY_NAME: usize = 999;

/// Another driver that may publish our hardware, and where its slices say
/// which PCI device a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ForeignIdentity {
    /// Its driver name (`spec.driver`).
    pub driver: &'static str,
    /// Fully qualified attribute names holding a PCI address
    /// (`DDDD:BB:DD.F`); an unqualified name in its slices is in its own
    /// domain, as the API defines.
    pub pci_attributes: &'static [&'static str],
}

/// The drivers whose devices are matched to ours by PCI address.
pub(crate) const FOREIGN_PUBLISHERS: &[ForeignIdentity] = &[ForeignIdentity {
    // DRANET: its own attribute, and the standard one where it sets it.
    driver: "dra.net",
    pci_attributes: &["dra.net/pciAddress", PCI_BUS_ID],
}];

/// Why a device of ours is withheld.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum ClashReason {
    /// A slice of our own driver on our node that we did not write: the
    /// pool is someone else's, every device of ours is withheld.
    SameDriver,
    /// A device of another driver with our device's PCI address.
    SamePciAddress {
        /// Their device's name.
        device: String,
        /// The PCI address both publish (normalised, lower case).
        pci_address: String,
    },
}

/// One foreign slice that clashes with us: the unit that is logged and
/// reported once when it appears.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ClashSource {
    /// Its driver.
    pub driver: String,
    /// Its name.
    pub slice: String,
}

/// What [`find_clashes`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Clashes {
    /// Foreign slices of our own driver: when any, the whole pool is withdrawn.
    pub same_driver: BTreeSet<ClashSource>,
    /// Our devices to withhold, each with the foreign slice and the reason.
    pub withheld: BTreeMap<String, Vec<(ClashSource, ClashReason)>>,
}

/// The devices the desired pool leaves out: what the publisher's slice
/// builder needs of [`Clashes`] (the report of them is
/// `publisher/clash_report.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Withheld {
    /// The whole pool: another writer uses our driver name.
    pub(crate) pool: bool,
    pub(crate) devices: BTreeSet<String>,
}

impl Withheld {
    pub(crate) fn of(clashes: &Clashes) -> Self {
        Withheld {
            pool: clashes.pool_withdrawn(),
            devices: clashes.withheld.keys().cloned().collect(),
        }
    }
}

impl Clashes {
    /// No clash at all.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.same_driver.is_empty() && self.withheld.is_empty()
    }

    /// Our pool must not exist: another publisher owns it.
    pub(crate) fn pool_withdrawn(&self) -> bool {
        !self.same_driver.is_empty()
    }

    /// Each foreign slice with the devices of ours it clashes with.
    pub(crate) fn by_source(&self) -> BTreeMap<ClashSource, BTreeSet<String>> {
        let mut out: BTreeMap<ClashSource, BTreeSet<String>> = BTreeMap::new();
        for (device, reasons) in &self.withheld {
            for (source, _) in reasons {
                out.entry(source.clone())
                    .or_default()
                    .insert(device.clone());
            }
        }
        for source in &self.same_driver {
            out.entry(source.clone()).or_default();
        }
        out
    }

    /// Withheld devices by the other driver's name (the metric's label).
    pub(crate) fn count_by_driver(&self) -> BTreeMap<String, usize> {
        let mut out: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for (device, reasons) in &self.withheld {
            for (source, _) in reasons {
                out.entry(source.driver.clone())
                    .or_default()
                    .insert(device.as_str());
            }
        }
        out.into_iter().map(|(d, s)| (d, s.len())).collect()
    }
}

/// Is `slice` (of our driver, on our node) one we wrote? See the module docs.
pub(crate) fn is_ours(slice: &ResourceSlice, driver: &str, node: &str) -> bool {
    let by_manager = slice
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some(FIELD_MANAGER));
    by_manager
        || slice
            .metadata
            .name
            .as_deref()
            .is_some_and(|name| is_our_slice_name(name, driver, node))
}

/// One of `slice_name(node, driver, i)` for a small `i`.
fn is_our_slice_name(name: &str, driver: &str, node: &str) -> bool {
    let Some((_, index)) = name.rsplit_once('-') else {
        return false;
    };
    let plain_index = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    plain_index
        && index
            .parse::<usize>()
            .is_ok_and(|i| i <= MAX_INDEX_BY_NAME && slice_name(node, driver, i) == name)
}

/// Our slices among `observed` (every slice on our node, any driver): the
/// only ones the reconciler may see, and so the only ones it may change.
pub(crate) fn own_slices<'a>(
    observed: impl IntoIterator<Item = &'a ResourceSlice>,
    driver: &str,
    node: &str,
) -> Vec<&'a ResourceSlice> {
    observed
        .into_iter()
        .filter(|s| s.spec.driver == driver && is_ours(s, driver, node))
        .collect()
}

/// Decides which of `ours` (our devices) another publisher already has on
/// `node`, from `observed` (every slice the watch holds for the node).
pub(crate) fn find_clashes(
    driver: &str,
    node: &str,
    observed: &[&ResourceSlice],
    ours: &[Device],
    foreign: &[ForeignIdentity],
) -> Clashes {
    let mut clashes = Clashes::default();
    let on_node = |s: &ResourceSlice| s.spec.node_name.as_deref() == Some(node);

    for s in observed.iter().filter(|s| on_node(s)) {
        if s.spec.driver == driver && !is_ours(s, driver, node) {
            clashes.same_driver.insert(source(s));
        }
    }
    if clashes.pool_withdrawn() {
        let first = clashes.same_driver.iter().next().cloned();
        if let Some(first) = first {
            for d in ours {
                clashes
                    .withheld
                    .entry(d.name.clone())
                    .or_default()
                    .push((first.clone(), ClashReason::SameDriver));
            }
        }
        return clashes;
    }

    // PCI address -> our devices with it.
    let mut our_pci: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for d in ours {
        if let Some(pci) = attribute_string(d, driver, PCI_BUS_ID).and_then(normalise_pci) {
            our_pci.entry(pci).or_default().push(d.name.as_str());
        }
    }
    if our_pci.is_empty() {
        return clashes;
    }
    for s in observed.iter().filter(|s| on_node(s)) {
        let Some(identity) = foreign.iter().find(|f| f.driver == s.spec.driver) else {
            continue;
        };
        if identity.driver == driver {
            // Our own name is the same-driver rule above, never a PCI match.
            continue;
        }
        for theirs in s.spec.devices.iter().flatten() {
            let addresses: BTreeSet<String> = identity
                .pci_attributes
                .iter()
                .filter_map(|a| attribute_string(theirs, identity.driver, a))
                .filter_map(normalise_pci)
                .collect();
            for pci in addresses {
                for name in our_pci.get(&pci).into_iter().flatten() {
                    clashes
                        .withheld
                        .entry((*name).to_owned())
                        .or_default()
                        .push((
                            source(s),
                            ClashReason::SamePciAddress {
                                device: theirs.name.clone(),
                                pci_address: pci.clone(),
                            },
                        ));
                }
            }
        }
    }
    for reasons in clashes.withheld.values_mut() {
        reasons.sort();
        reasons.dedup();
    }
    clashes
}

fn source(s: &ResourceSlice) -> ClashSource {
    ClashSource {
        driver: s.spec.driver.clone(),
        slice: s.metadata.name.clone().unwrap_or_default(),
    }
}

/// A string attribute by its fully qualified name; an unqualified key in a
/// slice of `driver` is in `driver`'s domain.
fn attribute_string(d: &Device, driver: &str, qualified: &str) -> Option<String> {
    let attrs = d.attributes.as_ref()?;
    let found = attrs.get(qualified).or_else(|| {
        let (domain, name) = qualified.split_once('/')?;
        (domain == driver).then(|| attrs.get(name)).flatten()
    })?;
    found.string.clone()
}

/// `DDDD:BB:DD.F`, lower case; a bare `BB:DD.F` gets domain `0000`.
/// Anything else is not a PCI address and matches nothing.
fn normalise_pci(raw: String) -> Option<String> {
    let s = raw.trim().to_ascii_lowercase();
    let full = match s.matches(':').count() {
        1 => format!("0000:{s}"),
        2 => s,
        _ => return None,
    };
    let (domain, rest) = full.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let hex = |x: &str, len: usize| x.len() == len && x.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && func.len() == 1 && hex(func, 1))
        .then_some(full)
}

#[cfg(test)]
mod tests;
