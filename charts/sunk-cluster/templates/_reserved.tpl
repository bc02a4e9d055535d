{{- /* Ids no tenant is granted: the charts' own (the slurm chart's daemons and
  admins, sunk's pods, nobody; the same as sunk.scheduler.tenancy's
  DEFAULT_RESERVED), which stay reserved whatever the values say, and
  scheduler.reservedIds. A JSON array of "N" / "LOW-HIGH" strings. */ -}}
{{- define "sunk.reservedIds" -}}
{{- $ids := list "64030-64036" "64040-64041" "65532" "65534" -}}
{{- range .Values.scheduler.reservedIds | default list -}}
{{- $ids = append $ids (include "sunk.idText" .) -}}
{{- end -}}
{{- $ids | uniq | toJson -}}
{{- end -}}

{{- /* A number from values as digits (helm reads numbers as floats). */ -}}
{{- define "sunk.idText" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ int64 . }}{{ end -}}
{{- end -}}

{{- /* Refuses, at install and template time, a tenant whose uids or gids
  reach below 1000 or hold a reserved id: a token for such a uid would act
  as a daemon, an admin or nobody in Slurm. The scheduler and `sunk tokens`
  refuse the same tenancy; this says so before anything is installed. */ -}}
{{- define "sunk.tenancyCheck" -}}
{{- $reserved := include "sunk.reservedIds" . | fromJsonArray -}}
{{- range $index, $tenant := .Values.scheduler.tenants -}}
{{- range $field := list "uids" "gids" -}}
{{- with index $tenant $field -}}
{{- $bounds := splitList "-" (toString .) -}}
{{- $low := first $bounds | int64 -}}
{{- $high := last $bounds | int64 -}}
{{- if lt $low 1000 -}}
{{- fail (printf "scheduler.tenants[%d].%s: %s: ids below 1000 are never granted" $index $field .) -}}
{{- end -}}
{{- $clash := list -}}
{{- range $reserved -}}
{{- $r := splitList "-" . -}}
{{- if and (le (first $r | int64) $high) (ge (last $r | int64) $low) -}}
{{- $clash = append $clash . -}}
{{- end -}}
{{- end -}}
{{- if $clash -}}
{{- fail (printf "scheduler.tenants[%d].%s: %s holds reserved ids %s: a daemon's, an admin's or nobody's are never granted (reserved: %s; scheduler.reservedIds)" $index $field . (join "," $clash) (join "," $reserved)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
