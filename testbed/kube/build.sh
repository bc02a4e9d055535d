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

done_marker="$out/.complete"
if [[ -f $done_marker ]]; then exit 0; fi

# Kubernetes 1.36 needs Go >= 1.25. Where the machine's go is missing or
# older, take the official toolchain from the Go module proxy (the module the
# go command itself fetches for GOTOOLCHAIN) into the cache beside $out.
go_min=1.25 toolchain=go1.26.8
go_ok() {
  command -v go >/dev/null 2>&1 || return 1
  local v
  v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  [[ $(printf '%s\n%s\n' "$go_min" "$v" | sort -V | head -1) == "$go_min" ]]
}
if ! go_ok; then
  gohome="$(dirname "$out")/go/$toolchain"
  if [[ ! -x $gohome/bin/go ]]; then
    echo "fetching Go $toolchain from the Go module proxy" >&2
    fetch=$(mktemp -d)
    curl -fsSL -o "$fetch/go.zip" \
      "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-$toolchain.linux-amd64.zip"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$fetch/go.zip" "$fetch/x"
    mkdir -p "$(dirname "$gohome")"
    mv "$fetch/x/golang.org/toolchain@v0.0.1-$toolchain.linux-amd64" "$gohome"
    chmod +x "$gohome"/bin/* "$gohome"/pkg/tool/*/*
    rm -rf "$fetch"
  fi
  export PATH="$gohome/bin:$PATH" GOTOOLCHAIN=local
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# k8s.io/kubernetes points its staging modules (k8s.io/api, client-go, ...) at
# ./staging by replace directives, so `go install ...@version` is refused. A
# wrapper module requires it and pins every staging module at the matching
# v0.MINOR.PATCH tag instead; the list comes from kubernetes' own go.mod.
mkdir -p "$work/kube"
staging_version="v0.${k8s_version#v1.}"
kube_gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module sunk.local/testbed/kube"
  echo
  echo "go $(sed -n 's/^go //p' "$kube_gomod")"
  echo
  echo "require k8s.io/kubernetes $k8s_version"
  echo
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#replace \1 => \1 '"$staging_version"'#p' "$kube_gomod"
} >"$work/kube/go.mod"
cp "$here/tools.go" "$work/kube/tools.go"
(
  cd "$work/kube"
  go mod tidy
  # Stamp the version as Kubernetes' own release build does: clients (kubectl,
  # helm) read it from /version and refuse or warn on v0.0.0-master.
  minor=${k8s_version#v1.}
  minor=${minor%%.*}
  version_flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_flags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    version_flags+=" -X $pkg.gitTreeState=clean"
  done
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w$version_flags" -o "$out/" \
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
touch "$done_marker"
