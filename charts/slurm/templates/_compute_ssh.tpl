{{/*
How users and programs reach the compute pods (docs/training.md): by Slurm
node name in DNS (a headless Service the slurmd pods are the subdomain of,
searched by login and compute pods), and over ssh into the nodes of their own
jobs (slurmd.ssh).
*/}}
{{- define "slurm.nodesService" -}}{{ include "slurm.fullname" . }}-nodes{{- end -}}
{{- define "slurm.nodesDomain" -}}
{{ include "slurm.nodesService" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end -}}
{{- define "slurm.computeHostKeysSecret" -}}
{{ .Values.slurmd.ssh.existingHostKeysSecret | default (printf "%s-compute-ssh-host-keys" (include "slurm.fullname" .)) }}
{{- end -}}
{{- define "slurm.authorizedKeysSecret" -}}
{{ .Values.login.existingAuthorizedKeysSecret | default (printf "%s-authorized-keys" (include "slurm.fullname" .)) }}
{{- end -}}
{{/* Whether compute pods run sshd (the login pods sign for their users). */}}
{{- define "slurm.computeSsh" -}}
{{- if and .Values.slurmd.ssh.enabled .Values.login.enabled }}true{{- end -}}
{{- end -}}

{{/* A pod's DNS search: Slurm node names resolve alone. */}}
{{- define "slurm.nodesDnsConfig" -}}
dnsConfig:
  searches: [{{ include "slurm.nodesDomain" . }}]
{{- end -}}

{{/* The compute pods' sshd_config. */}}
{{- define "slurm.computeSshdConfig" -}}
Port 22
HostKey /etc/ssh/host-keys/ssh_host_ed25519_key
HostKey /etc/ssh/host-keys/ssh_host_ecdsa_key
HostKey /etc/ssh/host-keys/ssh_host_rsa_key
# The login pods sign for their users with their host key (ssh-keysign):
# their names are in /etc/ssh/shosts.equiv, their public keys (for those names
# only) in /etc/ssh/ssh_known_hosts. The name is the one the login pod sends (its name
# in cluster DNS); its host key proves it. Users' own files are ignored.
HostbasedAuthentication yes
HostbasedUsesNameFromPacketOnly yes
IgnoreRhosts yes
IgnoreUserKnownHosts yes
# A user's own keys too, as on the login pods (ssh -J through a login pod).
AuthorizedKeysFile none
AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u
AuthorizedKeysCommandUser nobody
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
# /etc/pam.d/sshd: pam_slurm_adopt lets in only a user with a job here, and
# moves the session into that job's cgroups.
UsePAM yes
PrintMotd no
X11Forwarding no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
{{- end -}}

{{/* The compute pods' /etc/pam.d/sshd. */}}
{{- define "slurm.computeSshPam" -}}
# sshd on a compute pod (the slurm chart). No password ever (keys and hosts
# only). pam_slurm_adopt refuses a user without a job on this node and adopts
# the session into the job's extern step (PrologFlags=Contain): its cgroups,
# its limits, and it ends with the job. A session it cannot adopt is refused
# (action_adopt_failure: its default, allow, would let the user in outside any
# job), and so is one when it cannot list the node's jobs. No pam_unix account
# check (users have no shadow entry here: it refuses them), no pam_systemd or
# pam_loginuid (no systemd here, and a container may not set a login uid).
auth       required   pam_deny.so
account    required   pam_slurm_adopt.so action_adopt_failure=deny action_generic_failure=deny
password   required   pam_deny.so
session    required   pam_unix.so
{{- end -}}

{{/* The login pods as ssh sees their names (reverse DNS of each pod's address). */}}
{{- define "slurm.shostsEquiv" -}}
{{- $login := printf "%s-login" (include "slurm.fullname" .) -}}
{{- range $i := until (int .Values.login.replicas) }}
{{ $login }}-{{ $i }}.{{ $login }}-hosts.{{ $.Release.Namespace }}.svc.{{ $.Values.clusterDomain }}
{{- end }}
{{- end -}}

