//! Why a claim is (not) allocatable: per request, which devices qualify and
//! why each other device does not; per node, whether the requests fit
//! together under the claim's constraints; then one verdict.
//!
//! The order of checks is the scheduler's (DynamicResources plugin,
//! structured allocator): pool usable, class selectors, request selectors,
//! free (not held by another claim), taints tolerated, counters left. The
//! per-node search mirrors its backtracking over devices, bounded by a step
//! budget; when the budget runs out the verdict says so instead of guessing.

mod allocated;
pub mod device_status;
mod request;
mod solve;
pub mod subject;

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceConstraint, ResourceClaimSpec};
use serde::Serialize;

use crate::world::{DeviceId, World};
pub use device_status::DeviceStatusEntry;
pub use request::{Rejection, RequestSpec};
pub use subject::{Subject, subjects_for_claim, subjects_for_pod};

/// The verdict, as the scheduler would decide now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Allocatable {
    /// Already allocated.
    Allocated,
    Yes,
    No,
    /// We could not decide (a selector we cannot evaluate, or the search budget).
    Unknown,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedGroup {
    pub reason: String,
    pub count: usize,
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestReport {
    pub name: String,
    pub device_class: String,
    /// "4 devices" or "all matching devices".
    pub wants: String,
    pub selectors: Vec<String>,
    /// How many devices pass every check.
    pub candidate_count: usize,
    /// Candidates: devices that pass every check, as `node: device` (the first few).
    pub candidates: Vec<String>,
    /// Rejected devices of the request's class (devices of other classes are counted only).
    pub rejected: Vec<RejectedGroup>,
    pub other_class_devices: usize,
    /// Most candidates on one node, and that node.
    pub best_node: Option<(String, usize)>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueRow {
    pub node: String,
    pub value: String,
    /// request → how many it has with this value, against what it needs
    pub counts: BTreeMap<String, ValueCount>,
    pub satisfies_all: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueCount {
    pub have: usize,
    pub need: usize,
    /// The request is `allocationMode: All`: `need` is every matching device.
    pub all: bool,
}

impl ValueCount {
    pub fn short(&self) -> bool {
        self.have < self.need
    }
}

impl std::fmt::Display for ValueCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}{}",
            self.have,
            self.need,
            if self.all { " (all)" } else { "" }
        )
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConstraintReport {
    pub attribute: String,
    pub requests: Vec<String>,
    /// Values that satisfy every request at once, and the closest misses.
    pub rows: Vec<ValueRow>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChosenDevice {
    pub request: String,
    pub device: String,
    pub node: String,
    pub why: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub subject: String,
    pub allocatable: Allocatable,
    pub verdict: String,
    pub advice: Vec<String>,
    pub requests: Vec<RequestReport>,
    pub constraints: Vec<ConstraintReport>,
    pub nodes_that_fit: Vec<String>,
    pub chosen: Vec<ChosenDevice>,
    /// For an allocated claim: what no longer holds (a device gone, a
    /// selector or constraint now false, a count not met). Empty when the
    /// allocation still satisfies the claim.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// For an allocated claim: what the drivers wrote in its
    /// `status.devices` (none before they prepared it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_status: Vec<DeviceStatusEntry>,
}

/// Options that narrow the search.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Only this node (the pod is bound to it, or `--node`).
    pub node: Option<String>,
    /// Only these nodes (the pod's nodeSelector), when known.
    pub allowed: Option<Vec<String>>,
}

impl Scope {
    pub fn permits(&self, node: &str) -> bool {
        self.node.as_deref().is_none_or(|n| n == node)
            && self
                .allowed
                .as_ref()
                .is_none_or(|a| a.iter().any(|x| x == node))
    }

    /// How the report names the restriction.
    pub fn describe(&self) -> Option<String> {
        match (&self.node, &self.allowed) {
            (Some(n), _) => Some(format!("node {n}")),
            (None, Some(a)) => Some(format!(
                "the nodes its nodeSelector matches ({})",
                a.join(", ")
            )),
            (None, None) => None,
        }
    }
}

/// Explains one claim (or a claim-to-be from a template).
pub fn explain(world: &World, subject: &Subject, scope: &Scope) -> Explanation {
    if let Some(allocation) = &subject.allocation {
        return allocated::explain_allocated(world, subject, allocation);
    }
    let spec: &ResourceClaimSpec = &subject.spec;
    let plans = request::plans(spec);
    let evaluations: Vec<Vec<request::Evaluation>> = plans
        .iter()
        .map(|alternatives| {
            alternatives
                .iter()
                .map(|alt| request::evaluate(world, alt, subject.key.as_deref(), scope))
                .collect()
        })
        .collect();
    let constraints: Vec<&DeviceConstraint> = spec
        .devices
        .as_ref()
        .and_then(|d| d.constraints.as_ref())
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let nodes: Vec<&str> = match &scope.node {
        Some(n) => vec![n.as_str()],
        None => world
            .nodes()
            .into_iter()
            .filter(|n| scope.permits(n))
            .collect(),
    };
    let outcome = solve::solve_all(world, &plans, &evaluations, &constraints, &nodes);
    let requests: Vec<RequestReport> = plans
        .iter()
        .zip(&evaluations)
        .flat_map(|(alts, evals)| {
            alts.iter()
                .zip(evals)
                .map(|(alt, eval)| request::report(world, alt, eval))
        })
        .collect();
    let constraint_reports =
        solve::constraint_reports(world, &plans, &evaluations, &constraints, &nodes);
    let (allocatable, verdict, advice) = verdict(
        &plans,
        &evaluations,
        &requests,
        &constraint_reports,
        &outcome,
        scope,
    );
    Explanation {
        subject: subject.label.clone(),
        allocatable,
        verdict,
        advice,
        requests,
        constraints: constraint_reports,
        nodes_that_fit: outcome.fits.iter().map(|s| s.to_string()).collect(),
        chosen: outcome.example,
        problems: vec![],
        device_status: vec![],
    }
}

fn verdict(
    plans: &[Vec<RequestSpec>],
    evaluations: &[Vec<request::Evaluation>],
    requests: &[RequestReport],
    constraints: &[ConstraintReport],
    outcome: &solve::Outcome,
    scope: &Scope,
) -> (Allocatable, String, Vec<String>) {
    let where_ = scope
        .describe()
        .map(|d| format!(" on {d}"))
        .unwrap_or_default();
    if plans.is_empty() {
        return (
            Allocatable::Yes,
            "The claim requests no devices; it is allocatable at once.".to_string(),
            vec![],
        );
    }
    if outcome.runtime_error.is_none() && outcome.unknown.is_none() && !outcome.fits.is_empty() {
        let n = outcome.fits.len();
        let first = outcome
            .fits
            .first()
            .map(|s| s.to_string())
            .unwrap_or_default();
        return (
            Allocatable::Yes,
            format!(
                "Allocatable now: {n} node(s) can satisfy every request and constraint (for example {first})."
            ),
            vec!["If the pod is still Pending, look at its other claims and at non-DRA reasons (CPU, memory, node selectors) in `kubectl describe pod`.".to_string()],
        );
    }
    // A missing class stops every alternative of a request.
    for (alts, evals) in plans.iter().zip(evaluations) {
        if evals.iter().all(|e| !e.class_found) {
            let alt = &alts[0];
            return (
                Allocatable::No,
                format!(
                    "Not allocatable: request {:?} names DeviceClass {:?}, which does not exist.",
                    alt.name, alt.class
                ),
                vec![format!(
                    "Create DeviceClass {:?} (install the driver's chart) or correct deviceClassName.",
                    alt.class
                )],
            );
        }
    }
    if let Some(why) = &outcome.runtime_error {
        return (
            Allocatable::No,
            format!(
                "Not allocatable{where_}: {why}; a CEL runtime error fails the scheduler's whole attempt for the pod, on every node (an ExactCount request meets it only if the scheduler reaches that device before it has enough)."
            ),
            vec!["Guard attribute reads with has(...) or the optional syntax `.?name.orValue(default)`, and check the types the attributes have (`kubectl dra devices -o yaml`).".to_string()],
        );
    }
    if let Some(why) = &outcome.unknown {
        return (
            Allocatable::Unknown,
            format!("Cannot decide{where_}: {why}."),
            vec!["Check this request by hand; kubectl-dra does not guess.".to_string()],
        );
    }
    // Requests that cannot be met on any node on their own.
    for (report, alone) in requests_first(plans, requests).zip(&outcome.alone) {
        if *alone {
            continue;
        }
        let main = (!report.rejected.is_empty()).then(|| {
            report
                .rejected
                .iter()
                .take(3)
                .map(|g| format!("{} device(s): {}", g.count, g.reason))
                .collect::<Vec<_>>()
                .join("; ")
        });
        let (have, best) = report
            .best_node
            .clone()
            .map(|(n, c)| (c, format!(" (node {n} has {c})")))
            .unwrap_or((0, String::new()));
        let mut advice = Vec::new();
        for group in &report.rejected {
            advice.push(request::advice_for(&group.reason, report));
        }
        advice.dedup();
        let sentence = if report.candidate_count == 0 && report.rejected.is_empty() {
            format!(
                "Not allocatable{where_}: no published device matches DeviceClass {:?} of request {:?}; is its driver running?",
                report.device_class, report.name
            )
        } else if have == 0 {
            format!(
                "Not allocatable{where_}: no device can serve request {:?}; {}.",
                report.name,
                main.unwrap_or_else(|| "none is available".to_string())
            )
        } else {
            format!(
                "Not allocatable{where_}: request {:?} wants {} but at most {have} are available on one node{best}; the others: {}.",
                report.name,
                report.wants,
                main.unwrap_or_else(|| "none".to_string())
            )
        };
        if have > 0 {
            advice.insert(
                0,
                format!(
                    "Lower the count of request {:?} to {have}, or free devices.",
                    report.name
                ),
            );
        }
        return (Allocatable::No, sentence, advice);
    }
    // Each request alone fits somewhere: the constraints or the combination fail.
    if let Some(c) = constraints
        .first()
        .filter(|c| !c.rows.iter().any(|r| r.satisfies_all))
    {
        let closest = c.rows.first().map(|row| {
            let short: Vec<String> = row
                .counts
                .iter()
                .filter(|(_, count)| count.short())
                .map(|(r, count)| {
                    format!(
                        "request {r:?} has {} of {}{}",
                        count.have,
                        count.need,
                        if count.all {
                            " (all matching devices)"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            format!(
                "; closest: node {} with {} = {}, where {}",
                row.node,
                c.attribute,
                row.value,
                if short.is_empty() {
                    "the requests compete for the same devices".to_string()
                } else {
                    short.join(" and ")
                }
            )
        });
        return (
            Allocatable::No,
            format!(
                "Not allocatable{where_}: the matchAttribute constraint on {} cannot be met: no single value of it has enough free devices for {} at once{}.",
                c.attribute,
                c.requests
                    .iter()
                    .map(|r| format!("{r:?}"))
                    .collect::<Vec<_>>()
                    .join(" and "),
                closest.unwrap_or_default()
            ),
            constraint_advice(c),
        );
    }
    (
        Allocatable::No,
        format!(
            "Not allocatable{where_}: every request can be served somewhere, but no node can serve all of them together{}.",
            outcome
                .note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ),
        vec!["Split the claim, lower the counts, or free devices on one node.".to_string()],
    )
}

fn constraint_advice(c: &ConstraintReport) -> Vec<String> {
    let mut advice = Vec::new();
    if let Some(row) = c.rows.first() {
        for (request, count) in &row.counts {
            if count.all && count.short() {
                advice.push(format!(
                    "Request {request:?} takes all matching devices, and they span several {} values: narrow its selectors to one value (for example {}) or ask for a count instead.",
                    c.attribute, row.value
                ));
            } else if count.short() && count.have > 0 {
                advice.push(format!(
                    "Lower the count of request {request:?} to {}: that is what one {} group holds on node {}.",
                    count.have, c.attribute, row.node
                ));
            }
        }
    }
    advice.push(format!(
        "Or constrain on a larger group than {}, drop the constraint, or free devices of one group.",
        c.attribute
    ));
    advice
}

/// The report of each request's first alternative.
fn requests_first<'r>(
    plans: &'r [Vec<RequestSpec>],
    requests: &'r [RequestReport],
) -> impl Iterator<Item = &'r RequestReport> {
    let mut offset = 0;
    plans.iter().filter_map(move |alts| {
        let r = requests.get(offset);
        offset += alts.len();
        r
    })
}

/// The devices of a slice id in the world, for reports.
pub fn device_label(node: Option<&str>, id: &DeviceId) -> String {
    format!("{}: {}", node.unwrap_or("(any node)"), id.device)
}

#[cfg(test)]
mod tests;
