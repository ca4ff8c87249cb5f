{{/*
DeviceClasses: the default one (named after the driver, selecting all of its
devices) and any extra ones from values. An extra class can be written
without CEL: each entry of `attributes` becomes a guarded equality test
(`has(...) && ... == value`; the guard matters because a selector that reads
a missing attribute is an evaluation error, which fails the allocation
rather than skipping the device). A name without a domain is in the driver's
domain, as in the ResourceSlice. `selectors` adds raw CEL, `config` adds
opaque parameters for this driver that every request of the class gets.
*/}}
{{- define "dra-driver-lib.celAttribute" -}}
{{- $domain := .driver -}}
{{- $attr := .key -}}
{{- if contains "/" .key -}}
{{- $parts := splitn "/" 2 .key -}}
{{- $domain = $parts._0 -}}
{{- $attr = $parts._1 -}}
{{- end -}}
{{- $ref := printf "device.attributes[%s].%s" ($domain | toJson) $attr -}}
{{- $lit := "" -}}
{{- if kindIs "string" .value -}}
{{- $lit = toJson .value -}}
{{- else if kindIs "bool" .value -}}
{{- $lit = ternary "true" "false" .value -}}
{{- else if or (kindIs "float64" .value) (kindIs "int" .value) (kindIs "int64" .value) -}}
{{- $lit = printf "%d" (int64 .value) -}}
{{- else -}}
{{- fail (printf "deviceClasses.extra: attribute %s must be a string, an integer or a boolean, not %s" .key (kindOf .value)) -}}
{{- end -}}
{{- printf "has(%s) && %s == %s" $ref $ref $lit -}}
{{- end -}}

{{- define "dra-driver-lib.deviceClass" -}}
{{- $top := .top -}}
{{- $driver := $top.Values.driver.name -}}
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {{ .class.name }}
  labels:
    {{- include "dra-driver-lib.labels" $top | nindent 4 }}
spec:
  selectors:
    - cel:
        expression: {{ printf "device.driver == %s" ($driver | toJson) | quote }}
    {{- range $key, $value := .class.attributes }}
    - cel:
        expression: {{ include "dra-driver-lib.celAttribute" (dict "driver" $driver "key" $key "value" $value) | quote }}
    {{- end }}
    {{- range .class.selectors }}
    - cel:
        expression: {{ . | quote }}
    {{- end }}
  {{- with .class.extendedResourceName }}
  extendedResourceName: {{ . }}
  {{- end }}
  {{- with .class.config }}
  config:
    {{- range . }}
    - opaque:
        driver: {{ $driver }}
        parameters:
          {{- toYaml . | nindent 10 }}
    {{- end }}
  {{- end }}
{{- end -}}

{{- define "dra-driver-lib.deviceclasses" -}}
{{- $top := . -}}
{{- $docs := list -}}
{{- if .Values.deviceClasses.default.enabled -}}
{{- $class := dict "name" (default .Values.driver.name .Values.deviceClasses.default.name) "attributes" (.Values.deviceClasses.default.attributes | default dict) "selectors" (.Values.deviceClasses.default.selectors | default list) -}}
{{- $docs = append $docs (include "dra-driver-lib.deviceClass" (dict "top" $top "class" $class)) -}}
{{- end -}}
{{- range .Values.deviceClasses.extra -}}
{{- $docs = append $docs (include "dra-driver-lib.deviceClass" (dict "top" $top "class" .)) -}}
{{- end -}}
{{- join "\n---\n" $docs -}}
{{- end -}}

{{/*
Whether a class with spec.extendedResourceName is rendered: `enabled` is
true, false or "auto"; auto is on where the cluster Helm renders for
(.Capabilities.KubeVersion: the API server on install, --kube-version with
helm template) is 1.36 or newer, where DRAExtendedResource is served.
Older API servers drop the field, leaving a class no pod reaches by a
resource name.
*/}}
{{- define "dra-driver-lib.extendedResourceEnabled" -}}
{{- $enabled := .spec.enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- $enabled = semverCompare ">=1.36.0-0" .top.Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- ternary "true" "" (eq (toString $enabled) "true") -}}
{{- end -}}

{{/*
A DeviceClass that serves a classic device plugin's extended resource
(`resource`, e.g. vpc.amazonaws.com/efa) from this driver's devices that
match `attributes`. Renders nothing when disabled; a leading "---"
otherwise, so calls can follow each other.
*/}}
{{- define "dra-driver-lib.extendedResourceClass" -}}
{{- if include "dra-driver-lib.extendedResourceEnabled" . }}
---
{{ include "dra-driver-lib.deviceClass" (dict "top" .top "class" (dict "name" .spec.name "attributes" .attributes "extendedResourceName" .resource)) }}
{{- end -}}
{{- end -}}
