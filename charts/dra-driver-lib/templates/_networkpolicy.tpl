{{/*
A NetworkPolicy that admits to the driver pods only the metrics scrape: TCP
on the metrics port, from anywhere unless `networkPolicy.metricsFrom` names
the scrapers (NetworkPolicyPeer objects). The driver serves nothing else on
the network (kubelet reaches it over unix sockets), so this closes what a
future listener could open by mistake. Egress is left alone: the driver must
reach the API server, whose address a policy cannot name portably.
Kubelet's own probes come from the node, which the common CNIs always admit.
It does nothing with hostNetwork (policies do not apply to host-network
pods) or where the CNI does not enforce policies.
*/}}
{{- define "dra-driver-lib.networkpolicy" -}}
{{- if .Values.networkPolicy.enabled -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "dra-driver-lib.selectorLabels" . | nindent 6 }}
  policyTypes:
    - Ingress
  ingress:
    - ports:
        - port: metrics
          protocol: TCP
      {{- with .Values.networkPolicy.metricsFrom }}
      from:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
{{- end -}}
