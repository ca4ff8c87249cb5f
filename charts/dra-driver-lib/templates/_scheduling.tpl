{{/*
The pod's affinity: the `affinity` value, with the chart's node requirements
added to it.

The node requirements (`nodeAffinity` in values): the instance types that
have the driver's devices, and no node of an EKS compute type the driver
cannot serve (label eks.amazonaws.com/compute-type; docs/install.md says why
for each). They are ANDed into EVERY required node selector term of the
`affinity` value, because Kubernetes ORs the terms: a user term left without
them would let the DaemonSet onto any node that term matches. The rest of
`affinity` (preferred node terms, pod (anti-)affinity) passes through as
given. Renders nothing when there is nothing to say.
*/}}
{{- define "dra-driver-lib.affinity" -}}
{{- $require := list -}}
{{- with .Values.nodeAffinity.instanceTypes -}}
{{- $require = append $require (dict "key" "node.kubernetes.io/instance-type" "operator" "In" "values" .) -}}
{{- end -}}
{{- with .Values.nodeAffinity.excludeComputeTypes -}}
{{- $require = append $require (dict "key" "eks.amazonaws.com/compute-type" "operator" "NotIn" "values" .) -}}
{{- end -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- if $require -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := get $required "nodeSelectorTerms" | default (list dict) -}}
{{- $merged := list -}}
{{- range $terms -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (concat (get $term "matchExpressions" | default list) $require) -}}
{{- $merged = append $merged $term -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $merged -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}
{{- toYaml $affinity -}}
{{- end -}}
{{- end -}}
