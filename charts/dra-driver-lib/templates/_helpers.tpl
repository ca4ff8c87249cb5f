{{/*
Names, labels and small lookups used by every template of a driver chart.
Chart-specific constants (binary name, which part of /dev the driver reads)
come from "<chart name>.binary" and "<chart name>.devSubPath", defined in the
driver chart's own templates/_driver.tpl; scoping them by chart name keeps two
driver charts from overriding each other if they are ever rendered together.
*/}}

{{- define "dra-driver-lib.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-driver-lib.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver-lib.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver-lib.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-driver-lib.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-driver-lib.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aws-dra-drivers
{{- end -}}

{{- define "dra-driver-lib.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dra-driver-lib.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver-lib.binary" -}}
{{- include (printf "%s.binary" .Chart.Name) . -}}
{{- end -}}

{{/* The driver's own flags of `run` (one "- --flag=value" line each), from its chart's values. */}}
{{- define "dra-driver-lib.driverArgs" -}}
{{- include (printf "%s.driverArgs" .Chart.Name) . -}}
{{- end -}}

{{- define "dra-driver-lib.devSubPath" -}}
{{- include (printf "%s.devSubPath" .Chart.Name) . -}}
{{- end -}}

{{/* Kubelet directories: explicit values win, else derived from kubelet's --root-dir. */}}
{{- define "dra-driver-lib.registrarDir" -}}
{{- default (printf "%s/plugins_registry" (trimSuffix "/" .Values.hostPaths.kubeletRoot)) .Values.hostPaths.kubeletRegistrarDir -}}
{{- end -}}

{{- define "dra-driver-lib.pluginsDir" -}}
{{- default (printf "%s/plugins" (trimSuffix "/" .Values.hostPaths.kubeletRoot)) .Values.hostPaths.kubeletPluginsDir -}}
{{- end -}}

{{/* The part of /dev that is mounted: all of it, or one subdirectory. */}}
{{- define "dra-driver-lib.devMountPath" -}}
{{- $root := trimSuffix "/" .Values.hostPaths.devRoot -}}
{{- $sub := include "dra-driver-lib.devSubPath" . -}}
{{- if $sub -}}{{ printf "%s/%s" $root $sub }}{{- else -}}{{ default "/" $root }}{{- end -}}
{{- end -}}

{{/*
The image reference. With image.digest it is `repository@digest`: the node
pulls exactly the bytes that were tested, whatever the tag later points at
(the tag is then left out, as the runtime would ignore it).
*/}}
{{- define "dra-driver-lib.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
