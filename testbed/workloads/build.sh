#!/usr/bin/env bash
# Builds the managers of the JobSet and LeaderWorkerSet controllers
# (sigs.k8s.io/jobset, whose main package is the module root, and
# sigs.k8s.io/lws, whose is cmd/) from their official Go modules into a cache
# directory keyed by version: `jobset` and `lws`, each the `/manager` of its
# image. Static (CGO off), trimmed, stripped, their version stamped as the
# projects' own Makefiles do. Each module's Helm chart is copied beside them
# (`charts/jobset`, `charts/lws`), out of Go's read-only module cache.
# Idempotent: a cache hit does nothing. Only the Go module proxy is contacted.
#
#   testbed/workloads/build.sh OUT_DIR JOBSET_VERSION LWS_VERSION
set -euo pipefail
out=$1 jobset_version=$2 lws_version=$3
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=../kube/go.sh
source "$here/../kube/go.sh"
start_build "$out"

version_flag() { printf " -X %s/pkg/version.GitVersion=%s" "$1" "$2"; }
go_module_build "$work/jobset" sigs.k8s.io/jobset "$jobset_version" "$out/jobset" \
  "$(version_flag sigs.k8s.io/jobset "$jobset_version")" sigs.k8s.io/jobset
go_module_build "$work/lws" sigs.k8s.io/lws "$lws_version" "$out/lws" \
  "$(version_flag sigs.k8s.io/lws "$lws_version")" sigs.k8s.io/lws/cmd

# The charts of exactly the modules built (go mod download prints where they are).
mkdir -p "$out/charts"
for pair in "jobset $jobset_version" "lws $lws_version"; do
  read -r name version <<<"$pair"
  dir=$(cd "$work" && go mod download -json "sigs.k8s.io/$name@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$out/charts/$name"
  cp -r "$dir/charts/$name" "$out/charts/$name"
  chmod -R u+w "$out/charts/$name"
done

for b in jobset lws charts/jobset/Chart.yaml charts/lws/Chart.yaml; do [[ -e $out/$b ]] || { echo "missing $out/$b" >&2; exit 1; }; done
touch "$out/.complete"
