{{/* Constants of this chart, read by the dra-driver-lib templates. */}}
{{- define "efa-dra-driver.binary" -}}efa-driver{{- end -}}
{{/* The EFA driver only looks at /dev/infiniband (uverbsN, rdma_cm). */}}
{{- define "efa-dra-driver.devSubPath" -}}infiniband{{- end -}}
{{/* Verbs of the ClusterRole on nodes (see dra-driver-lib.rbac). */}}
{{- define "efa-dra-driver.nodeVerbs" -}}"get"{{- end -}}
{{/* --sharing (values.yaml `sharing`). */}}
{{- define "efa-dra-driver.driverArgs" -}}- --sharing={{ .Values.sharing }}{{- end -}}
