//! Reconcile: observed slices + desired slices → the API calls to make.
//!
//! Pure, so that every case (new pool, drift, generation bumps) is a table
//! test. The rules, from the resource API reference:
//!
//! * The scheduler uses a pool only when it sees all `resourceSliceCount`
//!   slices of the highest generation, and ignores lower generations.
//! * The observed pool is kept at its generation `G` when every observed slice
//!   of generation `G` already carries the desired `resourceSliceCount` and at
//!   most **one** desired slice needs a write (a foreign edit or deletion of one
//!   slice, one slice's devices changing). One write is atomic for the
//!   scheduler, so no bump is needed.
//! * Otherwise (device set changing across slices, slice count changing, first
//!   publish) every desired slice is written at `G + 1` (1 for a new pool),
//!   reusing existing slice objects by name, and everything else is deleted.
//! * Slices not in the desired set (other pool names, extra indices, lower
//!   generations) are deleted, always after the writes, so the new pool is
//!   complete before the old one disappears.
//! * Equality is semantic: server-set metadata is ignored, empty lists/maps
//!   equal absent ones, and capacities compare by quantity value (`1Gi` ==
//!   `1024Mi`), so an unchanged pool produces no action at all.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use k8s_quantity::quantities_equal;

/// One API call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SliceAction {
    /// POST this slice.
    Create(ResourceSlice),
    /// PUT this slice; `metadata.resourceVersion` is the observed one, so a
    /// concurrent change makes the call fail with a conflict instead of being
    /// overwritten blindly.
    Update(ResourceSlice),
    /// DELETE the slice with this name, with a UID precondition when known.
    Delete {
        /// Slice name.
        name: String,
        /// Observed UID (precondition).
        uid: Option<String>,
    },
}

impl SliceAction {
    /// Name of the slice this action touches.
    pub(crate) fn slice_name(&self) -> &str {
        match self {
            Self::Create(s) | Self::Update(s) => s.metadata.name.as_deref().unwrap_or(""),
            Self::Delete { name, .. } => name,
        }
    }

    /// `create`, `update` or `delete` (for logs and metric labels).
    pub(crate) fn verb(&self) -> &'static str {
        match self {
            Self::Create(_) => "create",
            Self::Update(_) => "update",
            Self::Delete { .. } => "delete",
        }
    }
}

/// Computes the actions that turn `observed` (every slice matching our
/// `spec.nodeName`/`spec.driver` field selector) into `desired` (from
/// [`super::desired_pool`]; all share one pool name). Creates and updates come
/// first, in desired order, then deletes sorted by name.
pub(crate) fn reconcile(observed: &[ResourceSlice], desired: &[ResourceSlice]) -> Vec<SliceAction> {
    let Some(first) = desired.first() else {
        // Nothing desired at all (not produced by desired_pool): clean up.
        return deletes(observed.iter());
    };
    let pool_name = first.spec.pool.name.as_str();
    let desired_count = i64::try_from(desired.len()).unwrap_or(i64::MAX);
    let by_name: BTreeMap<&str, &ResourceSlice> = observed
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();

    let in_pool = || observed.iter().filter(|s| s.spec.pool.name == pool_name);
    let observed_generation = in_pool().map(|s| s.spec.pool.generation).max();

    let target = match observed_generation {
        None => first.spec.pool.generation,
        Some(g) => {
            let counts_match = in_pool()
                .filter(|s| s.spec.pool.generation == g)
                .all(|s| s.spec.pool.resource_slice_count == desired_count);
            let writes_at_g = desired
                .iter()
                .filter(|d| !observed_matches(by_name.get(slice_key(d)).copied(), d, g))
                .count();
            if counts_match && writes_at_g <= 1 {
                g
            } else {
                g.saturating_add(1)
            }
        }
    };

    let mut actions = Vec::new();
    for d in desired {
        match by_name.get(slice_key(d)).copied() {
            None => actions.push(SliceAction::Create(with_generation(d, target))),
            Some(o) if observed_matches(Some(o), d, target) => {}
            Some(o) => {
                let mut update = with_generation(d, target);
                update.metadata = ObjectMeta {
                    name: d.metadata.name.clone(),
                    owner_references: d
                        .metadata
                        .owner_references
                        .clone()
                        .or_else(|| o.metadata.owner_references.clone()),
                    // Keep others' metadata (our annotations win); replace the rest.
                    labels: o.metadata.labels.clone(),
                    annotations: merged(&o.metadata.annotations, &d.metadata.annotations),
                    finalizers: o.metadata.finalizers.clone(),
                    resource_version: o.metadata.resource_version.clone(),
                    ..Default::default()
                };
                actions.push(SliceAction::Update(update));
            }
        }
    }
    let desired_names: BTreeSet<&str> = desired.iter().map(slice_key).collect();
    actions.extend(deletes(observed.iter().filter(|s| {
        !desired_names.contains(s.metadata.name.as_deref().unwrap_or(""))
    })));
    actions
}

