#!/usr/bin/env bash
# Installs Slurm, munge and the tools sunk's pods use into a Debian system.
# Run as root inside the target (a chroot for the test bed, a RUN step in the
# images). Creates the slurm user with a fixed uid so files agree across pods.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# The slurm and slurmrestd users, with fixed ids created before the packages so
# their maintainer scripts reuse them: pods sharing state need ids to agree.
getent group slurm >/dev/null || groupadd --system --gid 64030 slurm
getent passwd slurm >/dev/null || useradd --system --uid 64030 --gid slurm --home-dir /var/lib/slurm --shell /usr/sbin/nologin slurm
getent group slurmrest >/dev/null || groupadd --system --gid 64031 slurmrest
getent passwd slurmrest >/dev/null || useradd --system --uid 64031 --gid slurmrest --home-dir /nonexistent --shell /usr/sbin/nologin slurmrest
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  munge slurmctld slurmd slurm-client slurmrestd \
  slurm-wlm-jwt-plugin slurm-wlm-basic-plugins \
  iproute2 procps hostname ca-certificates curl
apt-get clean
rm -rf /var/lib/apt/lists/*

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm /etc/slurm
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
slurmd -V
