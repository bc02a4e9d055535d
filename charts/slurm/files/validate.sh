#!/bin/sh
# A helm pre-install/pre-upgrade hook: starts a throwaway slurmctld on the
# candidate configuration (same binary as the cluster's) and fails the release
# if Slurm rejects it, before any ConfigMap of the cluster changes.
# It runs as SlurmUser in its own pod: its own host name stands in for
# SlurmctldHost, its own empty state directory and munged (with a throwaway
# key), no accounting.
set -eu
# Settings the image's Slurm is too old for, named by their chart value
# rather than by slurmctld's own error.
# `slurmctld -V`: "slurm 24.11.5", or "slurm-wlm 26.05.5" from Debian.
version=$(slurmctld -V | sed -n 's/^slurm[^ ]* \([0-9][0-9]*\)\.\([0-9][0-9]*\)\..*/\1 \2/p')
if [ -n "$version" ] && grep -q '^MetricsType=metrics/openmetrics' /candidate/slurm.conf; then
  set -- $version
  if [ "$1" -lt 25 ] || { [ "$1" -eq 25 ] && [ "$2" -lt 11 ]; }; then
    echo "metrics.enabled: $(slurmctld -V) has no OpenMetrics endpoints (Slurm 25.11 and later); set metrics.enabled=false for this image" >&2
    exit 1
  fi
fi
work=/tmp/validate
mkdir -p "$work/etc" "$work/state" "$work/keys"
mkdir -m 0700 "$work/munge"
cp /candidate/* "$work/etc/"
head -c 48 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/keys/jwt_hs256.key"
head -c 1024 /dev/urandom > "$work/munge/munge.key"
chmod 0400 "$work/munge/munge.key" "$work/keys/jwt_hs256.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munged.seed"
trap 'kill "$(cat "$work/munge/munged.pid")" 2>/dev/null || true' EXIT
me=$(hostname)
sed -i \
  -e '/^SlurmctldHost=/d' \
  -e '/^AccountingStorage/d' \
  -e '/^AuthInfo=/d' \
  -e "s#^StateSaveLocation=.*#StateSaveLocation=$work/state#" \
  -e "s#^SlurmctldPidFile=.*#SlurmctldPidFile=$work/slurmctld.pid#" \
  -e "s#jwt_key=/run/slurm-keys/jwt_hs256.key#jwt_key=$work/keys/jwt_hs256.key#" \
  "$work/etc/slurm.conf"
# Without accounting only Slurm's default TRES exist: the weights of a GRES,
# license or burst buffer (accounted through slurmdbd, AccountingStorageTRES)
# are left out of this check, or slurmctld would refuse every one.
awk '{
  for (i = 1; i <= NF; i++) {
    if ($i !~ /^(TRESBillingWeights|PriorityWeightTRES)=/) continue
    key = substr($i, 1, index($i, "=") - 1)
    value = substr($i, index($i, "=") + 1)
    gsub(/"/, "", value)
    n = split(value, parts, ",")
    kept = ""
    for (j = 1; j <= n; j++)
      if (tolower(parts[j]) !~ /^(gres|license|bb)\//) kept = kept (kept == "" ? "" : ",") parts[j]
    $i = (kept == "" ? "" : key "=" kept)
  }
  print
}' "$work/etc/slurm.conf" > "$work/etc/slurm.conf.checked"
mv "$work/etc/slurm.conf.checked" "$work/etc/slurm.conf"
sed -i -e "1i SlurmctldHost=$me(127.0.0.1)" -e "1i AuthInfo=socket=$work/munge/munge.socket" "$work/etc/slurm.conf"
export SLURM_CONF="$work/etc/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$work/log" 2>&1 &
pid=$!
i=0
while [ $i -lt 300 ]; do
  if grep -q "Running as primary controller" "$work/log"; then
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "slurm.conf accepted by $(slurmctld -V)"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "slurmctld rejects the new configuration:" >&2
    grep -iE "error|fatal" "$work/log" >&2 || cat "$work/log" >&2
    exit 1
  fi
  i=$((i + 1))
  sleep 0.1
done
kill "$pid" 2>/dev/null || true
echo "slurmctld did not start within 30 s on the new configuration:" >&2
cat "$work/log" >&2
exit 1