{{/* The login pods' ssh client: hostbased to the compute pods. */}}
{{- define "slurm.loginSshConfig" -}}
# The slurm chart: ssh from a login pod to a compute pod authenticates as the
# login host (ssh-keysign signs with its host key); the compute pods' public
# host keys are in /etc/ssh/ssh_known_hosts, for their names only.
Host *
  HostbasedAuthentication yes
  EnableSSHKeysign yes
{{- end -}}

{{/*
The public halves of the ssh host keys, in Secrets the keys hook derives from
the private ones (at every install and upgrade): a pod trusts its peers' keys
without holding them. A login pod signs as its host (ssh-keysign) with its own
private key; a compute pod never sees a login pod's private key, nor a login
pod a compute pod's.
*/}}
{{- define "slurm.loginPublicKeysSecret" -}}{{ include "slurm.fullname" . }}-login-ssh-public-keys{{- end -}}
{{- define "slurm.computePublicKeysSecret" -}}{{ include "slurm.fullname" . }}-compute-ssh-public-keys{{- end -}}

{{/* The login pods' host names, comma-separated (known_hosts' host field). */}}
{{- define "slurm.loginHostNames" -}}
{{- splitList "\n" (include "slurm.shostsEquiv" . | trim) | join "," -}}
{{- end -}}

{{/* The names the compute pods are reached by: each NodeSet's node names
  (its nodeName pattern, the Kubernetes node as `*`), alone and in the nodes'
  domain, and any name in that domain (a headless Service of slurmd pods only). */}}
{{- define "slurm.computeHostPatterns" -}}
{{- $domain := include "slurm.nodesDomain" . -}}
{{- $patterns := list (printf "*.%s" $domain) -}}
{{- range .Values.nodesets -}}
{{- $name := .nodeName | default "{nodeset}-{node}" | replace "{nodeset}" .name | replace "{node}" "*" | replace "{ip}" "*" -}}
{{- $patterns = append $patterns $name -}}
{{- $patterns = append $patterns (printf "%s.%s" $name $domain) -}}
{{- end -}}
{{- $patterns | uniq | join "," -}}
{{- end -}}

{{/*
An init container that writes /etc/ssh/ssh_known_hosts into the emptyDir
`ssh-trust`: the public keys of the Secret `public` (the keys hook's), for the
host names `hosts` only; with `own` (a Secret of this pod's own host keys),
also the public half of its ed25519 key, which ssh-keysign needs. Pass
(dict "root" $ "public" SECRET "hosts" "a,b" "own" SECRET-or-"").
*/}}
{{- define "slurm.sshTrustInit" -}}
- name: ssh-trust
  image: {{ include "slurm.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  env:
    - {name: HOSTS, value: {{ .hosts | quote }}}
  command:
    - sh
    - -ec
    - |
      for key in /keys/public/ssh_host_*_key.pub; do
        echo "$HOSTS $(cat "$key")"
      done > /ssh-trust/ssh_known_hosts
      if [ -d /keys/own ]; then
        ssh-keygen -y -f /keys/own/ssh_host_ed25519_key > /ssh-trust/ssh_host_ed25519_key.pub
      fi
      chmod 0644 /ssh-trust/*
  securityContext:
    # Root only to read its own 0400 key (as the owner: no capability).
    runAsUser: 0
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL]}
  volumeMounts:
    - {name: ssh-trust, mountPath: /ssh-trust}
    - {name: ssh-public-keys, mountPath: /keys/public, readOnly: true}
    {{- if .own }}
    - {name: ssh-own-keys, mountPath: /keys/own, readOnly: true}
    {{- end }}
{{- end -}}
{{- define "slurm.sshTrustVolumes" -}}
- {name: ssh-trust, emptyDir: {}}
- name: ssh-public-keys
  secret:
    secretName: {{ .public }}
    defaultMode: 0444
{{- if .own }}
- name: ssh-own-keys
  secret:
    secretName: {{ .own }}
    defaultMode: 0400
{{- end }}
{{- end -}}
