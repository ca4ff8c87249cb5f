//! One request against every device: the per-device checks in the
//! scheduler's order, and what they add up to.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequirements, DeviceToleration, ResourceClaimSpec};
use k8s_quantity::Quantity;

use super::{RejectedGroup, RequestReport, Scope};
use crate::cel::{Outcome, Selector};
use crate::world::{PublishedDevice, World};

mod capacity;

use capacity::Shortfall;

/// How many devices a request wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Count(usize),
    All,
}

/// One request, or one alternative of a `firstAvailable` request.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// `name`, or `name/subrequest`.
    pub name: String,
    /// The parent request's name (constraints may name either).
    pub parent: String,
    pub class: String,
    pub selectors: Vec<String>,
    pub mode: Mode,
    pub tolerations: Vec<DeviceToleration>,
    pub admin_access: bool,
    /// `capacity.requests`: what it asks of a shared device's capacities.
    pub capacity: Vec<(String, Quantity)>,
}

impl RequestSpec {
    pub fn wants(&self) -> String {
        match self.mode {
            Mode::Count(1) => "1 device".to_string(),
            Mode::Count(n) => format!("{n} devices"),
            Mode::All => "all matching devices".to_string(),
        }
    }
}

/// Each request of the claim, as its list of alternatives (one for `exactly`).
pub fn plans(spec: &ResourceClaimSpec) -> Vec<Vec<RequestSpec>> {
    let selectors = |s: &Option<Vec<k8s_openapi::api::resource::v1::DeviceSelector>>| {
        s.iter()
            .flatten()
            .filter_map(|sel| sel.cel.as_ref().map(|c| c.expression.clone()))
            .collect::<Vec<_>>()
    };
    let mode = |m: &Option<String>, count: Option<i64>| match m.as_deref() {
        Some("All") => Mode::All,
        _ => Mode::Count(usize::try_from(count.unwrap_or(1)).unwrap_or(0)),
    };
    // Quantities the API server accepted always parse.
    let capacity = |c: &Option<CapacityRequirements>| {
        c.iter()
            .flat_map(|c| c.requests.iter().flatten())
            .filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.clone(), q)))
            .collect::<Vec<_>>()
    };
    let mut out = Vec::new();
    for request in spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
    {
        if let Some(e) = &request.exactly {
            out.push(vec![RequestSpec {
                name: request.name.clone(),
                parent: request.name.clone(),
                class: e.device_class_name.clone(),
                selectors: selectors(&e.selectors),
                mode: mode(&e.allocation_mode, e.count),
                tolerations: e.tolerations.clone().unwrap_or_default(),
                admin_access: e.admin_access.unwrap_or(false),
                capacity: capacity(&e.capacity),
            }]);
        } else if let Some(subs) = &request.first_available {
            out.push(
                subs.iter()
                    .map(|s| RequestSpec {
                        name: format!("{}/{}", request.name, s.name),
                        parent: request.name.clone(),
                        class: s.device_class_name.clone(),
                        selectors: selectors(&s.selectors),
                        mode: mode(&s.allocation_mode, s.count),
                        tolerations: s.tolerations.clone().unwrap_or_default(),
                        admin_access: false,
                        capacity: capacity(&s.capacity),
                    })
                    .collect(),
            );
        }
    }
    out
}

/// Why one device cannot serve one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rejection {
    PoolIncomplete(String),
    OtherNode {
        node: String,
        wanted: String,
    },
    ClassSelector {
        index: usize,
        expression: String,
        outcome: String,
    },
    Selector {
        index: usize,
        expression: String,
        outcome: String,
    },
    HeldBy(Vec<String>),
    /// A device shared by capacity that cannot give the request its share.
    Capacity(String),
    Taint {
        key: String,
        value: String,
        effect: String,
        /// The DeviceTaintRule that puts it there; `None`: the slice does.
        rule: Option<String>,
    },
    Counters {
        set: String,
        counter: String,
        need: String,
        left: String,
    },
}

