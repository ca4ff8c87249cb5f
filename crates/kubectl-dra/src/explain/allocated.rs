//! An allocated claim: what was chosen, why each device fits, and what no
//! longer holds about the allocation (a device gone, a selector now false,
//! a constraint broken, a count not met).
//!
//! The scheduler never revisits an allocation, so a problem here does not
//! move the pod; it says that the allocation would not be made again, and
//! the end-to-end suite uses it to check every allocation the real
//! scheduler makes against our reading of the claim.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::AllocationResult;

use super::request::{Mode, RequestSpec, compile_class, outcome_text, plans};
use super::{Allocatable, ChosenDevice, Explanation, Subject, device_status};
use crate::cel::Selector;
use crate::world::{AttributeValue, DeviceId, World};

/// Whether `request` (a result's request name, maybe `parent/sub`) is one
/// a constraint lists (by its own or its parent's name; none listed: all).
fn constrained(listed: Option<&Vec<String>>, request: &str) -> bool {
    listed.is_none_or(|r| {
        r.is_empty()
            || r.iter()
                .any(|x| x == request || request.starts_with(&format!("{x}/")))
    })
}

pub fn explain_allocated(
    world: &World,
    subject: &Subject,
    allocation: &AllocationResult,
) -> Explanation {
    let plans = plans(&subject.spec);
    let by_name: HashMap<String, &RequestSpec> = plans
        .iter()
        .flatten()
        .map(|s| (s.name.clone(), s))
        .collect();
    let constraints: Vec<_> = subject
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.constraints.clone())
        .unwrap_or_default();
    let mut problems = Vec::new();
    let mut chosen = Vec::new();
    let mut nodes = Vec::new();
    // Per constraint: the values its devices have.
    let mut constraint_values: Vec<BTreeSet<Option<AttributeValue>>> =
        vec![BTreeSet::new(); constraints.len()];
    let mut per_request: BTreeMap<String, usize> = BTreeMap::new();
    for result in allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
    {
        *per_request.entry(result.request.clone()).or_default() += 1;
        let id = DeviceId {
            driver: result.driver.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
        };
        let mut why = Vec::new();
        let node = match world.index_of(&id) {
            Some(i) => {
                let device = &world.devices[i];
                if let Some(spec) = by_name.get(&result.request) {
                    let class = compile_class(world, &spec.class).unwrap_or_default();
                    let failing = class
                        .iter()
                        .map(|s| (s, outcome_text(&device.evaluate(&world.env, s))))
                        .find_map(|(s, o)| o.map(|o| (s.source().to_string(), o)));
                    match failing {
                        None => why.push(format!("DeviceClass {:?} selects it", spec.class)),
                        Some((expr, o)) => {
                            let text = format!(
                                "selector `{expr}` of DeviceClass {:?} is now {o}",
                                spec.class
                            );
                            problems.push(format!("{id} for request {:?}: {text}", spec.name));
                            why.push(text);
                        }
                    }
                    let selectors: Vec<Selector> = spec
                        .selectors
                        .iter()
                        .map(|s| Selector::compile(s))
                        .collect();
                    for (n, s) in selectors.iter().enumerate() {
                        let o = device.evaluate(&world.env, s);
                        why.push(match outcome_text(&o) {
                            None => format!("selector #{n} `{}` is true", s.source()),
                            Some(t) => {
                                problems.push(format!(
                                    "{id} for request {:?}: selector #{n} `{}` is now {t}",
                                    spec.name,
                                    s.source()
                                ));
                                format!(
                                    "selector #{n} `{}` is now {t} (it changed since allocation)",
                                    s.source()
                                )
                            }
                        });
                    }
                } else {
                    problems.push(format!(
                        "{id} was allocated for request {:?}, which the claim does not have",
                        result.request
                    ));
                }
                for (c, values) in constraints.iter().zip(constraint_values.iter_mut()) {
                    if let (true, Some(attr)) = (
                        constrained(c.requests.as_ref(), &result.request),
                        &c.match_attribute,
                    ) {
                        let value = device.attribute(attr);
                        why.push(match &value {
                            Some(v) => {
                                format!("{attr} = {v}, shared by every device of the constraint")
                            }
                            None => format!("{attr} is missing (the constraint no longer holds)"),
                        });
                        values.insert(value);
                    }
                }
                device.node.unwrap_or("(any node)").to_string()
            }
            None => {
                problems.push(format!("{id} is no longer published"));
                why.push("the device is no longer published".to_string());
                "?".to_string()
            }
        };
        if !nodes.contains(&node) {
            nodes.push(node.clone());
        }
        chosen.push(ChosenDevice {
            request: result.request.clone(),
            device: id.to_string(),
            node,
            why,
        });
    }
    for (c, values) in constraints.iter().zip(&constraint_values) {
        let attr = c.match_attribute.as_deref().unwrap_or_default();
        if values.contains(&None) {
            problems.push(format!(
                "matchAttribute {attr}: a device of the constraint lacks the attribute"
            ));
        } else if values.len() > 1 {
            let list: Vec<String> = values.iter().flatten().map(ToString::to_string).collect();
            problems.push(format!(
                "matchAttribute {attr}: the devices differ ({})",
                list.join(", ")
            ));
        }
    }
    // ExactCount requests: as many results as asked (for a firstAvailable
    // request, of the alternative that was chosen).
    for alternatives in &plans {
        let got: Vec<(&RequestSpec, usize)> = alternatives
            .iter()
            .map(|a| (a, per_request.get(&a.name).copied().unwrap_or(0)))
            .collect();
        let used: Vec<&(&RequestSpec, usize)> = got.iter().filter(|(_, n)| *n > 0).collect();
        match used.as_slice() {
            [] if alternatives.iter().all(|a| !a.admin_access) => problems.push(format!(
                "request {:?} has no allocated device",
                alternatives
                    .first()
                    .map(|a| a.parent.as_str())
                    .unwrap_or("")
            )),
            [(spec, n)] => {
                if let Mode::Count(want) = spec.mode
                    && *n != want
                {
                    problems.push(format!(
                        "request {:?} wants {want} device(s), {n} allocated",
                        spec.name
                    ));
                }
            }
            [] => {}
            several => problems.push(format!(
                "request {:?} has devices of {} alternatives",
                alternatives
                    .first()
                    .map(|a| a.parent.as_str())
                    .unwrap_or(""),
                several.len()
            )),
        }
    }
    let reserved = subject.reserved_for.join(", ");
    Explanation {
        subject: subject.label.clone(),
        allocatable: Allocatable::Allocated,
        verdict: format!(
            "Allocated: {} device(s) on node {}{}.",
            chosen.len(),
            nodes.join(", "),
            if reserved.is_empty() {
                String::new()
            } else {
                format!(", reserved for {reserved}")
            }
        ),
        advice: vec![],
        requests: vec![],
        constraints: vec![],
        nodes_that_fit: nodes,
        chosen,
        problems,
        device_status: device_status::of_claim(world, subject.key.as_deref()),
    }
}
