{{- define "sunk.labels" -}}
app.kubernetes.io/name: sunk
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "sunk.selector" -}}
app.kubernetes.io/name: sunk
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
One leader-elected sunk component: (dict "root" $ "component" "operator"
"c" .Values.operator "args" list). Runs as a non-root user with a read-only
root filesystem and no capabilities; talks to Slurm with the token that
`sunk tokens` keeps in its own Secret (it holds no key).
*/}}
{{- define "sunk.component" -}}
{{- $name := printf "%s-%s" .root.Release.Name .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
spec:
  replicas: {{ .c.replicas }}
  selector:
    matchLabels: {{- include "sunk.selector" . | nindent 6 }}
  template:
    metadata:
      labels: {{- include "sunk.selector" . | nindent 8 }}
    spec:
      serviceAccountName: {{ $name }}
      {{- with .root.Values.imagePullSecrets }}
      imagePullSecrets: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .c.nodeSelector }}
      nodeSelector: {{- toYaml . | nindent 8 }}
      {{- end }}
      # sunk's own node lock (NoExecute while a Slurm job runs) must not evict sunk.
      tolerations:
        - {key: sunk.dev/slurm-job, operator: Exists}
        {{- with .c.tolerations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- include "sunk.affinity" . | nindent 6 }}
      {{- with .c.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        # Secret files are group-readable (0440): a kubelet gives them this
        # group, or they are root's alone and unreadable here.
        fsGroup: 65532
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: {{ .component }}
          image: {{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}
          imagePullPolicy: {{ .root.Values.image.pullPolicy }}
          command:
            - sunk
            - {{ .component }}
            - --slurmrestd={{ .root.Values.slurm.restapiUrl }}
            - --jwt-token=/var/run/sunk/token/token
            {{- $slurmNamespace := .root.Values.slurm.namespace | default .root.Release.Namespace }}
            {{- if ne $slurmNamespace "*" }}
            {{- /* the scheduler's --namespace limits the pods it places; the Slurm one is where slurmd pods live */}}
            - {{ ternary "--slurmd-namespace" "--namespace" (eq $.component "scheduler") }}={{ $slurmNamespace }}
            {{- end }}
            {{- if .c.verbose }}
            - --verbose
            {{- end }}
            {{- range .args }}
            - {{ . }}
            {{- end }}
          env:
            # Where the leader Lease lives.
            - name: POD_NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          {{- with .c.resources }}
          resources: {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with .c.metricsPort }}
          {{- include "sunk.metricsProbes" . | nindent 10 }}
          {{- end }}
          volumeMounts:
            - {name: token, mountPath: /var/run/sunk/token, readOnly: true}
            {{- if .tenantTokens }}
            - {name: tenant-tokens, mountPath: /var/run/sunk/tenant-tokens, readOnly: true}
            {{- end }}
      volumes:
        - name: token
          secret:
            secretName: {{ $name }}-token
            defaultMode: 0440
        {{- if .tenantTokens }}
        - name: tenant-tokens
          secret:
            secretName: {{ $name }}-tenant-tokens
            defaultMode: 0440
        {{- end }}
{{- include "sunk.disruptionBudget" . }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
---
# The leader Lease, in the release namespace only.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}-leader
  labels: {{- include "sunk.labels" .root | nindent 4 }}
rules:
  # Its own Lease by name; create cannot be limited to a name.
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [{{ .lease }}]
    verbs: [get, update]
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}-leader
  labels: {{- include "sunk.labels" .root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ $name }}-leader}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ .root.Release.Namespace }}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ $name }}}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ .root.Release.Namespace }}}
{{- end -}}


