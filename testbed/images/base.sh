#!/usr/bin/env bash
# Makes the root filesystem of the images' base (what `FROM debian:trixie-slim`
# means on this machine): a minbase debootstrap, slimmed the way Debian's
# official -slim images are (no docs, man pages or translations; apt cleans up
# after itself), as one tarball. Idempotent: a finished OUT_DIR is left alone.
#
#   testbed/images/base.sh OUT_DIR SUITE
#
# sunk_testbed.images imports OUT_DIR/rootfs.tar into buildah's storage.
set -euo pipefail
out=$1 suite=$2
mirror=${SUNK_DEBIAN_MIRROR:-http://deb.debian.org/debian}

[[ -f $out/.complete ]] && exit 0
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }

root="$out.partial"
rm -rf "$root" "$out"
mkdir -p "$(dirname "$out")"
# debootstrap mounts nothing for minbase, but a failed run may leave /proc.
trap 'mountpoint -q "$root/proc" && umount -l "$root/proc"; true' EXIT
# A suite newer than this debootstrap knows (forky on trixie's) bootstraps like sid.
script=/usr/share/debootstrap/scripts/$suite
[[ -e $script ]] || script=/usr/share/debootstrap/scripts/sid
debootstrap --variant=minbase "$suite" "$root" "$mirror" "$script"

# As debuerreotype-slimify: dpkg skips these paths from now on...
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
CFG
# ...and apt keeps no package files or index translations.
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"

# ...and what is already there goes the same way.
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{groff,info,linda,lintian,man}/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/lib/dpkg/*-old "$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/*
find "$root/var/log" -type f -exec truncate -s 0 {} +
# The container engine provides these per container.
rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
: >"$root/etc/machine-id"

mkdir -p "$out"
# /dev, /proc and /sys stay empty: the runtime mounts them in every container.
tar --numeric-owner --xattrs --acls --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  -C "$root" -cf "$out/rootfs.tar.partial" .
mv "$out/rootfs.tar.partial" "$out/rootfs.tar"
# The images' tags hash this, so a new base means new tags.
sha256sum "$out/rootfs.tar" | cut -d' ' -f1 >"$out/rootfs.sha256"
rm -rf "$root"
touch "$out/.complete"
