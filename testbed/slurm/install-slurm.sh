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
getent group munge >/dev/null || groupadd --system --gid 64033 munge
getent passwd munge >/dev/null || useradd --system --uid 64033 --gid munge --home-dir /nonexistent --shell /usr/sbin/nologin munge
# MariaDB's data directory lives on a volume that outlives the pod.
getent group mysql >/dev/null || groupadd --system --gid 64032 mysql
getent passwd mysql >/dev/null || useradd --system --uid 64032 --gid mysql --home-dir /nonexistent --shell /bin/false mysql
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  munge slurmctld slurmd slurm-client slurmrestd slurmdbd \
  slurm-wlm-jwt-plugin slurm-wlm-basic-plugins slurm-wlm-mysql-plugin \
  mariadb-server mariadb-client openssh-server \
  iproute2 procps hostname ca-certificates curl tini
apt-get clean
rm -rf /var/lib/apt/lists/*

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm /etc/slurm /run/sshd
# Host keys are generated per login deployment (a Secret), never baked in;
# so is the munge key (munge's package makes one where it is installed, and
# anyone who pulls the image would hold it).
rm -f /etc/ssh/ssh_host_* /etc/munge/munge.key
chown slurm:slurm /var/spool/slurmctld /var/log/slurm
slurmd -V