{{/* Rules on the Slurm namespace's objects (NodeSets, slurmd pods): a Role
there, or a ClusterRole when slurm.namespace is "*", bound to the component's
ServiceAccount. Takes root, component and rules (YAML). */}}
{{- define "sunk.slurmScoped" -}}
{{- $name := printf "%s-%s-slurm" .root.Release.Name .component -}}
{{- $namespace := .root.Values.slurm.namespace | default .root.Release.Namespace -}}
{{- $cluster := eq $namespace "*" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ ternary "ClusterRole" "Role" $cluster }}
metadata:
  name: {{ $name }}
  {{- if not $cluster }}
  namespace: {{ $namespace }}
  {{- end }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
rules: {{- .rules | trim | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ ternary "ClusterRoleBinding" "RoleBinding" $cluster }}
metadata:
  name: {{ $name }}
  {{- if not $cluster }}
  namespace: {{ $namespace }}
  {{- end }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: {{ ternary "ClusterRole" "Role" $cluster }}, name: {{ $name }}}
subjects:
  - {kind: ServiceAccount, name: {{ .root.Release.Name }}-{{ .component }}, namespace: {{ .root.Release.Namespace }}}
{{- end -}}

{{- /* The Service Prometheus finds a component's /metrics on, when it has a
  port: <release>-<component>-metrics. The release's ServiceMonitor selects it
  where the Prometheus Operator's CRDs exist; elsewhere the prometheus.io
  annotations name the port and path. */ -}}
{{- define "sunk.metricsService" }}
{{- if .c.metricsPort }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ .root.Release.Name }}-{{ .component }}-metrics
  labels:
    {{- include "sunk.labels" .root | nindent 4 }}
    sunk.dev/metrics: "true"
  {{- if not (.root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}
  annotations:
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .c.metricsPort | quote }}
    prometheus.io/path: /metrics
  {{- end }}
spec:
  selector: {{- include "sunk.selector" (dict "root" .root "component" .component) | nindent 4 }}
  ports:
    - {name: metrics, port: {{ .c.metricsPort }}}
{{- end }}
{{- end }}

{{- /* A component's affinity: its values', else its replicas on different
  nodes where there are enough (one node lost takes one replica, and another
  holds or takes the Lease). Pass (dict "root" $ "component" NAME "c" VALUES). */ -}}
{{- define "sunk.affinity" -}}
{{- if .c.affinity -}}
affinity: {{- toYaml .c.affinity | nindent 2 }}
{{- else -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels: {{- include "sunk.selector" . | nindent 14 }}
{{- end -}}
{{- end -}}

{{- /* With two replicas or more, a voluntary disruption (a node drain, a
  cluster upgrade) takes one at a time: another holds or takes the Lease.
  Pass (dict "root" $ "component" NAME "c" VALUES). */ -}}
{{- define "sunk.disruptionBudget" -}}
{{- if gt (int .c.replicas) 1 }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .root.Release.Name }}-{{ .component }}
  labels: {{- include "sunk.labels" .root | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {{- include "sunk.selector" . | nindent 6 }}
{{- end }}
{{- end -}}

{{- /* sunk's node lock: the syncer's NoExecute taint on a node while a Slurm
  job runs there (sunk.api.TAINT_NODE_LOCK). */ -}}
{{- define "sunk.nodeLockTaint" -}}sunk.dev/slurm-job{{- end -}}

{{- /* The namespaces the scheduler places pods of: its tenants' and
  scheduler.podNamespace, as a JSON list. */ -}}
{{- define "sunk.servedNamespaces" -}}
{{- $served := list -}}
{{- range .Values.scheduler.tenants }}{{ range .namespaces }}{{ $served = append $served . }}{{ end }}{{ end -}}
{{- with .Values.scheduler.podNamespace }}{{ $served = append $served . }}{{ end -}}
{{- $served | uniq | sortAlpha | toJson -}}
{{- end -}}

{{- /* A container's /metrics port and its probes: /metrics answers from
  start to exit (on a leader and its standby alike): ready once it listens,
  restarted when it stops answering. Pass the port. */ -}}
{{- define "sunk.metricsProbes" -}}
ports:
  - {name: metrics, containerPort: {{ . }}}
readinessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 10
livenessProbe:
  httpGet: {path: /metrics, port: metrics}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{- /* "true" where `sunk tokens` runs: wherever a component it mints for does. */ -}}
{{- define "sunk.tokensEnabled" -}}
{{- if or .Values.operator.enabled .Values.syncer.enabled .Values.scheduler.enabled }}true{{ end -}}
{{- end -}}