impl Rejection {
    /// Whether the device is outside the request's class (reported as a count only).
    fn other_class(&self) -> bool {
        matches!(self, Rejection::ClassSelector { outcome, .. } if outcome == "false")
    }

    pub fn describe(&self, class: &str) -> String {
        match self {
            Rejection::PoolIncomplete(why) => why.clone(),
            Rejection::OtherNode { node, wanted } => {
                format!("on node {node}, but the pod may only run on {wanted}")
            }
            Rejection::ClassSelector {
                index,
                expression,
                outcome,
            } => format!("selector #{index} of DeviceClass {class:?} `{expression}` is {outcome}"),
            Rejection::Selector {
                index,
                expression,
                outcome,
            } => {
                format!("request selector #{index} `{expression}` is {outcome}")
            }
            Rejection::HeldBy(claims) => {
                format!("already allocated to claim {}", claims.join(", "))
            }
            Rejection::Capacity(why) => why.clone(),
            Rejection::Taint {
                key,
                value,
                effect,
                rule,
            } => match rule {
                None => format!("taint {key}={value}:{effect} is not tolerated"),
                Some(rule) => format!(
                    "taint {key}={value}:{effect} (from DeviceTaintRule {rule}) is not tolerated"
                ),
            },
            Rejection::Counters {
                set,
                counter,
                need,
                left,
            } => {
                format!("not enough counters left: {set}/{counter} needs {need}, {left} left")
            }
        }
    }
}

/// The checks of one request against every device.
pub struct Evaluation {
    pub class_found: bool,
    /// Device indices (into `world.devices`) that pass every check.
    pub candidates: Vec<usize>,
    /// Device indices that pass the selectors (for `All`: they must all be free).
    pub selected: Vec<usize>,
    pub rejected: Vec<(usize, Rejection)>,
    /// Devices on which a selector fails at run time / cannot be evaluated.
    pub runtime_errors: Vec<(usize, String)>,
    pub unsupported: Vec<(usize, String)>,
}

fn shortfall_text(short: &Shortfall) -> String {
    match short {
        Shortfall::Undefined(name) => {
            format!("the request asks for capacity {name}, which the device does not have")
        }
        Shortfall::OutsidePolicy { capacity, amount } => format!(
            "{} of capacity {capacity} is outside the device's request policy",
            capacity::readable(*amount)
        ),
        Shortfall::NotEnough {
            capacity,
            need,
            left,
        } => format!(
            "not enough {capacity} left to share: needs {}, {} left",
            capacity::readable(*need),
            capacity::readable(*left)
        ),
    }
}

pub(super) fn outcome_text(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::Match => None,
        Outcome::NoMatch => Some("false".to_string()),
        Outcome::RuntimeError(e) => Some(format!("a CEL runtime error ({e})")),
        Outcome::Invalid(e) => Some(format!("an invalid selector ({e})")),
        Outcome::Unsupported(e) => Some(format!("not evaluable by kubectl-dra ({e})")),
    }
}

fn tolerated(
    taint: &k8s_openapi::api::resource::v1::DeviceTaint,
    tolerations: &[DeviceToleration],
) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key);
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        };
        // An empty key only goes with Exists.
        let key_rule = t.key.as_deref().is_some_and(|k| !k.is_empty())
            || t.operator.as_deref() == Some("Exists");
        key_ok && effect_ok && value_ok && key_rule
    })
}

/// What one request checks a device against.
pub struct Checks<'c> {
    pub class_selectors: &'c [Selector],
    pub selectors: &'c [Selector],
    pub spec: &'c RequestSpec,
    /// The claim being explained, whose own holdings do not count against it.
    pub own_claim: Option<&'c str>,
    pub scope: &'c Scope,
}

