//! Can the requests be served together on one node? A depth-first search
//! over devices like the scheduler's, after a cheap pass that keeps, for each
//! `matchAttribute` constraint, only the values every request could meet.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::DeviceConstraint;

use super::request::{Evaluation, Mode, RequestSpec};
use super::{ChosenDevice, ConstraintReport, ValueCount, ValueRow};
use crate::world::{AttributeValue, CounterKey, World};
use k8s_quantity::Quantity;

/// Steps one node's search may take before we admit we do not know.
const BUDGET: usize = 200_000;

#[derive(Debug, Default)]
pub struct Outcome {
    /// Nodes where everything fits.
    pub fits: Vec<String>,
    /// One allocation that works, on the first fitting node.
    pub example: Vec<ChosenDevice>,
    pub runtime_error: Option<String>,
    pub unknown: Option<String>,
    pub note: Option<String>,
    /// Per request: can it be served on some node on its own?
    pub alone: Vec<bool>,
}

/// Device indices of one evaluation list, split by node.
struct ByNode<'a> {
    on: HashMap<&'a str, Vec<usize>>,
    anywhere: Vec<usize>,
}

impl<'a> ByNode<'a> {
    fn new(world: &World<'a>, list: impl Iterator<Item = usize>) -> Self {
        let mut on: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut anywhere = Vec::new();
        for i in list {
            match world.devices[i].node {
                Some(n) => on.entry(n).or_default().push(i),
                None => anywhere.push(i),
            }
        }
        ByNode { on, anywhere }
    }

    fn scope(&self, node: &str) -> Vec<usize> {
        let mut v = self.on.get(node).cloned().unwrap_or_default();
        v.extend_from_slice(&self.anywhere);
        v
    }
}

struct AltIndex<'a> {
    candidates: ByNode<'a>,
    selected: ByNode<'a>,
    errors: ByNode<'a>,
    unsupported: ByNode<'a>,
    /// What went wrong on each device of `errors` and `unsupported`.
    why: HashMap<usize, String>,
}

fn applies(c: &DeviceConstraint, spec: &RequestSpec) -> bool {
    c.requests
        .as_ref()
        .is_none_or(|r| r.is_empty() || r.iter().any(|x| *x == spec.parent || *x == spec.name))
}

/// The per-node problem: candidates per (request, alternative), filtered.
struct Problem<'p> {
    plans: &'p [Vec<RequestSpec>],
    candidates: Vec<Vec<Vec<usize>>>,
    selected: Vec<Vec<Vec<usize>>>,
    constraints: Vec<(&'p str, Vec<Vec<bool>>)>,
}

struct Search<'w, 'a> {
    world: &'w World<'a>,
    steps: usize,
    used: Vec<usize>,
    chosen: Vec<(String, usize)>,
    values: Vec<Option<AttributeValue>>,
    counters: HashMap<CounterKey, Quantity>,
}

impl Search<'_, '_> {
    fn fits_constraints(
        &self,
        p: &Problem,
        plan: usize,
        alt: usize,
        device: usize,
    ) -> Option<Vec<(usize, AttributeValue)>> {
        let mut newly = Vec::new();
        for (ci, (attr, applies)) in p.constraints.iter().enumerate() {
            if !applies[plan][alt] {
                continue;
            }
            let value = self.world.devices[device].attribute(attr)?;
            match &self.values[ci] {
                Some(v) if *v != value => return None,
                Some(_) => {}
                None => newly.push((ci, value)),
            }
        }
        Some(newly)
    }

    fn take(&mut self, p: &Problem, plan: usize, alt: usize, device: usize) -> Option<Vec<usize>> {
        let newly = self.fits_constraints(p, plan, alt, device)?;
        let d = &self.world.devices[device];
        let consumption: Vec<(CounterKey, Quantity)> = d.consumption().collect();
        for (key, need) in &consumption {
            let left = self
                .counters
                .get(key)
                .or(self.world.counters_left.get(key))
                .copied();
            if left.is_none_or(|l| l < *need) {
                return None;
            }
        }
        for (key, need) in consumption {
            let left = self
                .counters
                .get(&key)
                .or(self.world.counters_left.get(&key))
                .copied();
            if let Some(rest) = left.and_then(|l| l.checked_sub(need)) {
                self.counters.insert(key, rest);
            }
        }
        let fixed: Vec<usize> = newly.iter().map(|(ci, _)| *ci).collect();
        for (ci, v) in newly {
            self.values[ci] = Some(v);
        }
        self.used.push(device);
        self.chosen.push((p.plans[plan][alt].name.clone(), device));
        Some(fixed)
    }

