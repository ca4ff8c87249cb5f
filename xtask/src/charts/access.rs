//! The access-control objects of a driver chart's rendering: least-privilege
//! RBAC bound to the driver's service account only, and the admission policy
//! that confines each node's driver to the ResourceSlices of its own node
//! and driver.

use anyhow::{Context, Result, ensure};

use crate::charts::expect::{Expect, NAMESPACE};
use crate::charts::rendering::{Rendering, id, json, one};
use crate::charts::specs::ChartSpec;
use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;

pub fn check_rbac(spec: &ChartSpec, expect: &Expect, r: &Rendering) -> Result<()> {
    let role = one(&r.cluster_roles, Some(&expect.fullname))?;
    let rules = role
        .rules
        .as_deref()
        .with_context(|| format!("{} without rules", id(role)))?;
    let mut got: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for res in rule.resources.iter().flatten() {
                got.push((group, res, rule.verbs.iter().map(String::as_str).collect()));
            }
        }
    }
    got.sort();
    let want: Vec<(&str, &str, Vec<&str>)> = vec![
        ("", "nodes", expect.node_verbs.to_vec()),
        ("resource.k8s.io", "resourceclaims", vec!["get"]),
        // Since 1.36 writing status.devices also needs this, per driver name;
        // server-side apply is always a PATCH.
        (
            "resource.k8s.io",
            "resourceclaims/driver",
            vec!["associated-node:patch"],
        ),
        ("resource.k8s.io", "resourceclaims/status", vec!["patch"]),
        // get: the publisher reads back a write its watch has not shown;
        // it replaces slices, it never patches them.
        (
            "resource.k8s.io",
            "resourceslices",
            vec!["get", "list", "watch", "create", "update", "delete"],
        ),
    ];
    ensure!(
        got == want,
        "{} rules are not least-privilege:\n got {got:?}\nwant {want:?}",
        id(role)
    );
    // Only the driver's own entries: the rule names the driver, and no
    // `arbitrary-node:` verb lets it write claims of other nodes.
    let named: Vec<_> = rules
        .iter()
        .filter(|rule| rule.resource_names.is_some())
        .map(|rule| (rule.resources.clone(), rule.resource_names.clone()))
        .collect();
    ensure!(
        named
            == [(
                Some(vec!["resourceclaims/driver".to_owned()]),
                Some(vec![spec.driver.to_owned()])
            )],
        "{}: the resourceclaims/driver rule must name exactly the driver {}: {named:?}",
        id(role),
        spec.driver
    );
    let binding = one(&r.cluster_role_bindings, Some(&expect.fullname))?;
    // Exactly one subject: any other would be granted the driver's rights.
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    ensure!(
        matches!(subjects, [s] if s.kind == "ServiceAccount"
            && s.name == expect.service_account
            && s.namespace.as_deref() == Some(NAMESPACE))
            && binding.role_ref.kind == "ClusterRole"
            && binding.role_ref.name == expect.fullname,
        "{} does not bind exactly the driver's service account {NAMESPACE}/{} to ClusterRole {}: subjects {}, roleRef {}",
        id(binding),
        expect.service_account,
        expect.fullname,
        json(&binding.subjects),
        json(&binding.role_ref)
    );
    check_events_role(expect, r)
}

/// Events are written in one namespace only (the Node events go to
/// `default`, as kubelet's): a Role there with `create` alone, bound to the
/// driver's service account alone; nothing cluster-wide.
fn check_events_role(expect: &Expect, r: &Rendering) -> Result<()> {
    let name = format!("{}-events", expect.fullname);
    let role = one(&r.roles, Some(&name))?;
    ensure!(
        role.metadata.namespace.as_deref() == Some("default"),
        "{} is not in namespace default",
        id(role)
    );
    let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role
        .rules
        .iter()
        .flatten()
        .map(|rule| {
            (
                rule.api_groups.clone().unwrap_or_default(),
                rule.resources.clone().unwrap_or_default(),
                rule.verbs.clone(),
            )
        })
        .collect();
    ensure!(
        rules
            == [(
                vec![String::new()],
                vec!["events".into()],
                vec!["create".into()]
            )],
        "{} grants more than creating events: {rules:?}",
        id(role)
    );
    let binding = one(&r.role_bindings, Some(&name))?;
    let subjects = binding.subjects.as_deref().unwrap_or_default();
    ensure!(
        binding.metadata.namespace.as_deref() == Some("default")
            && matches!(subjects, [s] if s.kind == "ServiceAccount"
                && s.name == expect.service_account
                && s.namespace.as_deref() == Some(NAMESPACE))
            && binding.role_ref.kind == "Role"
            && binding.role_ref.name == name,
        "{} does not bind exactly the driver's service account to Role default/{name}: subjects {}, roleRef {}",
        id(binding),
        json(&binding.subjects),
        json(&binding.role_ref)
    );
    Ok(())
}

