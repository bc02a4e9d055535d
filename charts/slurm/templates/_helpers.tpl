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
{{- /* The RS256 keys sunk tokens signs with (private, one <kid>.pem each), and
  the JWKS of their public halves that slurmctld and slurmdbd read. */ -}}
{{- define "slurm.jwtSigningSecret" -}}{{ .Values.jwt.existingSigningSecret | default (printf "%s-jwt-signing" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.jwksSecret" -}}{{ include "slurm.fullname" . }}-jwks{{- end -}}
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
      {{- if include "slurm.ldap" .root }}
      # nslcd's config, the bind password appended from the Secret (a shell
      # builtin: never on a command line), readable by nslcd's uid only.
      install -d -o {{ .root.Values.ids.nslcd }} -g {{ .root.Values.ids.nslcd }} -m 0700 /nslcd-conf
      # The socket's directory is nslcd's: no user (a login shell, a job) may
      # replace the socket with one of their own that root's queries would ask.
      install -d -o {{ .root.Values.ids.nslcd }} -g {{ .root.Values.ids.nslcd }} -m 0755 /nslcd-run
      (umask 077
      {{- if include "slurm.ldapBindDN" .root }}
      { cat /identity/nslcd.conf; printf 'bindpw %s\n' "$(cat /secrets/ldap/bind-password)"; } > /nslcd-conf/nslcd.conf
      {{- else }}
      cat /identity/nslcd.conf > /nslcd-conf/nslcd.conf
      {{- end }}
      )
      chown {{ .root.Values.ids.nslcd }}:{{ .root.Values.ids.nslcd }} /nslcd-conf/nslcd.conf
      chmod 0400 /nslcd-conf/nslcd.conf
      {{- end }}
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
    {{- if include "slurm.ldap" .root }}
    - {name: nslcd-conf, mountPath: /nslcd-conf}
    - {name: nslcd-run, mountPath: /nslcd-run}
    {{- if include "slurm.ldapBindDN" .root }}
    - {name: ldap-secret, mountPath: /secrets/ldap, readOnly: true}
    {{- end }}
    {{- end }}
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
  resources:
    requests: {memory: 16Mi}
  startupProbe:
    exec:
      command: [test, -S, /run/munge/munge.socket.2]
    periodSeconds: 1
    failureThreshold: 60
  volumeMounts:
    - {name: munge-etc, mountPath: /etc/munge}
    - {name: munge-run, mountPath: /run/munge}
{{- if include "slurm.ldap" .root }}
{{- /* Directory users: nslcd answers the pod's NSS queries (its socket in
  /run/nslcd) from LDAP on every call, no cache, so a user added or removed
  counts at once. Non-root, no capabilities: it only reads the directory. */}}
- name: nslcd
  image: {{ include "slurm.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  restartPolicy: Always
  command: [nslcd, --nofork]
  securityContext:
    runAsUser: {{ .root.Values.ids.nslcd }}
    runAsGroup: {{ .root.Values.ids.nslcd }}
    runAsNonRoot: true
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities: {drop: [ALL]}
    seccompProfile: {type: RuntimeDefault}
  startupProbe:
    exec:
      command: [test, -S, /run/nslcd/socket]
    periodSeconds: 1
    failureThreshold: 60
  # Memory only: in a slurmd pod, requests are left out of Slurm's share of
  # the node, and a CPU request would cost it a whole CPU.
  resources:
    requests: {memory: 16Mi}
  volumeMounts:
    # The file the prepare container wrote (nslcd before 0.9.13 reads no other path).
    - {name: nslcd-conf, mountPath: /etc/nslcd.conf, subPath: nslcd.conf, readOnly: true}
    - {name: nslcd-run, mountPath: /run/nslcd}
{{- end }}
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
{{- if include "slurm.ldap" . }}
- {name: nslcd-conf, emptyDir: {medium: Memory}}
- {name: nslcd-run, emptyDir: {}}
{{- if include "slurm.ldapBindDN" . }}
- name: ldap-secret
  secret:
    secretName: {{ include "slurm.ldapSecret" . }}
    defaultMode: 0400
    items:
      - {key: bind-password, path: bind-password}
{{- end }}
{{- end }}
{{- end -}}

{{/* /etc/passwd and /etc/group with the identity provider's users; with
  ldap, an nsswitch.conf that asks nslcd after the files, and its socket. */}}
{{- define "slurm.identityMounts" -}}
- {name: etc-identity, mountPath: /etc/passwd, subPath: passwd, readOnly: true}
- {name: etc-identity, mountPath: /etc/group, subPath: group, readOnly: true}
{{- if include "slurm.ldap" . }}
- {name: identity, mountPath: /etc/nsswitch.conf, subPath: nsswitch.conf, readOnly: true}
- {name: nslcd-run, mountPath: /run/nslcd}
{{- end }}
{{- end -}}

{{/* What the pods' identity files come from (a change rolls them); the
  ldap settings count only with that provider, and not those that only the
  login pods (passwordLogin: their own checksum/sshd) or slurmdbd's accounts
  loop (accounts: re-read each pass) use. */}}
{{- define "slurm.identityChecksum" -}}
{{- $withoutLdap := omit .Values.identity "ldap" -}}
{{- $identity := ternary (set (deepCopy $withoutLdap) "ldap" (omit .Values.identity.ldap "passwordLogin" "accounts")) $withoutLdap (eq .Values.identity.provider "ldap") -}}
{{- list $identity .Values.admins | toJson | sha256sum | trunc 16 -}}
{{- end -}}

{{/* identity.provider ldap (docs/identity.md): "true" or "". */}}
{{- define "slurm.ldap" -}}
{{- if eq .Values.identity.provider "ldap" }}true{{- end -}}
{{- end -}}
{{- define "slurm.ldapServer" -}}
{{- if and (include "slurm.ldap" .) .Values.identity.ldap.server.enabled }}true{{- end -}}
{{- end -}}
{{- define "slurm.ldapName" -}}{{ include "slurm.fullname" . }}-ldap{{- end -}}
{{- define "slurm.ldapSecret" -}}{{ .Values.identity.ldap.existingSecret | default (printf "%s-ldap" (include "slurm.fullname" .)) }}{{- end -}}
{{- define "slurm.ldapUri" -}}
{{- .Values.identity.ldap.uri | default (printf "ldap://%s.%s.svc.%s:389" (include "slurm.ldapName" .) .Release.Namespace .Values.clusterDomain) -}}
{{- end -}}
{{/* The read-only bind: given, the in-chart directory's reader, or "" (anonymous). */}}
{{- define "slurm.ldapBindDN" -}}
{{- if include "slurm.ldap" . -}}
{{- if .Values.identity.ldap.bindDN -}}{{ .Values.identity.ldap.bindDN }}
{{- else if .Values.identity.ldap.server.enabled -}}cn=reader,{{ .Values.identity.ldap.baseDN }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- define "slurm.ldapUsersDN" -}}{{ .Values.identity.ldap.usersDN | default (printf "ou=people,%s" .Values.identity.ldap.baseDN) }}{{- end -}}
{{- define "slurm.ldapGroupsDN" -}}{{ .Values.identity.ldap.groupsDN | default (printf "ou=groups,%s" .Values.identity.ldap.baseDN) }}{{- end -}}
{{/* Refuses identity values that contradict each other, naming the field. */}}
{{- define "slurm.identityCheck" -}}
{{- if include "slurm.ldap" . -}}
{{- $l := .Values.identity.ldap -}}
{{- if and $l.uri $l.server.enabled -}}
{{- fail "identity.ldap: set uri (an external directory) or server.enabled (the in-chart one), not both" -}}
{{- end -}}
{{- if not (or $l.uri $l.server.enabled) -}}
{{- fail "identity.ldap: set uri (an external directory) or server.enabled: true (the in-chart one)" -}}
{{- end -}}
{{- if and $l.server.enabled (or $l.usersDN $l.groupsDN) -}}
{{- fail "identity.ldap.usersDN/groupsDN: the in-chart directory keeps users in ou=people and groups in ou=groups" -}}
{{- end -}}
{{- if and $l.uri $l.bindDN (not $l.existingSecret) -}}
{{- fail "identity.ldap.existingSecret: a Secret with bind-password is needed to bind as identity.ldap.bindDN" -}}
{{- end -}}
{{- if and $l.accounts.enabled (not .Values.accounting.enabled) -}}
{{- fail "identity.ldap.accounts.enabled: accounts live in the accounting database; set accounting.enabled too" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The key Secrets the keys hook makes (those not given): "name kind" lines;
  "name ssh-public SOURCE": the public halves of the host keys in SOURCE;
  "name jwks SOURCE": the JWKS of the RS256 keys in SOURCE. */}}
{{- define "slurm.generatedKeys" -}}
{{- if not .Values.munge.existingSecret }}
{{ include "slurm.mungeSecret" . }} munge
{{- end }}
{{- if not .Values.jwt.existingSecret }}
{{ include "slurm.jwtSecret" . }} jwt
{{- end }}
{{- if not .Values.jwt.existingSigningSecret }}
{{ include "slurm.jwtSigningSecret" . }} jwt-signing
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
{{- if and (include "slurm.ldapServer" .) (not .Values.identity.ldap.existingSecret) }}
{{ include "slurm.ldapSecret" . }} ldap
{{- end }}
{{- if include "slurm.computeSsh" . }}
{{ include "slurm.loginPublicKeysSecret" . }} ssh-public {{ include "slurm.hostKeysSecret" . }}
{{ include "slurm.computePublicKeysSecret" . }} ssh-public {{ include "slurm.computeHostKeysSecret" . }}
{{- end }}
{{ include "slurm.jwksSecret" . }} jwks {{ include "slurm.jwtSigningSecret" . }}
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
{{- if not (include "slurm.ldap" .) }}
# Keys only, from the authorized-keys Secret (one file per user). Read
# through a command: a kubelet mounts Secrets on a world-writable (1777)
# directory, which sshd's StrictModes refuses for AuthorizedKeysFile; a
# Secret's update reaches the next login without a restart.
{{- end }}
AuthorizedKeysFile none
{{- if include "slurm.ldap" . }}
# The directory's keys (sshPublicKey), looked up at each login by an
# unprivileged local user that alone may read the bind password: a user
# removed from the directory has no key, and no account, at once.
AuthorizedKeysCommand /bin/sh /etc/ssh/chart/ldap-keys %u
AuthorizedKeysCommandUser sunk-sshkeys
{{- else }}
AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u
AuthorizedKeysCommandUser nobody
{{- end }}
{{- if and (include "slurm.ldap" .) .Values.identity.ldap.passwordLogin }}
# Directory passwords through PAM (pam_ldap: nslcd binds as the user).
PasswordAuthentication yes
{{- else }}
PasswordAuthentication no
{{- end }}
KbdInteractiveAuthentication no
PermitRootLogin no
{{- if include "slurm.loginPam" . }}
UsePAM yes
{{- else }}
UsePAM no
{{- end }}
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
{{- end }}

{{/* NetworkPolicy peers: the release's pods of each component in .components. */}}
{{/* Whether an entry of networkPolicy.egress.allow applies: its `when`
  (containers, ldap) names a feature that is on, or it has none. */}}
{{- define "slurm.egressWhen" -}}
{{- if not .when }}true
{{- else if eq .when "containers" }}{{ if .root.Values.containers.enabled }}true{{ end }}
{{- else if eq .when "ldap" }}{{ include "slurm.ldap" .root }}
{{- else }}{{ fail (printf "networkPolicy.egress.allow.%s.when: %q is neither containers nor ldap" .key .when) }}
{{- end -}}
{{- end -}}

{{- define "slurm.peers" -}}
{{- range .components }}
- podSelector:
    matchLabels: {{- include "slurm.selector" (dict "root" $.root "component" .) | nindent 6 }}
{{- end }}
{{- end -}}


{{/* sshd's AuthorizedKeysCommand with ldap (run as sunk-sshkeys): the
  directory's sshPublicKey values of user $1, nothing for anyone else. */}}
{{- define "slurm.ldapKeysScript" -}}
{{- if include "slurm.ldap" . -}}
# Only plain user names reach the LDAP filter.
user=$1
case $user in ''|*[!A-Za-z0-9._-]*) exit 0 ;; esac
set -- -LLL -x -o ldif_wrap=no -o nettimeout=5 -l 10 -H {{ include "slurm.ldapUri" . | quote }} \
  -b {{ include "slurm.ldapUsersDN" . | quote }} "(&(objectClass=posixAccount)(uid=$user))" sshPublicKey
{{- with include "slurm.ldapBindDN" . }}
set -- -D {{ . | quote }} -y /run/ldap-keys/bind-password "$@"
{{- end }}
ldapsearch "$@" | while IFS= read -r line; do
  case $line in
    'sshPublicKey:: '*) printf '%s' "${line#sshPublicKey:: }" | base64 -d; echo ;;
    'sshPublicKey: '*) printf '%s\n' "${line#sshPublicKey: }" ;;
  esac
done
{{- end -}}
{{- end -}}

{{/* Whether the login pods' sshd goes through PAM: for directory passwords
  (identity.ldap.passwordLogin) or to make homes at first login
  (homes.createOnLogin). */}}
{{- define "slurm.loginPam" -}}
{{- if or .Values.homes.createOnLogin (and (include "slurm.ldap" .) .Values.identity.ldap.passwordLogin) }}true{{ end -}}
{{- end -}}

{{/* The login pods' PAM for sshd. With identity.ldap.passwordLogin, the
  directory's password (pam_ldap through nslcd) for directory users, whose
  account nslcd checks too; otherwise keys only (sshd never asks PAM to
  authenticate a key, and no password may pass). With homes.createOnLogin,
  pam_mkhomedir makes a missing home (0700, from /etc/skel) as the session
  opens; optional, so a user still logs in to see what is wrong when it
  cannot. Nothing else (no pam_loginuid: containers may not set it). */}}
{{- define "slurm.loginSshdPam" -}}
{{- if include "slurm.loginPam" . -}}
{{- if and (include "slurm.ldap" .) .Values.identity.ldap.passwordLogin -}}
auth    [success=1 default=ignore] pam_ldap.so minimum_uid={{ .Values.identity.ldap.minUid }}
auth    requisite pam_deny.so
auth    required pam_permit.so
account [success=1 default=ignore] pam_ldap.so minimum_uid={{ .Values.identity.ldap.minUid }}
account requisite pam_deny.so
account required pam_permit.so
{{- else -}}
auth    required pam_deny.so
account required pam_permit.so
{{- end }}
{{- if .Values.homes.createOnLogin }}
session optional pam_mkhomedir.so umask=0077 skel=/etc/skel
{{- end }}
session required pam_permit.so
{{- end -}}
{{- end -}}

{{/* The claim holding users' homes: the chart's, the named one, or "" (no
  shared homes). */}}
{{- define "slurm.homesClaim" -}}
{{- if .Values.homes.existingClaim -}}
{{ .Values.homes.existingClaim }}
{{- else if .Values.homes.storageClassName -}}
{{ include "slurm.fullname" . }}-homes
{{- end -}}
{{- end -}}

{{/* Before a pod mounts the homes' directory at /home: that directory made
  root's, 0755. kubelet would make a missing one with the mode of the claim's
  root, often 0777; anyone able to write /home could make another user's
  home before pam_mkhomedir does, or replace it with a symlink. */}}
{{- define "slurm.homesInit" -}}
{{- if include "slurm.homesClaim" . }}
- name: homes
  image: {{ include "slurm.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - sh
    - -ec
    - |
      dir=/claim/{{ .Values.homes.subPath }}
      if [ -L "$dir" ] || { [ -e "$dir" ] && [ ! -d "$dir" ]; }; then
        echo "homes.subPath: $dir on the claim is not a directory; refusing to mount it at /home" >&2
        exit 1
      fi
      mkdir -p "$dir"
      chown 0:0 "$dir"
      chmod 0755 "$dir"
  securityContext:
    runAsUser: 0
  volumeMounts:
    - {name: homes, mountPath: /claim}
{{- end }}
{{- end -}}

{{- define "slurm.homesMount" -}}
{{- if include "slurm.homesClaim" . }}
- {name: homes, mountPath: /home, subPath: {{ .Values.homes.subPath | quote }}}
{{- end }}
{{- end -}}

{{- define "slurm.homesVolume" -}}
{{- with include "slurm.homesClaim" . }}
- name: homes
  persistentVolumeClaim:
    claimName: {{ . }}
{{- end }}
{{- end -}}
