#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler and etcd from
# the official Go modules into a cache directory keyed by version. Idempotent:
# a cache hit does nothing. Only the Go module proxy is contacted.
#
#   testbed/kube/build.sh OUT_DIR K8S_VERSION ETCD_VERSION
set -euo pipefail
out=$1 k8s_version=$2 etcd_version=$3
here=$(cd "$(dirname "$0")" && pwd)
binaries=(kube-apiserver kube-controller-manager kube-scheduler etcd)

# shellcheck source=go.sh
source "$here/go.sh"
start_build "$out"

kube_wrapper_module "$work/kube" "$k8s_version"
cp "$here/tools.go" "$work/kube/tools.go"
(
  cd "$work/kube"
  go mod tidy
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w$(kube_version_flags "$k8s_version")" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
)

# etcd's own main module also uses replace directives; its server module
# exposes etcdmain, so a one-line main in a wrapper module builds it.
mkdir -p "$work/etcd"
cp "$here/etcd/main.go" "$work/etcd/main.go"
(
  cd "$work/etcd"
  cat >go.mod <<MOD
module sunk.local/testbed/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $etcd_version
MOD
  go mod tidy
  CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/etcd" .
)

for b in "${binaries[@]}"; do [[ -x $out/$b ]] || { echo "missing $out/$b" >&2; exit 1; }; done
touch "$out/.complete"