/// The checks of `spec` against one device, in the scheduler's order.
/// Returns the first rejection, or `None` when the device qualifies.
pub fn check_device(
    world: &World,
    device: &PublishedDevice,
    checks: &Checks,
    errors: &mut Vec<String>,
    unsupported: &mut Vec<String>,
) -> (bool, Option<Rejection>) {
    if let Some(problem) = &device.pool_problem {
        return (false, Some(Rejection::PoolIncomplete(problem.clone())));
    }
    let Checks {
        class_selectors,
        selectors,
        spec,
        own_claim,
        scope,
    } = *checks;
    for (list, is_class) in [(class_selectors, true), (selectors, false)] {
        for (index, selector) in list.iter().enumerate() {
            let outcome = device.evaluate(&world.env, selector);
            match &outcome {
                Outcome::RuntimeError(e) | Outcome::Invalid(e) => errors.push(e.clone()),
                Outcome::Unsupported(e) => unsupported.push(e.clone()),
                _ => {}
            }
            if let Some(text) = outcome_text(&outcome) {
                let expression = selector.source().to_string();
                return (
                    false,
                    Some(if is_class {
                        Rejection::ClassSelector {
                            index,
                            expression,
                            outcome: text,
                        }
                    } else {
                        Rejection::Selector {
                            index,
                            expression,
                            outcome: text,
                        }
                    }),
                );
            }
        }
    }
    // Selected. Now: node, free, taints, counters.
    if let Some(node) = device.node
        && !scope.permits(node)
    {
        return (
            true,
            Some(Rejection::OtherNode {
                node: node.to_string(),
                wanted: scope.describe().unwrap_or_default(),
            }),
        );
    }
    if !spec.admin_access
        && !device.device.allow_multiple_allocations.unwrap_or(false)
        && let Some(holders) = world.holders.get(&device.id)
    {
        let others: Vec<String> = holders
            .iter()
            .filter(|h| Some(h.as_str()) != own_claim)
            .cloned()
            .collect();
        if !others.is_empty() {
            return (true, Some(Rejection::HeldBy(others)));
        }
    }
    if !spec.admin_access
        && device.device.allow_multiple_allocations == Some(true)
        && let Err(short) = capacity::share(&spec.capacity, &device.device.consumable, |name| {
            world.capacity_used(&device.id, name, own_claim)
        })
    {
        return (true, Some(Rejection::Capacity(shortfall_text(&short))));
    }
    let taints = device.device.taints.iter().map(|t| (None, t));
    let from_rules = device.rule_taints.iter().map(|(r, t)| (Some(r), t));
    for (rule, taint) in taints.chain(from_rules) {
        if (taint.effect == "NoSchedule" || taint.effect == "NoExecute")
            && !tolerated(taint, &spec.tolerations)
        {
            return (
                true,
                Some(Rejection::Taint {
                    key: taint.key.clone(),
                    value: taint.value.clone().unwrap_or_default(),
                    effect: taint.effect.clone(),
                    rule: rule.cloned(),
                }),
            );
        }
    }
    for (key, need) in device.consumption() {
        let left = world.counters_left.get(&key).copied();
        if left.is_none_or(|l| l < need) {
            return (
                true,
                Some(Rejection::Counters {
                    set: key.2.to_string(),
                    counter: key.3.to_string(),
                    need: need.to_string(),
                    left: left.map_or("none".to_string(), |l| l.to_string()),
                }),
            );
        }
    }
    (true, None)
}

pub fn compile_class(world: &World, class: &str) -> Option<Vec<Selector>> {
    world.inventory.class(class).map(|c| {
        c.spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref())
            .map(|c| Selector::compile(&c.expression))
            .collect()
    })
}