    fn undo(&mut self, fixed: Vec<usize>) {
        for ci in fixed {
            self.values[ci] = None;
        }
        if let Some(device) = self.used.pop() {
            self.chosen.pop();
            let d = &self.world.devices[device];
            for (key, need) in d.consumption() {
                if let Some(left) = self.counters.get_mut(&key)
                    && let Some(sum) = left.checked_add(need)
                {
                    *left = sum;
                }
            }
        }
    }

    fn assign(&mut self, p: &Problem, plan: usize) -> bool {
        if plan == p.plans.len() {
            return true;
        }
        for alt in 0..p.plans[plan].len() {
            match p.plans[plan][alt].mode {
                Mode::All => {
                    let selected = &p.selected[plan][alt];
                    if selected.is_empty() || selected.len() != p.candidates[plan][alt].len() {
                        continue;
                    }
                    let mut undo = Vec::new();
                    let mut ok = true;
                    for &d in selected {
                        if self.used.contains(&d) {
                            ok = false;
                            break;
                        }
                        match self.take(p, plan, alt, d) {
                            Some(f) => undo.push(f),
                            None => {
                                ok = false;
                                break;
                            }
                        }
                    }
                    if ok && self.assign(p, plan + 1) {
                        return true;
                    }
                    while let Some(f) = undo.pop() {
                        self.undo(f);
                    }
                }
                Mode::Count(n) => {
                    if self.pick(p, plan, alt, n, 0) {
                        return true;
                    }
                }
            }
            if self.steps >= BUDGET {
                return false;
            }
        }
        false
    }

    fn pick(&mut self, p: &Problem, plan: usize, alt: usize, left: usize, start: usize) -> bool {
        if left == 0 {
            return self.assign(p, plan + 1);
        }
        let candidates = &p.candidates[plan][alt];
        if candidates.len().saturating_sub(start) < left {
            return false;
        }
        for (j, &d) in candidates.iter().enumerate().skip(start) {
            self.steps += 1;
            if self.steps >= BUDGET {
                return false;
            }
            if self.used.contains(&d) {
                continue;
            }
            if let Some(f) = self.take(p, plan, alt, d) {
                if self.pick(p, plan, alt, left - 1, j + 1) {
                    return true;
                }
                self.undo(f);
            }
        }
        false
    }
}

