{{/*
Metrics: a headless Service over the driver pods (Prometheus scrapes every
pod, there is nothing to load-balance), and optionally a ServiceMonitor for
the Prometheus Operator.
*/}}
{{- define "dra-driver-lib.service" -}}
{{- if .Values.metrics.service.enabled -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ printf "%s-metrics" (include "dra-driver-lib.fullname" .) | trunc 63 | trimSuffix "-" }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- include "dra-driver-lib.selectorLabels" . | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .Values.metrics.port }}
      targetPort: metrics
      protocol: TCP
{{- end -}}
{{- end -}}

{{- define "dra-driver-lib.servicemonitor" -}}
{{- if .Values.metrics.serviceMonitor.enabled -}}
{{- if not .Values.metrics.service.enabled -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled" -}}
{{- end -}}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
    {{- with .Values.metrics.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "dra-driver-lib.selectorLabels" . | nindent 6 }}
  namespaceSelector:
    matchNames: [{{ .Release.Namespace | quote }}]
  endpoints:
    - port: metrics
      path: /metrics
      interval: {{ .Values.metrics.serviceMonitor.interval }}
{{- end -}}
{{- end -}}