/// A policy's name as the chart truncates it.
fn policy_name(expect: &Expect, suffix: &str) -> String {
    let mut name = format!("{}-{suffix}", expect.fullname);
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

pub fn check_vap(spec: &ChartSpec, expect: &Expect, r: &Rendering) -> Result<()> {
    let patches_nodes = spec.node_verbs.contains(&"patch");
    ensure!(
        r.policies.len() == 2 + usize::from(patches_nodes),
        "expected {} admission policies, found {:?}",
        2 + usize::from(patches_nodes),
        r.policies.iter().map(id).collect::<Vec<_>>()
    );
    if patches_nodes {
        check_node_policy(expect, r)?;
    }
    check_claim_status_policy(spec, expect, r)?;
    let (policy, p) = matching_policy(
        expect,
        r,
        "resourceslices",
        "resource.k8s.io",
        &["CREATE", "UPDATE", "DELETE"],
    )?;
    let user = format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        expect.service_account
    );
    let cond = p
        .match_conditions
        .as_ref()
        .and_then(|c| c.first())
        .map(|c| c.expression.as_str())
        .unwrap_or_default();
    ensure!(
        cond.contains(&format!("request.userInfo.username == \"{user}\"")),
        "{}: policy must apply to the driver's service account only: {cond}",
        id(policy)
    );
    // Every CEL expression of the policy (not the plain messages).
    let cel: Vec<&str> = p
        .variables
        .iter()
        .flatten()
        .map(|v| v.expression.as_str())
        .chain(p.validations.iter().flatten().flat_map(|v| {
            std::iter::once(v.expression.as_str()).chain(v.message_expression.as_deref())
        }))
        .chain(
            p.match_conditions
                .iter()
                .flatten()
                .map(|c| c.expression.as_str()),
        )
        .chain(
            p.audit_annotations
                .iter()
                .flatten()
                .map(|a| a.value_expression.as_str()),
        )
        .collect();
    for needle in [
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0]",
        "request.operation == 'DELETE' ? oldObject : object",
        "variables.slice.spec.?nodeName",
        "variables.userNodeName == variables.sliceNodeName",
        &format!("variables.slice.spec.driver == \"{}\"", spec.driver),
    ] {
        ensure_cel_contains(policy, &cel, needle)?;
    }
    check_binding(r, policy)
}

/// The binding of `policy` denies what the policy refuses.
fn check_binding(r: &Rendering, policy: &ValidatingAdmissionPolicy) -> Result<()> {
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    let binding = one(&r.policy_bindings, Some(name))?;
    let b = binding.spec.as_ref();
    ensure!(
        b.and_then(|b| b.policy_name.as_deref()) == policy.metadata.name.as_deref()
            && b.and_then(|b| b.validation_actions.as_deref()) == Some(&["Deny".to_owned()][..]),
        "{}: policy binding must Deny with {}: {}",
        id(binding),
        id(policy),
        json(&b)
    );
    Ok(())
}

/// The chart's admission policy for `resource` (named after it), with what
/// both policies must have: it fails closed, and its one rule matches
/// exactly `operations` on `resource` of `group` in every API version.
fn matching_policy<'r>(
    expect: &Expect,
    r: &'r Rendering,
    resource: &str,
    group: &str,
    operations: &[&str],
) -> Result<(
    &'r ValidatingAdmissionPolicy,
    &'r k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec,
)> {
    matching_policy_named(expect, r, resource, &[resource], group, operations)
}

