{{/*
The node plugin DaemonSet. One pod per accelerator node runs `<binary> run`.

Host directories are mounted at the SAME path inside the container as on the
host: kubelet dials the sockets by the host path the plugin advertises, and
the CDI specs the driver writes name host paths of device nodes, which the
container runtime resolves on the host.
*/}}
{{- define "dra-driver-lib.daemonset" -}}
{{- $registrar := include "dra-driver-lib.registrarDir" . -}}
{{- $plugins := include "dra-driver-lib.pluginsDir" . -}}
{{- $devMount := include "dra-driver-lib.devMountPath" . -}}
{{- $attributes := .Values.hostPaths.deviceAttributesRoot | default (printf "%s/dra-device-attributes" (dir .Values.hostPaths.cdiRoot)) -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "dra-driver-lib.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "dra-driver-lib.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "dra-driver-lib.selectorLabels" . | nindent 6 }}
  # Seamless upgrade (kubelet 1.33+): the new pod starts next to the old one
  # on each node, each with its own socket names derived from POD_UID, and
  # the old one goes away only once the new one is ready (readinessProbe
  # below: kubelet registered it and its slices are published). A node never
  # has zero plugins, so pods that need a prepare during the upgrade keep
  # working.
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "dra-driver-lib.selectorLabels" . | nindent 8 }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "dra-driver-lib.serviceAccountName" . }}
      # The token is needed (the driver reads claims and writes its slices),
      # but it is mounted explicitly below ("api-access", the same projected
      # files the ServiceAccount admission would add) into the one container
      # that uses it, rather than automatically into every container.
      automountServiceAccountToken: false
      {{- with .Values.priorityClassName }}
      # Losing the plugin means the node's devices cannot be prepared or
      # released: it must not be evicted before the workloads it serves.
      priorityClassName: {{ . }}
      {{- end }}
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "dra-driver-lib.podSecurityContext" . | nindent 8 }}
      {{- if .Values.hostNetwork }}
      # hostNetwork was asked for in values (see its comment in values.yaml);
      # keep cluster DNS for the pod anyway.
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "dra-driver-lib.affinity" . }}
      affinity:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: driver
          image: {{ include "dra-driver-lib.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: [{{ printf "/usr/local/bin/%s" (include "dra-driver-lib.binary" .) | quote }}]
          args:
            - run
            - --driver-name={{ .Values.driver.name }}
            - --sysfs-root={{ .Values.hostPaths.sysfsRoot }}
            - --dev-root={{ .Values.hostPaths.devRoot }}
            - --log-format={{ .Values.logFormat }}
            {{- if .Values.allowDevicePluginCoexistence }}
            - --allow-device-plugin-coexistence
            {{- end }}
            {{- with include "dra-driver-lib.driverArgs" . }}
            {{- . | nindent 12 }}
            {{- end }}
          env:
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            # Distinct socket names per pod: what lets two plugin pods run
            # side by side during a rolling update.
            - name: POD_UID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.uid
            - name: KUBELET_REGISTRAR_DIRECTORY_PATH
              value: {{ $registrar | quote }}
            - name: KUBELET_PLUGINS_DIRECTORY_PATH
              value: {{ $plugins | quote }}
            - name: CDI_ROOT
              value: {{ .Values.hostPaths.cdiRoot | quote }}
            # Device attributes files: written here, mounted read-only into
            # the containers of each claim through its CDI spec.
            - name: DEVICE_ATTRIBUTES_FILES
              value: {{ .Values.deviceAttributesFiles | quote }}
            - name: DEVICE_ATTRIBUTES_ROOT
              value: {{ $attributes | quote }}
            - name: METRICS_ADDRESS
              value: {{ printf "0.0.0.0:%d" (int .Values.metrics.port) | quote }}
            - name: LOG_LEVEL
              value: {{ .Values.logLevel | quote }}
            {{- with .Values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ .Values.metrics.port }}
              protocol: TCP
          # /healthz answers only after the driver has called its own
          # registration and DRA sockets, the ones kubelet uses.
          livenessProbe:
            httpGet:
              path: /healthz
              port: metrics
            {{- toYaml .Values.livenessProbe | nindent 12 }}
          # /readyz answers 200 only once kubelet has registered the plugin
          # and the node's slices are published (and the /healthz check
          # passes): what the rolling update above waits for.
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            {{- toYaml .Values.readinessProbe | nindent 12 }}
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          # UID 0 with every capability dropped, merged with the
          # `securityContext` value: why, in _security.tpl.
          securityContext:
            {{- include "dra-driver-lib.securityContext" . | nindent 12 }}
          {{- if eq $devMount .Values.hostPaths.devRoot }}
          # The whole device directory is mounted read-only, so the default
          # /dev/termination-log cannot be created there: keep it in the
          # (writable until start-up) container root instead.
          terminationMessagePath: /tmp/termination-log
          {{- end }}
          volumeMounts:
            - name: plugins-registry
              mountPath: {{ $registrar | quote }}
            - name: plugin-dir
              mountPath: {{ printf "%s/%s" $plugins .Values.driver.name | quote }}
            - name: cdi
              mountPath: {{ .Values.hostPaths.cdiRoot | quote }}
            - name: device-attributes
              mountPath: {{ $attributes | quote }}
            - name: sys
              mountPath: {{ .Values.hostPaths.sysfsRoot | quote }}
              readOnly: true
            - name: dev
              mountPath: {{ $devMount | quote }}
              readOnly: true
            - name: api-access
              mountPath: /var/run/secrets/kubernetes.io/serviceaccount
              readOnly: true
      volumes:
        - name: plugins-registry
          hostPath:
            path: {{ $registrar | quote }}
            type: DirectoryOrCreate
        # Only this driver's own directory under the plugins dir: its socket,
        # checkpoint and lock file live there, nothing else is needed.
        - name: plugin-dir
          hostPath:
            path: {{ printf "%s/%s" $plugins .Values.driver.name | quote }}
            type: DirectoryOrCreate
        - name: cdi
          hostPath:
            path: {{ .Values.hostPaths.cdiRoot | quote }}
            type: DirectoryOrCreate
        - name: device-attributes
          hostPath:
            path: {{ $attributes | quote }}
            type: DirectoryOrCreate
        - name: sys
          hostPath:
            path: {{ .Values.hostPaths.sysfsRoot | quote }}
            type: Directory
        - name: dev
          hostPath:
            path: {{ $devMount | quote }}
            type: DirectoryOrCreate
        # What the ServiceAccount admission plugin would mount: a bound token
        # (kubelet rotates it; the client re-reads the file), the cluster CA
        # and the namespace.
        - name: api-access
          projected:
            sources:
              - serviceAccountToken:
                  path: token
                  expirationSeconds: 3607
              - configMap:
                  name: kube-root-ca.crt
                  items:
                    - key: ca.crt
                      path: ca.crt
              - downwardAPI:
                  items:
                    - path: namespace
                      fieldRef:
                        apiVersion: v1
                        fieldPath: metadata.namespace
{{- end -}}
