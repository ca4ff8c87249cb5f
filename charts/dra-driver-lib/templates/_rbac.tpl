{{/*
Least-privilege access of the node plugin:
- resourceclaims: get, to read a claim's allocation at prepare time (by name;
  no list or watch: kubelet names the claims);
- resourceslices: what the publisher needs to reconcile its node's pool
  (list and watch with a field selector on its node, all drivers, to see
  another driver publishing the same hardware; get to read back a write the
  watch has not shown; create, update (replace), delete its own slices; it
  never patches a slice, so patch is not granted). Which slices it may touch is narrowed further by the
  ValidatingAdmissionPolicy: RBAC cannot express "only my node's objects";
- nodes: get, to set the Node as owner of the slices (garbage collection);
  the verbs come from "<chart name>.nodeVerbs": the Neuron driver also
  patches its own Node's UltraServer labels (the admission policy confines
  that to its own Node and those labels).
- events: create, for the Node event when another driver publishes the same
  devices on the node (reason DevicesPublishedByAnotherDriver, namespace
  default, as kubelet's Node events); never read, updated or deleted. A Role
  in namespace default, not the ClusterRole: the driver writes no event
  anywhere else.
- resourceclaims/status: patch, to write the claim's status.devices entries
  of the devices it prepared (server-side apply, always a PATCH: update is
  not granted). Since 1.36
  (DRAResourceClaimGranularStatusAuthorization) the API server also checks
  the synthetic resourceclaims/driver subresource, named by the driver:
  associated-node:patch lets a driver whose token is bound to the
  claim's node write its own driver's entries there, and nothing on other
  nodes (arbitrary-node:* is not granted). Older API servers ignore that
  rule; the admission policy confines status writes on every release.
*/}}
{{- define "dra-driver-lib.serviceaccount" -}}
{{- if .Values.serviceAccount.create -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "dra-driver-lib.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
  {{- with .Values.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "dra-driver-lib.rbac" -}}
{{- if .Values.rbac.create -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
rules:
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims"]
    verbs: ["get"]
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims/status"]
    verbs: ["patch"]
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceclaims/driver"]
    resourceNames: [{{ .Values.driver.name | quote }}]
    verbs: ["associated-node:patch"]
  - apiGroups: ["resource.k8s.io"]
    resources: ["resourceslices"]
    verbs: ["get", "list", "watch", "create", "update", "delete"]
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: [{{ include (printf "%s.nodeVerbs" .Chart.Name) . }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "dra-driver-lib.fullname" . }}
subjects:
  - kind: ServiceAccount
    name: {{ include "dra-driver-lib.serviceAccountName" . }}
    namespace: {{ .Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}-events
  namespace: default
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
rules:
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}-events
  namespace: default
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ include "dra-driver-lib.fullname" . }}-events
subjects:
  - kind: ServiceAccount
    name: {{ include "dra-driver-lib.serviceAccountName" . }}
    namespace: {{ .Release.Namespace }}
{{- end -}}
{{- end -}}