/// [`matching_policy`] for a policy named after `suffix` that matches
/// exactly `resources` (subresources such as `resourceclaims/status`).
fn matching_policy_named<'r>(
    expect: &Expect,
    r: &'r Rendering,
    suffix: &str,
    resources: &[&str],
    group: &str,
    operations: &[&str],
) -> Result<(
    &'r ValidatingAdmissionPolicy,
    &'r k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec,
)> {
    let policy = one(&r.policies, Some(&policy_name(expect, suffix)))?;
    let p = policy
        .spec
        .as_ref()
        .with_context(|| format!("{} without spec", id(policy)))?;
    ensure!(
        p.failure_policy.as_deref() == Some("Fail"),
        "{}: policy must fail closed, failurePolicy {:?}",
        id(policy),
        p.failure_policy
    );
    let rule = p
        .match_constraints
        .as_ref()
        .and_then(|m| m.resource_rules.as_ref())
        .and_then(|r| r.first());
    let list = |l: Option<&Vec<String>>| l.cloned().unwrap_or_default();
    ensure!(
        rule.is_some_and(|rule| list(rule.resources.as_ref()) == resources
            && list(rule.api_groups.as_ref()) == [group]
            && list(rule.operations.as_ref()) == operations
            && list(rule.api_versions.as_ref()) == ["*"]),
        "{}: policy must match {} of {} in every version: {}",
        id(policy),
        operations.join("/"),
        resources.join(", "),
        json(&rule)
    );
    Ok((policy, p))
}

/// The Neuron driver may patch Nodes (its UltraServer labels): a policy
/// confines that to its own Node and to those labels. Everything else of
/// the Node stays as it was: the spec, and every metadata field a client
/// can set (an owner reference lets the garbage collector delete the Node,
/// a finalizer holds a deleted one). It also matches `nodes/status`, which
/// RBAC does not grant, and refuses every write there.
fn check_node_policy(expect: &Expect, r: &Rendering) -> Result<()> {
    let (policy, p) = matching_policy_named(
        expect,
        r,
        "nodes",
        &["nodes", "nodes/status"],
        "",
        &["UPDATE"],
    )?;
    let user = format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        expect.service_account
    );
    let cel = conditions_variables_validations(p);
    for needle in [
        format!("request.userInfo.username == \"{user}\""),
        "variables.userNodeName == object.metadata.name".to_owned(),
        "k.startsWith('neuron.amazonaws.com/ultraserver-')".to_owned(),
        "request.?subResource.orValue('') == ''".to_owned(),
        "object.?spec == oldObject.?spec".to_owned(),
        "object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({})"
            .to_owned(),
        "object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])"
            .to_owned(),
        "object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([])"
            .to_owned(),
        "object.metadata.?generateName.orValue('') == oldObject.metadata.?generateName.orValue('')"
            .to_owned(),
    ] {
        ensure_cel_contains(policy, &cel, &needle)?;
    }
    check_binding(r, policy)
}

/// The driver may patch claim status (its `status.devices` entries): a
/// policy confines that to its own driver's entries in its own node's pool,
/// and keeps the allocation and reservedFor as they were.
fn check_claim_status_policy(spec: &ChartSpec, expect: &Expect, r: &Rendering) -> Result<()> {
    let (policy, p) = matching_policy_named(
        expect,
        r,
        "resourceclaims",
        &["resourceclaims/status"],
        "resource.k8s.io",
        &["UPDATE"],
    )?;
    let user = format!(
        "system:serviceaccount:{NAMESPACE}:{}",
        expect.service_account
    );
    let cel = conditions_variables_validations(p);
    for needle in [
        format!("request.userInfo.username == \"{user}\""),
        "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0]".to_owned(),
        format!(
            "d.driver != \"{}\" || d.pool != variables.userNodeName",
            spec.driver
        ),
        "variables.others.all(d, d in variables.oldOthers)".to_owned(),
        "variables.allocation == variables.oldAllocation".to_owned(),
        "object.status.?reservedFor.orValue([]) == oldObject.status.?reservedFor.orValue([])"
            .to_owned(),
    ] {
        ensure_cel_contains(policy, &cel, &needle)?;
    }
    check_binding(r, policy)
}

/// The CEL of a policy's match conditions, variables and validations.
fn conditions_variables_validations(
    p: &k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec,
) -> Vec<&str> {
    p.match_conditions
        .iter()
        .flatten()
        .map(|c| c.expression.as_str())
        .chain(p.variables.iter().flatten().map(|v| v.expression.as_str()))
        .chain(
            p.validations
                .iter()
                .flatten()
                .map(|v| v.expression.as_str()),
        )
        .collect()
}

/// Fails unless one expression of `cel` (of `policy`) contains `needle`.
fn ensure_cel_contains(
    policy: &ValidatingAdmissionPolicy,
    cel: &[&str],
    needle: &str,
) -> Result<()> {
    ensure!(
        cel.iter().any(|e| e.contains(needle)),
        "{}: no CEL expression of the policy contains `{needle}`",
        id(policy)
    );
    Ok(())
}

#[cfg(test)]
mod tests;
