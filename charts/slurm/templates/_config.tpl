{{/* The files of /etc/slurm, shared by the ConfigMap and the validation hook. */}}
{{- define "slurm.configFiles" -}}
slurm.conf: |
  {{- include "slurm.conf" . | nindent 2 }}
cgroup.conf: |
  {{- .Values.cgroupConfig | nindent 2 }}
{{- with .Values.gresConfig }}
gres.conf: |
  {{- . | nindent 2 }}
{{- end }}
{{- with .Values.topologyConfig }}
topology.conf: |
  {{- . | nindent 2 }}
{{- end }}
{{- with .Values.jobSubmitLua }}
job_submit.lua: |
  {{- . | nindent 2 }}
{{- end }}
{{- if .Values.containers.enabled }}
{{- /* srun and sbatch read it on the login pods; configless slurmd fetch it too. */}}
plugstack.conf: |
  required /usr/lib/sunk/spank_containers.so cache=/var/lib/sunk-containers mount_home={{ ternary "yes" "no" .Values.containers.mountHome }}
{{- with .Values.containers.registriesConf }}
containers-registries.conf: |
  {{- . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "slurm.conf" -}}
{{- $ctld := include "slurm.ctld" . -}}
# Rendered by the slurm chart ({{ .Release.Name }}); edit values, not this file.
ClusterName={{ include "slurm.clusterName" . }}
{{- range (splitList " " (include "slurm.ctldHosts" .)) }}
SlurmctldHost={{ . }}({{ . }}.{{ $ctld }})
{{- end }}
SlurmctldPort={{ .Values.controller.port }}
SlurmdPort=6818
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
{{ include "slurm.authAltParameters" . }}
SlurmctldParameters=enable_configless
{{- if .Values.metrics.enabled }}
MetricsType=metrics/openmetrics
{{- end }}
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
{{- if .Values.accounting.enabled }}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={{ include "slurm.dbd" . }}
AccountingStoragePort={{ .Values.accounting.port }}
{{- end }}
{{- with .Values.topologyConfig }}
TopologyPlugin=topology/tree
{{- end }}
{{- if and (ne .Values.topology.plugin "none") (eq .Values.topology.file "topology.conf") }}
{{- /* topology.yaml names its plugin itself (and overrides this line) */}}
TopologyPlugin=topology/{{ .Values.topology.plugin }}
{{- end }}
{{- with .Values.jobSubmitLua }}
JobSubmitPlugins=lua
{{- end }}
{{- with .Values.prolog }}
Prolog=/etc/slurm-jobscripts/prolog
{{- end }}
{{- with .Values.epilog }}
Epilog=/etc/slurm-jobscripts/epilog
{{- end }}
{{- with .Values.healthCheck.scripts }}
HealthCheckProgram=/etc/slurm-jobscripts/healthcheck
HealthCheckInterval={{ $.Values.healthCheck.interval }}
HealthCheckNodeState={{ $.Values.healthCheck.nodeState }}
{{- end }}
{{- range $key, $value := .Values.slurmConfig }}
{{ $key }}={{ $value }}
{{- end }}
{{- range .Values.nodesets }}
NodeSet={{ .name }} Feature={{ .name }}
{{- end }}
{{- range .Values.partitions }}
PartitionName={{ .name }} Nodes={{ join "," .nodesets }}{{ if .default }} Default=YES{{ end }}
{{- range $key, $value := .config }} {{ $key }}={{ $value }}{{ end }}
{{- end }}
{{- with .Values.slurmConfigExtra }}
{{ . }}
{{- end }}
{{- end -}}
