{{- define "dra-driver-lib.notes" -}}
{{ include "dra-driver-lib.fullname" . }} installed: driver {{ .Values.driver.name }} runs as DaemonSet
{{ .Release.Namespace }}/{{ include "dra-driver-lib.fullname" . }} on nodes of these instance types:
  {{ default (list "any (nodeAffinity.instanceTypes is empty)") .Values.nodeAffinity.instanceTypes | join ", " }}

Verify the install:

  # one driver pod per matching node, all Running
  kubectl -n {{ .Release.Namespace }} rollout status daemonset/{{ include "dra-driver-lib.fullname" . }}
  kubectl -n {{ .Release.Namespace }} get pods -l app.kubernetes.io/instance={{ .Release.Name }} -o wide

  # one pool (named after the node) per node, with the devices it found
  kubectl get resourceslices --field-selector spec.driver={{ .Values.driver.name }}

  # the DeviceClasses to name in ResourceClaims
  kubectl get deviceclasses
{{- if .Values.validatingAdmissionPolicy.enabled }}

Each node's driver may only write its own node's ResourceSlices (ValidatingAdmissionPolicy
{{ printf "%s-resourceslices" (include "dra-driver-lib.fullname" .) | trunc 63 | trimSuffix "-" }}).
{{- else if .Values.rbac.create }}

WARNING: validatingAdmissionPolicy.enabled=false. RBAC cannot say "only my node's objects", and
nothing else confines this driver now: the driver pod of any node may create, replace or delete
every node's ResourceSlices and write the claim status of every claim of its driver
{{- if contains "patch" (include (printf "%s.nodeVerbs" .Chart.Name) .) }}, and may patch
every Node object (labels included){{ end }}. Turn the policy on unless the cluster enforces
the same rules another way.
{{- end }}
{{- if .Values.hostNetwork }}

WARNING: hostNetwork=true. /metrics, /healthz and /readyz listen on port {{ .Values.metrics.port }} of every
address of the node, and no NetworkPolicy applies to a pod on the host network. Firewall the
port on the node, or bind it to the address your scrapers use (extraEnv METRICS_ADDRESS).
{{- end }}
{{- if not .Values.allowDevicePluginCoexistence }}

Do not run the classic device plugin for the same devices on these nodes: devices would be
handed out twice (allowDevicePluginCoexistence exists only for a supervised migration).
{{- end }}

Example claims: https://github.com/aws-dra/aws-dra-drivers/tree/main/examples
{{- end -}}