fn node_result(
    world: &World,
    plans: &[Vec<RequestSpec>],
    index: &[Vec<AltIndex>],
    constraints: &[&DeviceConstraint],
    node: &str,
) -> NodeResult {
    let mut unsupported = None;
    for alts in index {
        for a in alts {
            if let Some(&i) = a.errors.scope(node).first() {
                let d = &world.devices[i];
                return NodeResult::RuntimeError(format!(
                    "a selector fails at run time on device {} of node {node} ({})",
                    d.id,
                    a.why.get(&i).map_or("", String::as_str)
                ));
            }
            if let Some(&i) = a.unsupported.scope(node).first() {
                unsupported = Some(format!(
                    "a selector cannot be evaluated by kubectl-dra on device {} ({})",
                    world.devices[i].id,
                    a.why.get(&i).map_or("", String::as_str)
                ));
            }
        }
    }
    let mut candidates: Vec<Vec<Vec<usize>>> = index
        .iter()
        .map(|alts| alts.iter().map(|a| a.candidates.scope(node)).collect())
        .collect();
    let selected: Vec<Vec<Vec<usize>>> = index
        .iter()
        .map(|alts| alts.iter().map(|a| a.selected.scope(node)).collect())
        .collect();
    let mut constraint_list = Vec::new();
    for c in constraints {
        let Some(attr) = c.match_attribute.as_deref() else {
            continue;
        };
        let applies_to: Vec<Vec<bool>> = plans
            .iter()
            .map(|alts| alts.iter().map(|s| applies(c, s)).collect())
            .collect();
        // Values each applicable request could meet with some alternative.
        let mut viable: Option<Vec<AttributeValue>> = None;
        for (pi, alts) in plans.iter().enumerate() {
            let mut here: Vec<AttributeValue> = Vec::new();
            let mut any_applicable = false;
            for (ai, spec) in alts.iter().enumerate() {
                if !applies_to[pi][ai] {
                    continue;
                }
                any_applicable = true;
                let mut counts: BTreeMap<AttributeValue, usize> = BTreeMap::new();
                for &d in &candidates[pi][ai] {
                    if let Some(v) = world.devices[d].attribute(attr) {
                        *counts.entry(v).or_default() += 1;
                    }
                }
                match spec.mode {
                    Mode::Count(n) => {
                        here.extend(counts.into_iter().filter(|(_, c)| *c >= n).map(|(v, _)| v))
                    }
                    Mode::All => {
                        let sel = &selected[pi][ai];
                        let values: Vec<Option<AttributeValue>> = sel
                            .iter()
                            .map(|&d| world.devices[d].attribute(attr))
                            .collect();
                        if let Some(Some(first)) = values.first()
                            && values.iter().all(|v| v.as_ref() == Some(first))
                        {
                            here.push(first.clone());
                        }
                    }
                }
            }
            if any_applicable {
                viable = Some(match viable {
                    None => here,
                    Some(prev) => prev.into_iter().filter(|v| here.contains(v)).collect(),
                });
            }
        }
        if let Some(viable) = viable {
            if viable.is_empty() {
                return NodeResult::No;
            }
            for (pi, alts) in plans.iter().enumerate() {
                for ai in 0..alts.len() {
                    if applies_to[pi][ai] {
                        candidates[pi][ai].retain(|&d| {
                            world.devices[d]
                                .attribute(attr)
                                .is_some_and(|v| viable.contains(&v))
                        });
                    }
                }
            }
        }
        constraint_list.push((attr, applies_to));
    }
    let problem = Problem {
        plans,
        candidates,
        selected,
        constraints: constraint_list,
    };
    let mut search = Search {
        world,
        steps: 0,
        used: Vec::new(),
        chosen: Vec::new(),
        values: vec![None; problem.constraints.len()],
        counters: HashMap::new(),
    };
    // A selector we cannot evaluate might be a runtime error in the scheduler,
    // which would stop it: no verdict for this node either way.
    if let Some(why) = unsupported {
        return NodeResult::Unknown(why);
    }
    if search.assign(&problem, 0) {
        return NodeResult::Fits(search.chosen);
    }
    if search.steps >= BUDGET {
        return NodeResult::Unknown(format!("the search on node {node} ran past {BUDGET} steps"));
    }
    NodeResult::No
}

enum NodeResult {
    Fits(Vec<(String, usize)>),
    No,
    RuntimeError(String),
    Unknown(String),
}

fn build_index<'a>(world: &World<'a>, evaluations: &[Vec<Evaluation>]) -> Vec<Vec<AltIndex<'a>>> {
    evaluations
        .iter()
        .map(|alts| {
            alts.iter()
                .map(|e| AltIndex {
                    candidates: ByNode::new(world, e.candidates.iter().copied()),
                    selected: ByNode::new(world, e.selected.iter().copied()),
                    errors: ByNode::new(world, e.runtime_errors.iter().map(|(i, _)| *i)),
                    unsupported: ByNode::new(world, e.unsupported.iter().map(|(i, _)| *i)),
                    why: e
                        .runtime_errors
                        .iter()
                        .chain(&e.unsupported)
                        .cloned()
                        .collect(),
                })
                .collect()
        })
        .collect()
}

