{{/*
Each node's driver may only create, update or delete ResourceSlices of its own
node and its own driver name, so that a compromised node cannot publish (or
withdraw) devices for another node. The node comes from the service account
token bound to the pod: user.extra["authentication.kubernetes.io/node-name"]
(ServiceAccountTokenPodNodeInfo, on by default since 1.32). For DELETE there
is no new object: the old one is checked. All API versions are matched, so
that the policy cannot be bypassed through an older version of the API.
*/}}
{{- define "dra-driver-lib.validatingadmissionpolicy" -}}
{{- if .Values.validatingAdmissionPolicy.enabled -}}
{{- $name := printf "%s-resourceslices" (include "dra-driver-lib.fullname" .) | trunc 63 | trimSuffix "-" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE", "DELETE"]
        resources: ["resourceslices"]
  matchConditions:
    - name: is-this-driver
      expression: >-
        request.userInfo.username == "system:serviceaccount:{{ .Release.Namespace }}:{{ include "dra-driver-lib.serviceAccountName" . }}"
  variables:
    - name: userNodeName
      expression: >-
        request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')
    - name: slice
      expression: >-
        request.operation == 'DELETE' ? oldObject : object
    - name: sliceNodeName
      expression: >-
        variables.slice.spec.?nodeName.orValue('')
  validations:
    - expression: variables.userNodeName != ''
      message: >-
        the request carries no node name: the driver must run in a pod whose service account
        token is bound to its node (feature ServiceAccountTokenPodNodeInfo)
    - expression: variables.userNodeName == variables.sliceNodeName
      messageExpression: >-
        "the driver on node '" + variables.userNodeName + "' may not modify " +
        (variables.sliceNodeName == '' ? "ResourceSlices that are not bound to a node"
          : "ResourceSlices of node '" + variables.sliceNodeName + "'")
    - expression: variables.slice.spec.driver == {{ .Values.driver.name | quote }}
      messageExpression: >-
        "this service account may only modify ResourceSlices of driver {{ .Values.driver.name }}, not '" + variables.slice.spec.driver + "'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  policyName: {{ $name }}
  validationActions: [Deny]
{{- end -}}
{{- end -}}

{{/*
The Neuron driver patches its own Node's UltraServer labels (RBAC: nodes
patch). RBAC cannot narrow that to one Node or to some labels, so this
policy does: the driver's service account may update only the Node its
token is bound to, and only labels under `$prefix`; everything else stays
as it was. In the metadata that is every field a client can set: the other
labels, the annotations, ownerReferences (an owner that the garbage
collector finds gone deletes the Node), finalizers (they hold a deleted
Node) and generateName. The rest of the metadata is immutable (name, uid,
creationTimestamp), set by the API server (resourceVersion, generation,
managedFields, which record the driver's own patch) or set only by a delete
(deletionTimestamp). The spec is compared whole (taints, unschedulable,
podCIDR, providerID); the status cannot change through `nodes`, the API
server keeps the old one. RBAC grants no `nodes/status`; the policy matches
it anyway and refuses every write there, so that a wider grant later does
not open the metadata, which a status write may also change.
*/}}
{{- define "dra-driver-lib.nodelabelspolicy" -}}
{{- if .Values.validatingAdmissionPolicy.enabled -}}
{{- $name := printf "%s-nodes" (include "dra-driver-lib.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- $prefix := include (printf "%s.nodeLabelPrefix" .Chart.Name) . -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
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
        request.userInfo.username == "system:serviceaccount:{{ .Release.Namespace }}:{{ include "dra-driver-lib.serviceAccountName" . }}"
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
        variables.labels.all(k, k.startsWith({{ $prefix | squote }}) ||
          (k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k])) &&
        variables.oldLabels.all(k, k.startsWith({{ $prefix | squote }}) || k in variables.labels)
      message: >-
        this service account may only change the {{ $prefix }}* labels of its Node
    - expression: request.?subResource.orValue('') == ''
      message: >-
        this service account may not write a Node's status
    - expression: >-
        object.?spec == oldObject.?spec &&
        object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({}) &&
        object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
        object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
        object.metadata.?generateName.orValue('') == oldObject.metadata.?generateName.orValue('')
      message: >-
        this service account may change nothing of a Node but its {{ $prefix }}* labels:
        not the spec, annotations, ownerReferences or finalizers
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  policyName: {{ $name }}
  validationActions: [Deny]
{{- end -}}
{{- end -}}

{{/*
The driver writes the status.devices entries of the claims it prepared
(RBAC: resourceclaims/status patch/update). RBAC cannot narrow that to one
node, one driver or one field, and before 1.36 the API server checks nothing
more; so this policy does, on every release: the driver's service account
may add, change or remove only entries of its own driver in the pool of the
node its token is bound to (the pool is the node name); every other entry,
the allocation and reservedFor stay as they were. From 1.36 the API server's
own resourceclaims/driver check (associated-node verbs) says the same for
the driver and the node.
*/}}
{{- define "dra-driver-lib.claimstatuspolicy" -}}
{{- if .Values.validatingAdmissionPolicy.enabled -}}
{{- $name := printf "%s-resourceclaims" (include "dra-driver-lib.fullname" .) | trunc 63 | trimSuffix "-" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["resource.k8s.io"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["resourceclaims/status"]
  matchConditions:
    - name: is-this-driver
      expression: >-
        request.userInfo.username == "system:serviceaccount:{{ .Release.Namespace }}:{{ include "dra-driver-lib.serviceAccountName" . }}"
  variables:
    - name: userNodeName
      expression: >-
        request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')
    - name: others
      expression: >-
        object.status.?devices.orValue([]).filter(d,
          d.driver != {{ .Values.driver.name | quote }} || d.pool != variables.userNodeName)
    - name: oldOthers
      expression: >-
        oldObject.status.?devices.orValue([]).filter(d,
          d.driver != {{ .Values.driver.name | quote }} || d.pool != variables.userNodeName)
    - name: allocation
      expression: >-
        has(object.status) && has(object.status.allocation) ? [object.status.allocation] : []
    - name: oldAllocation
      expression: >-
        has(oldObject.status) && has(oldObject.status.allocation) ? [oldObject.status.allocation] : []
  validations:
    - expression: variables.userNodeName != ''
      message: >-
        the request carries no node name: the driver must run in a pod whose service account
        token is bound to its node (feature ServiceAccountTokenPodNodeInfo)
    - expression: >-
        variables.others.size() == variables.oldOthers.size() &&
        variables.others.all(d, d in variables.oldOthers)
      messageExpression: >-
        "the driver on node '" + variables.userNodeName + "' may only write the status.devices
        entries of driver {{ .Values.driver.name }} in pool '" + variables.userNodeName + "'"
    - expression: >-
        variables.allocation == variables.oldAllocation &&
        object.status.?reservedFor.orValue([]) == oldObject.status.?reservedFor.orValue([])
      message: >-
        this service account may not change a claim's allocation or reservedFor
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  policyName: {{ $name }}
  validationActions: [Deny]
{{- end -}}
{{- end -}}
