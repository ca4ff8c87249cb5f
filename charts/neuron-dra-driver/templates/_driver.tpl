{{/* Constants of this chart, read by the dra-driver-lib templates. */}}
{{- define "neuron-dra-driver.binary" -}}neuron-driver{{- end -}}
{{/* Chip nodes are /dev/neuronN directly in /dev: the whole directory is mounted (read-only). */}}
{{- define "neuron-dra-driver.devSubPath" -}}{{- end -}}
