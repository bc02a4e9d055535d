#!/usr/bin/env bash
# Builds the kubelet plugin of Kubernetes' DRA example driver
# (sigs.k8s.io/dra-example-driver, cmd/dra-example-kubeletplugin) from its
# official Go module into a cache directory keyed by version, the stand-in for
# NVIDIA's DRA driver: it publishes ResourceSlices of simulated GPUs and, for
# each claim allocated on its node, writes the CDI spec the runtime applies.
# Static (CGO off), trimmed, stripped (the command has no version to stamp).
# The module's Helm chart is copied beside it (`charts/dra-example-driver`),
# out of Go's read-only module cache.
# Idempotent: a cache hit does nothing. Only the Go module proxy is contacted.
#
#   testbed/dra/build.sh OUT_DIR VERSION
set -euo pipefail
out=$1 version=$2
here=$(cd "$(dirname "$0")" && pwd)
module=sigs.k8s.io/dra-example-driver

# shellcheck source=../kube/go.sh
source "$here/../kube/go.sh"
start_build "$out"

go_module_build "$work/dra" "$module" "$version" "$out/dra-example-kubeletplugin" \
  "" "$module/cmd/dra-example-kubeletplugin"

dir=$(cd "$work/dra" && go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
mkdir -p "$out/charts"
rm -rf "$out/charts/dra-example-driver"
cp -r "$dir/deployments/helm/dra-example-driver" "$out/charts/dra-example-driver"
chmod -R u+w "$out/charts/dra-example-driver"

for b in dra-example-kubeletplugin charts/dra-example-driver/Chart.yaml; do
  [[ -e $out/$b ]] || { echo "missing $out/$b" >&2; exit 1; }
done
touch "$out/.complete"
