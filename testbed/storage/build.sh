#!/usr/bin/env bash
# Builds the test bed's shared storage from the Go module proxy into a cache
# directory keyed by versions: SeaweedFS's `weed` (master, volume server,
# filer and S3 gateway in one binary), the S3 CSI driver `s3driver`
# (github.com/yandex-cloud/k8s-csi-s3), Kubernetes' `csi-provisioner`
# sidecar, and `csi-registrar` (testbed/storage/csi-registrar: kubelet's
# plugin registration for the driver). All static (CGO off).
# Idempotent: a cache hit does nothing. Only the Go module proxy is contacted.
#
#   testbed/storage/build.sh OUT_DIR SEAWEEDFS_VERSION CSI_S3_VERSION PROVISIONER_VERSION
set -euo pipefail
out=$1 seaweedfs_version=$2 csi_s3_version=$3 provisioner_version=$4
here=$(cd "$(dirname "$0")" && pwd)
binaries=(weed s3driver csi-provisioner csi-registrar)

[[ -f $out/.complete ]] && exit 0
# shellcheck source=../kube/go.sh
source "$here/../kube/go.sh"
ensure_go "$(dirname "$out")"
mkdir -p "$out"
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# These modules carry replace directives (external-provisioner ~30,
# SeaweedFS one), which `go install mod@version` refuses; so each is built
# as its maintainers build it, from a writable copy of the module's own
# directory (its go.mod and go.sum as released). SeaweedFS gets one patch:
# seaweedfs-directory-metadata.patch (directories keep s3fs's owner and mode).
# A patch file (-p1, relative to the module's root) is applied to the copy.
#   build_copy MODULE VERSION PACKAGE OUTPUT_NAME [PATCH]
build_copy() {
  local module=$1 version=$2 package=$3 name=$4 patch=${5:-} dir
  dir=$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  cp -r "$dir" "$work/$name-src"
  chmod -R u+w "$work/$name-src"
  [[ -z $patch ]] || patch -d "$work/$name-src" -p1 --forward <"$patch"
  (cd "$work/$name-src" && go build -trimpath -ldflags='-s -w' -o "$out/$name" "$package")
}
build_copy github.com/seaweedfs/seaweedfs "$seaweedfs_version" ./weed weed \
  "$here/seaweedfs-directory-metadata.patch"
build_copy github.com/yandex-cloud/k8s-csi-s3 "$csi_s3_version" ./cmd/s3driver s3driver
build_copy github.com/kubernetes-csi/external-provisioner/v5 "$provisioner_version" \
  ./cmd/csi-provisioner csi-provisioner
cp -r "$here/csi-registrar" "$work/csi-registrar"
(cd "$work/csi-registrar" && go build -trimpath -ldflags='-s -w' -o "$out/csi-registrar" .)

for b in "${binaries[@]}"; do [[ -x $out/$b ]] || { echo "missing $out/$b" >&2; exit 1; }; done
touch "$out/.complete"
