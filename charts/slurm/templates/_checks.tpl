{{- /* Values that would install and then fail quietly, refused at render
  naming the value. */ -}}
{{- define "slurm.valuesCheck" -}}
{{- if and .Values.admins (not .Values.accounting.enabled) -}}
{{- fail "admins: Slurm keeps AdminLevel in its accounting database and accounting.enabled is false, so no admin would be made and sunk's operator and syncer could not drain or resume nodes. Enable accounting, or set admins: [] and name SlurmUser (slurm) as sunk-cluster's operator.slurmUser and syncer.slurmUser" -}}
{{- end -}}
{{- end -}}
