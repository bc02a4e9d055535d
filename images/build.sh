#!/usr/bin/env bash
# Builds the four images with whatever OCI builder this machine has (docker,
# podman or buildah), from the repository root as the context, with the names
# the charts use by default. For users and CI that can pull debian:*-slim.
#   images/build.sh [REGISTRY] [TAG_SLURM] [TAG_SUNK]
# TAG_SLURM is the Slurm release: 26.05 (Debian forky, the default) or 24.11
# (Debian trixie).
#
# The test bed builds the same Dockerfiles without Docker or Docker Hub (a
# debootstrapped base, buildah, a local registry): python -m sunk_testbed.images
set -euo pipefail
cd "$(dirname "$0")/.."
registry=${1:-ghcr.io/sunk-dev} slurm_tag=${2:-26.05} sunk_tag=${3:-0.1.0}
case $slurm_tag in
  26.05) suite=forky ;;
  24.11) suite=trixie ;;
  *) echo "Slurm $slurm_tag: images are made for 26.05 and 24.11" >&2; exit 1 ;;
esac
for tool in docker podman buildah; do
  if command -v "$tool" >/dev/null; then builder=$tool; break; fi
done
[[ -n ${builder:-} ]] || { echo "no docker, podman or buildah here" >&2; exit 1; }
# buildah keeps no layer cache unless asked; with it, login reuses slurm's layers.
[[ $builder == buildah ]] && build=(buildah bud --layers) || build=("$builder" build)
"${build[@]}" --build-arg "DEBIAN_SUITE=$suite" -f images/slurm/Dockerfile -t "$registry/slurm:$slurm_tag" .
"${build[@]}" --build-arg "DEBIAN_SUITE=$suite" -f images/login/Dockerfile -t "$registry/slurm-login:$slurm_tag" .
"${build[@]}" -f images/sunk/Dockerfile -t "$registry/sunk:$sunk_tag" .
# The slurm chart's in-chart LDAP directory (identity.provider ldap), versioned with sunk.
"${build[@]}" -f images/ldap/Dockerfile -t "$registry/ldap:$sunk_tag" .
