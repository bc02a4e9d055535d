{{- /* Values that would install and then fail quietly, refused at render
  naming the value. */ -}}
{{- define "slurm.valuesCheck" -}}
{{- if and .Values.homes.storageClassName .Values.homes.existingClaim -}}
{{- fail (printf "homes: storageClassName (%s) makes a claim and existingClaim (%s) names one; set one of them" .Values.homes.storageClassName .Values.homes.existingClaim) -}}
{{- end -}}
{{- if and .Values.admins (not .Values.accounting.enabled) -}}
{{- fail "admins: Slurm keeps AdminLevel in its accounting database and accounting.enabled is false, so no admin would be made and sunk's operator and syncer could not drain or resume nodes. Enable accounting, or set admins: [] and name SlurmUser (slurm) as sunk-cluster's operator.slurmUser and syncer.slurmUser" -}}
{{- end -}}
{{- if not .Values.accounting.enabled -}}
{{- /* QOS, enforcement and GPU TRES live in slurmdbd: slurmctld refuses a
  gres/gpu TRES without it, and QOS preemption would find no QOS. */ -}}
{{- $needs := list -}}
{{- $clear := list -}}
{{- $conf := .Values.slurmConfig | default dict -}}
{{- if eq (toString (index $conf "PreemptType" | default "")) "preempt/qos" -}}
{{- $needs = append $needs "slurmConfig.PreemptType=preempt/qos" -}}
{{- $clear = append $clear "--set slurmConfig.PreemptType=null --set slurmConfig.PreemptMode=null (slurmctld refuses PreemptMode=REQUEUE alone)" -}}
{{- end -}}
{{- range $key := list "AccountingStorageEnforce" "AccountingStorageTRES" -}}
{{- with index $conf $key -}}
{{- $needs = append $needs (printf "slurmConfig.%s=%v" $key .) -}}
{{- $clear = append $clear (printf "--set slurmConfig.%s=null" $key) -}}
{{- end -}}
{{- end -}}
{{- range $i, $p := .Values.partitions -}}
{{- with ($p.config | default dict).TRESBillingWeights -}}
{{- if contains "gres/" (lower (toString .)) -}}
{{- $needs = append $needs (printf "partitions[%d] (%s) config.TRESBillingWeights=%v" $i $p.name .) -}}
{{- $clear = append $clear (printf "drop the GRES weights from partitions[%d].config.TRESBillingWeights (in a values file: --set on a list replaces the whole list)" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $needs -}}
{{- fail (printf "accounting.enabled is false, but %s need Slurm's accounting database (QOS, associations and GPU TRES live in slurmdbd; slurmctld refuses gres/gpu TRES without it). Enable accounting, or clear them: %s" (join ", " $needs) (join ", " $clear)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
