{{/* Names. Slurm host names derive from these, so keep them short. */}}
{{- define "slurm.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- define "slurm.clusterName" -}}
{{- .Values.clusterName | default .Release.Name | replace "-" "_" | trunc 40 -}}
{{- end -}}
{{- define "slurm.ctld" -}}{{ include "slurm.fullname" . }}-slurmctld{{- end -}}
{{- define "slurm.dbd" -}}{{ include "slurm.fullname" . }}-slurmdbd{{- end -}}
{{- define "slurm.mariadb" -}}{{ include "slurm.fullname" . }}-mariadb{{- end -}}
{{- define "slurm.mungeSecret" -}}{{ .Values.munge.existingSecret | default (printf "%s-munge" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.jwtSecret" -}}{{ .Values.jwt.existingSecret | default (printf "%s-jwt" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.dbSecret" -}}{{ .Values.accounting.database.existingSecret | default (printf "%s-db" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.hostKeysSecret" -}}{{ .Values.login.existingHostKeysSecret | default (printf "%s-ssh-host-keys" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.dbHost" -}}{{ .Values.accounting.database.external.host | default (include "slurm.mariadb" .) }}{{- end -}}

{{- define "slurm.labels" -}}
app.kubernetes.io/name: slurm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "slurm.selector" -}}
app.kubernetes.io/name: slurm
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "slurm.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The controller host names, in SlurmctldHost order. */}}
{{- define "slurm.ctldHosts" -}}
{{- $n := ternary 2 1 .Values.controller.backup -}}
{{- $hosts := list -}}
{{- range $i := until (int $n) -}}
{{- $hosts = append $hosts (printf "%s-%d" (include "slurm.ctld" $) $i) -}}
{{- end -}}
{{- join " " $hosts -}}
{{- end -}}
{{/* slurmd's --conf-server list: every controller, primary first. */}}
{{- define "slurm.confServer" -}}
{{- $out := list -}}
{{- range (splitList " " (include "slurm.ctldHosts" .)) -}}
{{- $out = append $out (printf "%s.%s:%d" . (include "slurm.ctld" $) (int $.Values.controller.port)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* Scheduling knobs every component shares: pass (dict "c" .Values.X). */}}
{{- define "slurm.placement" -}}
{{- with .c.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* Slurm's own pods are not the "stray" pods the syncer's node lock
  (a NoExecute taint while a job runs) must evict from a node. */}}
tolerations:
  - {key: sunk.dev/slurm-job, operator: Exists}
  {{- with .c.tolerations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .c.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/*
munge in every pod that talks to Slurm: an init container installs the key
with the owner and mode munged insists on (and runs `extra`, a shell line,
for the pod's own preparation), then munged runs as a native sidecar sharing
its socket through an emptyDir. Pass (dict "root" $ "extra" "..." "mounts" list "env" list).
*/}}
{{- define "slurm.mungeInit" -}}
- name: prepare
  image: {{ include "slurm.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command:
    - sh
    - -ec
    - |
      install -d -o munge -g munge -m 0700 /etc/munge
      install -o munge -g munge -m 0400 /secrets/munge/munge.key /etc/munge/munge.key
      install -d -o munge -g munge -m 0755 /run/munge
      cat /etc/passwd /identity/passwd > /etc-identity/passwd
      cat /etc/group /identity/group > /etc-identity/group
      {{- with .extra }}
      {{- . | nindent 6 }}
      {{- end }}
  securityContext:
    runAsUser: 0
  {{- with .env }}
  env: {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: munge-secret, mountPath: /secrets/munge}
    - {name: munge-etc, mountPath: /etc/munge}
    - {name: munge-run, mountPath: /run/munge}
    - {name: identity, mountPath: /identity}
    - {name: etc-identity, mountPath: /etc-identity}
    {{- with .mounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
- name: munged
  image: {{ include "slurm.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  restartPolicy: Always
  command: [munged, -F]
  securityContext:
    runAsUser: {{ .root.Values.ids.munge }}
    runAsGroup: {{ .root.Values.ids.munge }}
  startupProbe:
    exec:
      command: [test, -S, /run/munge/munge.socket.2]
    periodSeconds: 1
    failureThreshold: 60
  volumeMounts:
    - {name: munge-etc, mountPath: /etc/munge}
    - {name: munge-run, mountPath: /run/munge}
{{- end -}}

{{- define "slurm.mungeVolumes" -}}
- name: munge-secret
  secret:
    secretName: {{ include "slurm.mungeSecret" . }}
    defaultMode: 0400
- {name: munge-etc, emptyDir: {}}
- {name: munge-run, emptyDir: {}}
- name: identity
  configMap:
    name: {{ include "slurm.fullname" . }}-identity
- {name: etc-identity, emptyDir: {}}
{{- end -}}

{{/* /etc/passwd and /etc/group with the identity provider's users. */}}
{{- define "slurm.identityMounts" -}}
- {name: etc-identity, mountPath: /etc/passwd, subPath: passwd, readOnly: true}
- {name: etc-identity, mountPath: /etc/group, subPath: group, readOnly: true}
{{- end -}}

{{/* The key Secrets the keys hook makes (those not given): "name kind" lines. */}}
{{- define "slurm.generatedKeys" -}}
{{- if not .Values.munge.existingSecret }}
{{ include "slurm.mungeSecret" . }} munge
{{- end }}
{{- if not .Values.jwt.existingSecret }}
{{ include "slurm.jwtSecret" . }} jwt
{{- end }}
{{- if and .Values.accounting.enabled (not .Values.accounting.database.existingSecret) }}
{{ include "slurm.dbSecret" . }} db
{{- end }}
{{- if and .Values.login.enabled (not .Values.login.existingHostKeysSecret) }}
{{ include "slurm.hostKeysSecret" . }} ssh-host
{{- end }}
{{- if and (include "slurm.computeSsh" .) (not .Values.slurmd.ssh.existingHostKeysSecret) }}
{{ include "slurm.computeHostKeysSecret" . }} ssh-host
{{- end }}
{{- end -}}

{{/* Whether the compute pods mount the job-scripts ConfigMap (prolog, epilog, health checks). */}}
{{- define "slurm.jobscripts" -}}
{{- if or .Values.prolog .Values.epilog .Values.healthCheck.scripts }}true{{- end -}}
{{- end -}}

{{/* The login pods' sshd_config (its checksum rolls them on a change). */}}
{{- define "slurm.sshdConfig" -}}
Port 22
HostKey /etc/ssh/host-keys/ssh_host_ed25519_key
HostKey /etc/ssh/host-keys/ssh_host_ecdsa_key
HostKey /etc/ssh/host-keys/ssh_host_rsa_key
# Keys only, from the authorized-keys Secret (one file per user). Read
# through a command: a kubelet mounts Secrets on a world-writable (1777)
# directory, which sshd's StrictModes refuses for AuthorizedKeysFile; a
# Secret's update reaches the next login without a restart.
AuthorizedKeysFile none
AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u
AuthorizedKeysCommandUser nobody
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
{{- end }}

{{/* NetworkPolicy peers: the release's pods of each component in .components. */}}
{{- define "slurm.peers" -}}
{{- range .components }}
- podSelector:
    matchLabels: {{- include "slurm.selector" (dict "root" $.root "component" .) | nindent 6 }}
{{- end }}
{{- end -}}
