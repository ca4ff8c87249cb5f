{{/* Constants of this chart, read by the dra-driver-lib templates. */}}
{{- define "neuron-dra-driver.binary" -}}neuron-driver{{- end -}}
{{/* Chip nodes are /dev/neuronN directly in /dev: the whole directory is mounted (read-only). */}}
{{- define "neuron-dra-driver.devSubPath" -}}{{- end -}}
{{/* Verbs of the ClusterRole on nodes (see dra-driver-lib.rbac). */}}
{{- define "neuron-dra-driver.nodeVerbs" -}}"get", "patch"{{- end -}}
{{/* The only Node labels the driver may change (dra-driver-lib.nodelabelspolicy). */}}
{{- define "neuron-dra-driver.nodeLabelPrefix" -}}neuron.amazonaws.com/ultraserver-{{- end -}}
{{/* --partitions (values.yaml `partitions`). */}}
{{- define "neuron-dra-driver.driverArgs" -}}- --partitions={{ .Values.partitions }}{{- end -}}