pub fn solve_all(
    world: &World,
    plans: &[Vec<RequestSpec>],
    evaluations: &[Vec<Evaluation>],
    constraints: &[&DeviceConstraint],
    nodes: &[&str],
) -> Outcome {
    let index = build_index(world, evaluations);
    let mut outcome = Outcome {
        alone: vec![false; plans.len()],
        ..Default::default()
    };
    for node in nodes {
        for (pi, alts) in plans.iter().enumerate() {
            if outcome.alone[pi] {
                continue;
            }
            outcome.alone[pi] = alts.iter().zip(&index[pi]).any(|(spec, a)| {
                let c = a.candidates.scope(node).len();
                match spec.mode {
                    Mode::Count(n) => c >= n,
                    Mode::All => c > 0 && c == a.selected.scope(node).len(),
                }
            });
        }
        match node_result(world, plans, &index, constraints, node) {
            NodeResult::Fits(chosen) => {
                if outcome.fits.is_empty() {
                    outcome.example = chosen
                        .into_iter()
                        .map(|(request, i)| ChosenDevice {
                            request,
                            device: world.devices[i].id.to_string(),
                            node: node.to_string(),
                            why: vec![],
                        })
                        .collect();
                }
                outcome.fits.push(node.to_string());
            }
            NodeResult::No => {}
            NodeResult::RuntimeError(e) => {
                outcome.runtime_error.get_or_insert(e);
            }
            NodeResult::Unknown(e) => {
                outcome.unknown.get_or_insert(e);
            }
        }
    }
    // A CEL runtime error on any node is an error of the scheduler's whole
    // Filter phase, not just "this node does not fit": the pod is not placed
    // even where it would fit. So it outranks `fits`, and so does a selector
    // we cannot evaluate, which might be such an error.
    if nodes.is_empty() {
        outcome.note = Some("no node publishes devices".to_string());
    }
    outcome
}

/// For each `matchAttribute` constraint: per node and value, how many
/// candidates each request has against what it needs.
pub fn constraint_reports(
    world: &World,
    plans: &[Vec<RequestSpec>],
    evaluations: &[Vec<Evaluation>],
    constraints: &[&DeviceConstraint],
    nodes: &[&str],
) -> Vec<ConstraintReport> {
    const ROWS: usize = 10;
    let index = build_index(world, evaluations);
    let mut out = Vec::new();
    for c in constraints {
        let Some(attr) = c.match_attribute.as_deref() else {
            continue;
        };
        let members: Vec<(usize, &RequestSpec)> = plans
            .iter()
            .enumerate()
            .filter_map(|(pi, alts)| alts.first().filter(|s| applies(c, s)).map(|s| (pi, s)))
            .collect();
        let mut rows: Vec<((usize, usize), ValueRow)> = Vec::new();
        for node in nodes {
            let mut table: BTreeMap<AttributeValue, BTreeMap<String, usize>> = BTreeMap::new();
            for (pi, spec) in &members {
                for d in index[*pi][0].candidates.scope(node) {
                    if let Some(v) = world.devices[d].attribute(attr) {
                        *table
                            .entry(v)
                            .or_default()
                            .entry(spec.name.clone())
                            .or_default() += 1;
                    }
                }
            }
            for (value, have) in table {
                let mut counts = BTreeMap::new();
                let mut shortfall = 0;
                for (pi, spec) in &members {
                    let h = have.get(&spec.name).copied().unwrap_or(0);
                    let (need, all) = match spec.mode {
                        Mode::Count(n) => (n, false),
                        Mode::All => (index[*pi][0].selected.scope(node).len(), true),
                    };
                    shortfall += need.saturating_sub(h);
                    counts.insert(spec.name.clone(), ValueCount { have: h, need, all });
                }
                // Closest first: fewest requests short, then fewest devices.
                let short = counts.values().filter(|c: &&ValueCount| c.short()).count();
                rows.push((
                    (short, shortfall),
                    ValueRow {
                        node: node.to_string(),
                        value: value.to_string(),
                        counts,
                        satisfies_all: short == 0,
                    },
                ));
            }
        }
        rows.sort_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| a.1.node.cmp(&b.1.node))
                .then_with(|| a.1.value.cmp(&b.1.value))
        });
        rows.truncate(ROWS);
        out.push(ConstraintReport {
            attribute: attr.to_string(),
            requests: members.iter().map(|(_, s)| s.name.clone()).collect(),
            rows: rows.into_iter().map(|(_, r)| r).collect(),
        });
    }
    out
}