type Annotations = Option<BTreeMap<String, String>>;

fn merged(kept: &Annotations, ours: &Annotations) -> Annotations {
    let mut all = kept.clone().unwrap_or_default();
    all.extend(ours.clone().unwrap_or_default());
    (!all.is_empty()).then_some(all)
}

fn deletes<'a>(slices: impl Iterator<Item = &'a ResourceSlice>) -> Vec<SliceAction> {
    let mut out: Vec<SliceAction> = slices
        .filter_map(|s| {
            Some(SliceAction::Delete {
                name: s.metadata.name.clone()?,
                uid: s.metadata.uid.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.slice_name().cmp(b.slice_name()));
    out
}

fn slice_key(s: &ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or("")
}

fn with_generation(s: &ResourceSlice, generation: i64) -> ResourceSlice {
    let mut s = s.clone();
    s.spec.pool.generation = generation;
    s
}

/// Does `observed` already hold what `desired` would hold at `generation`?
fn observed_matches(
    observed: Option<&ResourceSlice>,
    desired: &ResourceSlice,
    generation: i64,
) -> bool {
    let Some(o) = observed else { return false };
    if o.spec.pool.generation != generation {
        return false;
    }
    if let Some(want) = &desired.metadata.owner_references
        && o.metadata.owner_references.as_ref() != Some(want)
    {
        return false;
    }
    let d = with_generation(desired, generation);
    spec_equal(&o.spec, &d.spec)
}

/// Semantic equality of slice specs: absent == empty, `false` == unset,
/// capacities by quantity value.
fn spec_equal(a: &ResourceSliceSpec, b: &ResourceSliceSpec) -> bool {
    let strip = |s: &ResourceSliceSpec| ResourceSliceSpec {
        devices: None,
        all_nodes: s.all_nodes.filter(|v| *v),
        per_device_node_selection: s.per_device_node_selection.filter(|v| *v),
        shared_counters: s.shared_counters.clone().filter(|v| !v.is_empty()),
        ..s.clone()
    };
    let (da, db) = (
        a.devices.as_deref().unwrap_or_default(),
        b.devices.as_deref().unwrap_or_default(),
    );
    strip(a) == strip(b)
        && da.len() == db.len()
        && da.iter().zip(db).all(|(x, y)| device_equal(x, y))
}

fn device_equal(a: &Device, b: &Device) -> bool {
    let strip = |d: &Device| Device {
        attributes: d.attributes.clone().filter(|m| !m.is_empty()),
        capacity: None,
        taints: d.taints.clone().filter(|v| !v.is_empty()),
        consumes_counters: d.consumes_counters.clone().filter(|v| !v.is_empty()),
        binding_conditions: d.binding_conditions.clone().filter(|v| !v.is_empty()),
        binding_failure_conditions: d
            .binding_failure_conditions
            .clone()
            .filter(|v| !v.is_empty()),
        all_nodes: d.all_nodes.filter(|v| *v),
        allow_multiple_allocations: d.allow_multiple_allocations.filter(|v| *v),
        binds_to_node: d.binds_to_node.filter(|v| *v),
        ..d.clone()
    };
    if strip(a) != strip(b) {
        return false;
    }
    let empty = BTreeMap::new();
    let (ca, cb) = (
        a.capacity.as_ref().unwrap_or(&empty),
        b.capacity.as_ref().unwrap_or(&empty),
    );
    ca.len() == cb.len()
        && ca.iter().zip(cb).all(|((ka, va), (kb, vb))| {
            ka == kb
                && va.request_policy == vb.request_policy
                && quantities_equal(&va.value.0, &vb.value.0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::desired::{NodeOwner, desired_pool};
    use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const DRIVER: &str = "neuron.aws.com";
    const NODE: &str = "node-a";

    fn devices(names: impl IntoIterator<Item = usize>) -> Vec<Device> {
        names
            .into_iter()
            .map(|i| Device {
                name: format!("neuron-device-{i:03}"),
                attributes: Some(
                    [(
                        "deviceId".to_string(),
                        DeviceAttribute {
                            int: Some(i as i64),
                            ..Default::default()
                        },
                    )]
                    .into(),
                ),
                capacity: Some(
                    [(
                        "memory".to_string(),
                        DeviceCapacity {
                            value: Quantity("1024Mi".into()),
                            ..Default::default()
                        },
                    )]
                    .into(),
                ),
                ..Default::default()
            })
            .collect()
    }

    fn desired(n: impl IntoIterator<Item = usize>) -> Vec<ResourceSlice> {
        let owner = NodeOwner {
            name: NODE.into(),
            uid: "node-uid".into(),
        };
        desired_pool(DRIVER, NODE, Some(&owner), &devices(n)).slices
    }

    /// What the API server hands back after storing `s`: server-set metadata
    /// filled in, empty collections dropped, quantities canonicalised.
    fn as_stored(s: &ResourceSlice, generation: i64, rv: u64) -> ResourceSlice {
        let mut s = s.clone();
        s.spec.pool.generation = generation;
        s.metadata.uid = Some(format!(
            "uid-{}",
            s.metadata.name.clone().unwrap_or_default()
        ));
        s.metadata.resource_version = Some(rv.to_string());
        s.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Default::default(),
        ));
        s.metadata.managed_fields = Some(vec![Default::default()]);
        for d in s.spec.devices.iter_mut().flatten() {
            for c in d.capacity.iter_mut().flat_map(|m| m.values_mut()) {
                if c.value.0 == "1024Mi" {
                    c.value = Quantity("1Gi".into());
                }
            }
        }
        s
    }

    fn stored(slices: &[ResourceSlice], generation: i64) -> Vec<ResourceSlice> {
        slices
            .iter()
            .enumerate()
            .map(|(i, s)| as_stored(s, generation, 100 + i as u64))
            .collect()
    }

    /// Compact view of actions: (verb, name suffix after the driver, generation, count, devices).
    fn summary(actions: &[SliceAction]) -> Vec<(&'static str, String, i64, i64, usize)> {
        actions
            .iter()
            .map(|a| {
                let short = a.slice_name().replace(&format!("{NODE}-{DRIVER}-"), "#");
                match a {
                    SliceAction::Create(s) | SliceAction::Update(s) => (
                        a.verb(),
                        short,
                        s.spec.pool.generation,
                        s.spec.pool.resource_slice_count,
                        s.spec.devices.as_ref().map_or(0, Vec::len),
                    ),
                    SliceAction::Delete { .. } => (a.verb(), short, 0, 0, 0),
                }
            })
            .collect()
    }

    #[test]
    fn reconcile_table() {
        let three = desired(0..300);
        let mut edited = stored(&desired(0..4), 3);
        if let Some(d) = edited[0].spec.devices.as_mut().and_then(|v| v.first_mut()) {
            d.attributes = Some(
                [(
                    "deviceId".to_string(),
                    DeviceAttribute {
                        int: Some(99),
                        ..Default::default()
                    },
                )]
                .into(),
            );
        }
        let mut owner_removed = stored(&desired(0..4), 3);
        owner_removed[0].metadata.owner_references = None;
        let mut lower_gen = stored(&desired(0..4), 4);
        lower_gen.push(as_stored(&three[1], 3, 7)); // stale #1 from an older, bigger pool
        let mut foreign_pool = stored(&desired(0..4), 1);
        let mut old = as_stored(&desired(0..1)[0], 9, 8);
        old.metadata.name = Some("old-name".into());
        old.spec.pool.name = "previous-pool".into();
        foreign_pool.push(old);
        let mut three_missing_one = stored(&three, 2);
        three_missing_one.remove(1);
        let mut three_one_lagging = stored(&three, 2);
        three_one_lagging[2].spec.pool.generation = 1;

        type Row = Vec<(&'static str, String, i64, i64, usize)>;
        let row = |v: &[(&'static str, &str, i64, i64, usize)]| -> Row {
            v.iter()
                .map(|(a, b, c, d, e)| (*a, b.to_string(), *c, *d, *e))
                .collect()
        };
        let cases: Vec<(&str, Vec<ResourceSlice>, Vec<ResourceSlice>, Row)> = vec![
            (
                "new pool",
                vec![],
                desired(0..4),
                row(&[("create", "#0", 1, 1, 4)]),
            ),
            (
                "new pool, zero devices",
                vec![],
                desired(0..0),
                row(&[("create", "#0", 1, 1, 0)]),
            ),
            (
                "unchanged",
                stored(&desired(0..4), 3),
                desired(0..4),
                row(&[]),
            ),
            (
                "unchanged zero devices",
                stored(&desired(0..0), 1),
                desired(0..0),
                row(&[]),
            ),
            (
                "unchanged 300 devices",
                stored(&three, 5),
                desired(0..300),
                row(&[]),
            ),
            (
                "one device added",
                stored(&desired(0..4), 3),
                desired(0..5),
                row(&[("update", "#0", 3, 1, 5)]),
            ),
            (
                "all devices removed",
                stored(&desired(0..4), 3),
                desired(0..0),
                row(&[("update", "#0", 3, 1, 0)]),
            ),
            (
                "300 devices on a new pool",
                vec![],
                desired(0..300),
                row(&[
                    ("create", "#0", 1, 3, 128),
                    ("create", "#1", 1, 3, 128),
                    ("create", "#2", 1, 3, 44),
                ]),
            ),
            (
                "grow 1 -> 3 slices",
                stored(&desired(0..4), 2),
                desired(0..300),
                row(&[
                    ("update", "#0", 3, 3, 128),
                    ("create", "#1", 3, 3, 128),
                    ("create", "#2", 3, 3, 44),
                ]),
            ),
            (
                "device added to middle of 3 slices shifts devices across slices",
                stored(&desired((0..300).filter(|i| *i != 5)), 2),
                desired(0..300),
                row(&[
                    ("update", "#0", 3, 3, 128),
                    ("update", "#1", 3, 3, 128),
                    ("update", "#2", 3, 3, 44),
                ]),
            ),
            (
                "device added to the last of 3 slices",
                stored(&three, 2),
                desired(0..301),
                row(&[("update", "#2", 2, 3, 45)]),
            ),
            (
                "shrink 3 -> 1 slices",
                stored(&three, 2),
                desired(0..10),
                row(&[
                    ("update", "#0", 3, 1, 10),
                    ("delete", "#1", 0, 0, 0),
                    ("delete", "#2", 0, 0, 0),
                ]),
            ),
            (
                "slice edited by someone else",
                edited,
                desired(0..4),
                row(&[("update", "#0", 3, 1, 4)]),
            ),
            (
                "owner reference removed by someone else",
                owner_removed,
                desired(0..4),
                row(&[("update", "#0", 3, 1, 4)]),
            ),
            (
                "slice deleted by someone else",
                three_missing_one,
                desired(0..300),
                row(&[("create", "#1", 2, 3, 128)]),
            ),
            (
                "only slice deleted by someone else",
                vec![],
                desired(0..4),
                row(&[("create", "#0", 1, 1, 4)]),
            ),
            (
                "one slice still at a lower generation",
                three_one_lagging,
                desired(0..300),
                row(&[("update", "#2", 2, 3, 44)]),
            ),
            (
                "lower generation present",
                lower_gen,
                desired(0..4),
                row(&[("delete", "#1", 0, 0, 0)]),
            ),
            (
                "slice of another pool name",
                foreign_pool,
                desired(0..4),
                row(&[("delete", "old-name", 0, 0, 0)]),
            ),
            (
                "zero devices, 3 slices before",
                stored(&three, 7),
                desired(0..0),
                row(&[
                    ("update", "#0", 8, 1, 0),
                    ("delete", "#1", 0, 0, 0),
                    ("delete", "#2", 0, 0, 0),
                ]),
            ),
        ];
        for (name, observed, want_desired, want) in cases {
            let actions = reconcile(&observed, &want_desired);
            assert_eq!(summary(&actions), want, "case: {name}");
        }
    }

    #[test]
    fn update_carries_observed_resource_version_and_foreign_metadata() {
        let mut observed = stored(&desired(0..4), 3);
        observed[0].metadata.labels = Some([("team".to_string(), "ml".to_string())].into());
        observed[0].metadata.finalizers = Some(vec!["example.com/keep".to_string()]);
        let actions = reconcile(&observed, &desired(0..5));
        let [SliceAction::Update(u)] = actions.as_slice() else {
            panic!("expected one update: {actions:?}")
        };
        assert_eq!(u.metadata.resource_version.as_deref(), Some("100"));
        assert_eq!(u.metadata.labels, observed[0].metadata.labels);
        assert_eq!(u.metadata.finalizers, observed[0].metadata.finalizers);
        assert_eq!(
            u.metadata.owner_references,
            desired(0..1)[0].metadata.owner_references
        );
        assert_eq!(u.metadata.uid, None, "server-set fields are not sent");
    }

    #[test]
    fn delete_carries_uid_precondition() {
        let observed = stored(&desired(0..300), 1);
        let actions = reconcile(&observed, &desired(0..1));
        assert!(actions.contains(&SliceAction::Delete {
            name: format!("{NODE}-{DRIVER}-1"),
            uid: Some(format!("uid-{NODE}-{DRIVER}-1")),
        }));
    }

    #[test]
    fn converges_after_applying_actions() {
        // Apply the actions to a simulated server and reconcile again:
        // every transition must reach a fixed point in one round.
        let pools = [
            desired(0..0),
            desired(0..4),
            desired(0..300),
            desired(0..129),
            desired(3..200),
            desired(0..0),
        ];
        let mut server: BTreeMap<String, ResourceSlice> = BTreeMap::new();
        let mut rv = 1000;
        for want in pools {
            let observed: Vec<_> = server.values().cloned().collect();
            for action in reconcile(&observed, &want) {
                rv += 1;
                match action {
                    SliceAction::Create(s) | SliceAction::Update(s) => {
                        let g = s.spec.pool.generation;
                        server.insert(slice_key(&s).to_string(), as_stored(&s, g, rv));
                    }
                    SliceAction::Delete { name, .. } => {
                        server.remove(&name);
                    }
                }
            }
            let observed: Vec<_> = server.values().cloned().collect();
            assert_eq!(reconcile(&observed, &want), vec![], "fixed point");
            let gens: BTreeSet<i64> = observed.iter().map(|s| s.spec.pool.generation).collect();
            assert_eq!(gens.len(), 1, "one generation left on the server");
            assert_eq!(observed.len(), want.len());
        }
    }

    #[test]
    fn semantic_equality_ignores_server_defaults() {
        let d = desired(0..2);
        let mut o = as_stored(&d[0], 1, 5);
        o.spec.all_nodes = Some(false);
        if let Some(dev) = o.spec.devices.as_mut().and_then(|v| v.first_mut()) {
            dev.taints = Some(vec![]);
            dev.binds_to_node = Some(false);
        }
        assert_eq!(reconcile(&[o.clone()], &d), vec![]);
        o.spec.all_nodes = Some(true);
        assert_eq!(reconcile(&[o], &d).len(), 1);
    }
}
