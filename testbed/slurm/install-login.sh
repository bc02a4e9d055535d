#!/usr/bin/env bash
# Installs what a login node holds into a Debian system: the Slurm clients,
# compilers and Open MPI's wrappers, python3, editors and sshd. No Slurm daemon
# and no database server: the login pod is the one host users reach, so it
# carries nothing it does not run. Run as root in a RUN step of images/login.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# The ids install-slurm.sh gives these users, created before the packages so
# their maintainer scripts reuse them: the login pod's /etc/passwd is the
# daemons' image's, so files owned here must agree with it.
getent group slurm >/dev/null || groupadd --system --gid 64030 slurm
getent passwd slurm >/dev/null || useradd --system --uid 64030 --gid slurm --home-dir /var/lib/slurm --shell /usr/sbin/nologin slurm
getent group munge >/dev/null || groupadd --system --gid 64033 munge
getent passwd munge >/dev/null || useradd --system --uid 64033 --gid munge --home-dir /nonexistent --shell /usr/sbin/nologin munge
apt-get update -qq
# The clients need libmunge only: the pod's munged is a sidecar from the
# daemons' image (trixie's slurm-client still pulls in munge's package).
# slurm.conf names auth/jwt in AuthAltTypes: its plugin too.
# libopenmpi-dev and openmpi-bin: the Open MPI the compute image runs, so a
# program built here with mpicc runs in jobs.
apt-get install -y -qq --no-install-recommends \
  slurm-client slurm-wlm-jwt-plugin openssh-server openssh-client \
  gcc g++ make libc6-dev libopenmpi-dev openmpi-bin python3 python3-venv \
  vim-tiny nano less git curl procps iproute2 bash-completion hostname ca-certificates
apt-get clean
rm -rf /var/lib/apt/lists/*

mkdir -p /etc/slurm /run/sshd
# Host keys are generated per login deployment (a Secret), never baked in;
# so is the munge key (munge's package makes one where it is installed).
rm -f /etc/ssh/ssh_host_* /etc/munge/munge.key
# The clients read slurm.conf (mounted at run time) even for --version: only found here.
command -v sbatch srun squeue sacct scontrol >/dev/null
mpicc --version
