#!/usr/bin/env bash
# Creates a Debian root filesystem with Slurm in it, for the test bed.
# Idempotent: an existing complete root filesystem is left as it is.
#
#   testbed/slurm/rootfs.sh OUT_DIR SUITE
#
# The packages are installed by install-slurm.sh, the same script the images
# under images/ run, so the test bed runs what the images would contain.
set -euo pipefail
out=$1 suite=$2
mirror=${SUNK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)

[[ -f $out/.complete ]] && exit 0
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }

partial="$out.partial"
umount_all() {
  for m in dev/pts dev proc sys; do
    mountpoint -q "$partial/$m" && umount -l "$partial/$m"
  done
  return 0
}
trap umount_all EXIT
umount_all
rm -rf "$partial"
mkdir -p "$(dirname "$out")"
debootstrap --variant=minbase "$suite" "$partial" "$mirror"

# Keep maintainer scripts from starting daemons inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$partial/usr/sbin/policy-rc.d"
chmod +x "$partial/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$partial/etc/resolv.conf"
mount -t proc proc "$partial/proc"
mount --bind /dev "$partial/dev"
mount --bind /dev/pts "$partial/dev/pts"
cp "$here/install-slurm.sh" "$partial/tmp/install-slurm.sh"
chroot "$partial" /bin/bash /tmp/install-slurm.sh
rm -f "$partial/tmp/install-slurm.sh"
umount_all

rm -rf "$out"
mv "$partial" "$out"
touch "$out/.complete"