pub fn evaluate(
    world: &World,
    spec: &RequestSpec,
    own_claim: Option<&str>,
    scope: &Scope,
) -> Evaluation {
    let mut eval = Evaluation {
        class_found: false,
        candidates: Vec::new(),
        selected: Vec::new(),
        rejected: Vec::new(),
        runtime_errors: Vec::new(),
        unsupported: Vec::new(),
    };
    let Some(class_selectors) = compile_class(world, &spec.class) else {
        return eval;
    };
    eval.class_found = true;
    let selectors: Vec<Selector> = spec
        .selectors
        .iter()
        .map(|s| Selector::compile(s))
        .collect();
    let checks = Checks {
        class_selectors: &class_selectors,
        selectors: &selectors,
        spec,
        own_claim,
        scope,
    };
    for (i, device) in world.devices.iter().enumerate() {
        let mut errors = Vec::new();
        let mut unsupported = Vec::new();
        let (selected, rejection) =
            check_device(world, device, &checks, &mut errors, &mut unsupported);
        if let Some(e) = errors.into_iter().next() {
            eval.runtime_errors.push((i, e));
        }
        if let Some(e) = unsupported.into_iter().next() {
            eval.unsupported.push((i, e));
        }
        if selected {
            eval.selected.push(i);
        }
        match rejection {
            None => eval.candidates.push(i),
            Some(r) => eval.rejected.push((i, r)),
        }
    }
    eval
}

const LIST_LIMIT: usize = 8;

fn label(world: &World, i: usize) -> String {
    let d = &world.devices[i];
    super::device_label(d.node, &d.id)
}

/// Devices grouped by node as `node: a, b, c`, cut after a few names.
fn short_list(world: &World, indices: &[usize]) -> Vec<String> {
    let mut out: Vec<String> = indices
        .iter()
        .take(LIST_LIMIT)
        .map(|&i| label(world, i))
        .collect();
    if indices.len() > LIST_LIMIT {
        out.push(format!("… and {} more", indices.len() - LIST_LIMIT));
    }
    out
}

pub fn report(world: &World, spec: &RequestSpec, eval: &Evaluation) -> RequestReport {
    let mut groups: BTreeMap<Rejection, Vec<usize>> = BTreeMap::new();
    let mut other_class = 0;
    for (i, r) in &eval.rejected {
        if r.other_class() {
            other_class += 1;
            continue;
        }
        // Group "held by" per holder set, node per node: these are what a reader acts on.
        groups.entry(r.clone()).or_default().push(*i);
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in &eval.candidates {
        *per_node
            .entry(world.devices[i].node.unwrap_or("(any node)"))
            .or_default() += 1;
    }
    let best_node = per_node
        .iter()
        .max_by_key(|(n, c)| (**c, std::cmp::Reverse(**n)))
        .map(|(n, c)| (n.to_string(), *c));
    let mut rejected: Vec<RejectedGroup> = groups
        .into_iter()
        .map(|(r, devices)| RejectedGroup {
            reason: r.describe(&spec.class),
            count: devices.len(),
            devices: short_list(world, &devices),
        })
        .collect();
    rejected.sort_by_key(|g| std::cmp::Reverse(g.count));
    RequestReport {
        name: spec.name.clone(),
        device_class: spec.class.clone(),
        wants: spec.wants(),
        selectors: spec.selectors.clone(),
        candidate_count: eval.candidates.len(),
        candidates: short_list(world, &eval.candidates),
        rejected,
        other_class_devices: other_class,
        best_node,
    }
}

/// What to change, for one reason a device was turned down.
pub fn advice_for(reason: &str, report: &RequestReport) -> String {
    if reason.starts_with("request selector") {
        format!(
            "Change or drop that selector of request {:?}: {reason}.",
            report.name
        )
    } else if reason.starts_with("selector #") {
        format!(
            "Use another DeviceClass than {:?} or relax its selectors: {reason}.",
            report.device_class
        )
    } else if reason.starts_with("already allocated") {
        format!(
            "Free the devices ({reason}): delete that claim's pod or claim, or wait for it to finish."
        )
    } else if reason.starts_with("taint ") {
        format!(
            "Repair the device, or add a matching toleration to request {:?} if it may use it anyway ({reason}).",
            report.name
        )
    } else if reason.starts_with("not enough counters") {
        "Other partitions of the same physical device use its counters: free them or ask for a smaller partition.".to_string()
    } else if reason.starts_with("on node") {
        "The pod may only run on other nodes (nodeName or nodeSelector): change that, or make the devices available there.".to_string()
    } else {
        format!("Wait for the driver to finish publishing ({reason}).")
    }
}
