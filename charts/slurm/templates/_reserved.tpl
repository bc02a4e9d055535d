{{- /* The ids no user or group may have (docs/identity.md): the daemons'
  (`ids`), the admins' uids and identity.reservedIds (sunk's pods, nobody).
  Decimal numbers, in order, one space apart. */ -}}
{{- define "slurm.reservedIds" -}}
{{- $ids := list -}}
{{- range $name, $id := .Values.ids }}{{ $ids = append $ids (printf "%010d" (int64 $id)) }}{{ end -}}
{{- range .Values.admins }}{{ $ids = append $ids (printf "%010d" (int64 .uid)) }}{{ end -}}
{{- range .Values.identity.reservedIds | default list }}{{ $ids = append $ids (printf "%010d" (int64 .)) }}{{ end -}}
{{- $out := list -}}
{{- range $ids | uniq | sortAlpha }}{{ $out = append $out (regexReplaceAll "^0+(.)" . "${1}") }}{{ end -}}
{{- join " " $out -}}
{{- end -}}

{{- /* slurm.conf's (and slurmdbd.conf's) AuthAltParameters: the HS256 key
  (`scontrol token`'s; with jwks= set Slurm loads it only when named), the JWKS
  that sunk's RS256 tokens verify against (by their kid), and the cap on
  `scontrol token` lifespans for users. */ -}}
{{- define "slurm.authAltParameters" -}}
AuthAltParameters=jwt_key=/run/slurm-keys/jwt_hs256.key,jwks=/etc/slurm-jwks/jwks.json,max_token_lifespan={{ int .Values.jwt.maxTokenLifespan }}
{{- if .Values.jwt.disableTokenCreation }},disable_token_creation{{ end }}
{{- end -}}

{{- /* Refuses values that would let a user or a group take a reserved id: a
  directory range (identity.ldap.minUid..maxUid) that holds one, a static
  user or group that has one. */ -}}
{{- define "slurm.reservedCheck" -}}
{{- $reserved := include "slurm.reservedIds" . | splitList " " -}}
{{- $l := .Values.identity.ldap -}}
{{- if include "slurm.ldap" . -}}
{{- if gt (int64 $l.minUid) (int64 $l.maxUid) -}}
{{- fail (printf "identity.ldap.minUid %d is above identity.ldap.maxUid %d: the directory range is empty" (int64 $l.minUid) (int64 $l.maxUid)) -}}
{{- end -}}
{{- $clash := list -}}
{{- range $reserved -}}
{{- if and (ge (int64 .) (int64 $l.minUid)) (le (int64 .) (int64 $l.maxUid)) }}{{ $clash = append $clash (int64 .) }}{{ end -}}
{{- end -}}
{{- if $clash -}}
{{- fail (printf "identity.ldap.minUid..maxUid (%d-%d) holds reserved ids %s: a directory user or group could be a daemon, an admin or nobody (reserved: ids, admins, identity.reservedIds)" (int64 $l.minUid) (int64 $l.maxUid) (join "," $clash)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.identity.users -}}
{{- if has (toString (int64 .uid)) $reserved -}}
{{- fail (printf "identity.users %s: uid %d is reserved (a daemon's, an admin's or nobody's: ids, admins, identity.reservedIds)" .name (int64 .uid)) -}}
{{- end -}}
{{- if and .gid (has (toString (int64 .gid)) $reserved) -}}
{{- fail (printf "identity.users %s: gid %d is reserved (ids, admins, identity.reservedIds)" .name (int64 .gid)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.identity.groups -}}
{{- if has (toString (int64 .gid)) $reserved -}}
{{- fail (printf "identity.groups %s: gid %d is reserved (ids, admins, identity.reservedIds)" .name (int64 .gid)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* nslcd's filters: directory users and groups within the directory range
  only, none with a reserved id, no user whose primary group is root's or
  reserved. Ranges need the directory's integerOrderingMatch on uidNumber and
  gidNumber (RFC 2307bis, OpenLDAP's nis schema, Active Directory); where it
  is missing the filter matches nothing, and no one resolves. */ -}}
{{- define "slurm.nslcdFilters" -}}
{{- $l := .Values.identity.ldap -}}
{{- $reserved := include "slurm.reservedIds" . | splitList " " -}}
{{- $notUid := "" }}{{ $notGid := "" -}}
{{- range $reserved }}{{ $notUid = printf "%s(!(uidNumber=%d))" $notUid (int64 .) }}{{ $notGid = printf "%s(!(gidNumber=%d))" $notGid (int64 .) }}{{ end -}}
filter passwd (&(objectClass=posixAccount)(uidNumber>={{ int64 $l.minUid }})(uidNumber<={{ int64 $l.maxUid }}){{ $notUid }}(!(gidNumber=0)){{ $notGid }})
filter group (&(objectClass=posixGroup)(gidNumber>={{ int64 $l.minUid }})(gidNumber<={{ int64 $l.maxUid }}){{ $notGid }})
{{- end -}}
