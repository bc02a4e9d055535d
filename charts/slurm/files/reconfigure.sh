#!/bin/sh
# Runs beside slurmctld: when the files of /etc/slurm (a ConfigMap volume,
# updated in place by the kubelet) or the JWKS in /etc/slurm-jwks (a Secret
# volume: the public keys of sunk's tokens) change, the controller in charge
# runs `scontrol reconfigure`. Slurm (23.11+) starts the new configuration in
# a new slurmctld process and keeps the old one if the new one fails; every
# slurmd re-reads its configuration from the controller (configless).
interval=${1:-2}
digest() { cat /etc/slurm/* /etc/slurm-jwks/* 2>/dev/null | md5sum; }
applied=$(digest)
me=$(hostname)
while sleep "$interval"; do
  now=$(digest)
  [ "$now" = "$applied" ] && continue
  # Only the controller in charge acts: the primary while it is up, else the
  # backup. `scontrol ping` prints "Slurmctld(primary) at NAME is UP".
  active=$(scontrol ping 2>/dev/null | sed -n 's/^Slurmctld([a-z0-9]*) at \([^ ]*\) is UP.*/\1/p' | head -n 1)
  if [ "$active" != "$me" ]; then
    applied=$now
    continue
  fi
  if scontrol reconfigure; then
    echo "$(date -u +%FT%TZ) configuration changed: scontrol reconfigure done"
    applied=$now
  else
    echo "$(date -u +%FT%TZ) scontrol reconfigure failed; retrying" >&2
  fi
done
