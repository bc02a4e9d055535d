#!/usr/bin/env bash
# Builds helm v3 from the official Go module into a cache directory keyed by
# version. Idempotent: a cache hit does nothing. Only the Go module proxy is
# contacted (the Go toolchain is the one testbed/kube/build.sh fetched if the
# machine's go is too old).
#
#   testbed/helm/build.sh OUT_DIR HELM_VERSION
set -euo pipefail
out=$1 version=$2

[[ -f $out/.complete ]] && exit 0
if ! command -v go >/dev/null 2>&1; then
  toolchain=$(ls -d "$(dirname "$(dirname "$out")")"/go/go* 2>/dev/null | sort -V | tail -1)
  [[ -n $toolchain ]] || { echo "no go toolchain: run testbed/kube/build.sh first" >&2; exit 1; }
  export PATH="$toolchain/bin:$PATH" GOTOOLCHAIN=local
fi
mkdir -p "$out"
# helm's own Makefile stamps its version and the Kubernetes version that
# `helm template`/`lint` assume without a cluster (from the client-go it links:
# v0.N.x is Kubernetes 1.N); without them charts see v1.20.0.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
client_go=$(cd "$work" && go mod init sunk.local/helm >/dev/null 2>&1 &&
  go get "helm.sh/helm/v3@$version" >/dev/null 2>&1 && go list -m -f '{{.Version}}' k8s.io/client-go)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
flags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
CGO_ENABLED=0 GOBIN="$out" go install -trimpath -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$version"
"$out/helm" version --short
touch "$out/.complete"
