//! [`check_node_policy`] on the Neuron chart's Node policy as the template
//! renders it (by hand, without Helm: `cargo xtask charts check` checks the
//! real rendering), and on each flaw that would let the driver change more
//! of its Node than its UltraServer labels.

use super::*;
use crate::charts::specs::NEURON;
use crate::manifest_checks;

const NODE_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: dra-neuron-dra-driver-nodes
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["nodes", "nodes/status"]
  matchConditions:
    - name: is-this-driver
      expression: >-
        request.userInfo.username == "system:serviceaccount:aws-dra:dra-neuron-dra-driver"
  variables:
    - name: userNodeName
      expression: >-
        request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')
    - name: labels
      expression: >-
        object.metadata.?labels.orValue({})
    - name: oldLabels
      expression: >-
        oldObject.metadata.?labels.orValue({})
  validations:
    - expression: variables.userNodeName != '' && variables.userNodeName == object.metadata.name
      messageExpression: >-
        "the driver on node '" + variables.userNodeName + "' may not modify Node '" + object.metadata.name + "'"
    - expression: >-
        variables.labels.all(k, k.startsWith('neuron.amazonaws.com/ultraserver-') ||
          (k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k])) &&
        variables.oldLabels.all(k, k.startsWith('neuron.amazonaws.com/ultraserver-') || k in variables.labels)
      message: only the labels
    - expression: request.?subResource.orValue('') == ''
      message: not the status
    - expression: >-
        object.?spec == oldObject.?spec &&
        object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({}) &&
        object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
        object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
        object.metadata.?generateName.orValue('') == oldObject.metadata.?generateName.orValue('')
      message: nothing else
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: dra-neuron-dra-driver-nodes
spec:
  policyName: dra-neuron-dra-driver-nodes
  validationActions: [Deny]
"#;

fn check(yaml: &str) -> Result<()> {
    let objs = manifest_checks::parse(yaml)?;
    check_node_policy(&Expect::defaults(&NEURON), &Rendering::from_objects(&objs)?)
}

#[test]
fn the_node_policy_passes() {
    check(NODE_POLICY).unwrap();
}

#[test]
fn each_node_policy_flaw_is_caught() {
    let table: [(&str, &str, &str, &str); 6] = [
        (
            "owner references not compared",
            "object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&\n",
            "",
            "ownerReferences",
        ),
        (
            "finalizers not compared",
            "object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&\n",
            "",
            "finalizers",
        ),
        (
            "annotations not compared",
            "object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({}) &&\n",
            "",
            "annotations",
        ),
        (
            "spec not compared",
            "object.?spec == oldObject.?spec &&",
            "",
            "object.?spec == oldObject.?spec",
        ),
        (
            "status writes not refused",
            "request.?subResource.orValue('') == ''",
            "object.metadata.name != ''",
            "subResource",
        ),
        (
            "nodes/status not matched",
            r#"resources: ["nodes", "nodes/status"]"#,
            r#"resources: ["nodes"]"#,
            "UPDATE of nodes, nodes/status",
        ),
    ];
    for (flaw, from, to, message) in table {
        assert!(
            NODE_POLICY.contains(from),
            "{flaw}: the fixture has no {from:?}"
        );
        let e = match check(&NODE_POLICY.replace(from, to)) {
            Ok(()) => panic!("not caught: {flaw}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains(message),
            "{flaw}: caught for another reason: {e}"
        );
    }
}
