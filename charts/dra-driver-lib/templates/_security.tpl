{{/*
Security contexts of the driver pod and container: our defaults, with the
`podSecurityContext` and `securityContext` values merged over them (a key
given in values wins; a nested object such as `capabilities` or
`seLinuxOptions` is merged key by key). What the overrides are for: node
images that need a label or profile we cannot know, e.g. Bottlerocket's
SELinux type for containers that write host directories (docs/install.md).

Defaults, and why. The host directories the driver writes (kubelet plugin and
registry dirs, CDI dir) belong to root with mode 0755/0750, so the process
runs as UID 0 -- but with NO capabilities: as the owner of those directories
root needs none to create its sockets and spec files, and root-only sysfs
files (Neuron's connected_devices, core_count) are readable by their owner
without CAP_DAC_OVERRIDE. A non-root UID would need CAP_DAC_OVERRIDE, which
Kubernetes only grants to UID 0 anyway (no ambient capabilities).
`privileged: true` (values.yaml says what it enables and costs) replaces the
dropped capabilities and the no-escalation flag, which the API server refuses
next to privileged.
*/}}
{{- define "dra-driver-lib.podSecurityContext" -}}
{{- $defaults := dict "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $defaults (deepCopy (.Values.podSecurityContext | default dict))) -}}
{{- end -}}

{{- define "dra-driver-lib.securityContext" -}}
{{- $defaults := dict "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false "readOnlyRootFilesystem" true "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- if .Values.privileged -}}
{{- $_ := set $defaults "privileged" true -}}
{{- else -}}
{{- $_ := set $defaults "privileged" false -}}
{{- $_ := set $defaults "allowPrivilegeEscalation" false -}}
{{- $_ := set $defaults "capabilities" (dict "drop" (list "ALL")) -}}
{{- end -}}
{{- toYaml (mergeOverwrite $defaults (deepCopy (.Values.securityContext | default dict))) -}}
{{- end -}}
