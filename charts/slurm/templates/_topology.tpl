{{/* The volume of /etc/slurm: the chart's files, the topology file sunk's
  operator keeps in <release>-topology and, unless gresConfig is given, the
  gres.conf it keeps in <release>-gres (each optional: absent until the
  operator writes it), one directory updated in place. slurmctld reads the topology
  and its reconfigure sidecar applies a change; the login pods' scontrol
  needs it too (`scontrol show topology` reads the file for its plugin).
  slurmd pods fetch it from slurmctld (configless). */}}
{{- define "slurm.configVolume" -}}
- name: config
  projected:
    sources:
      - configMap:
          name: {{ include "slurm.fullname" . }}-config
      - configMap:
          name: {{ include "slurm.fullname" . }}-topology
          optional: true
          items:
            - {key: {{ .Values.topology.file }}, path: {{ .Values.topology.file }}}
      {{- if not .Values.gresConfig }}
      - configMap:
          name: {{ include "slurm.fullname" . }}-gres
          optional: true
          items:
            - {key: gres.conf, path: gres.conf}
      {{- end }}
{{- end -}}
