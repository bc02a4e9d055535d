#!/usr/bin/env bash
# Builds what a real Kubernetes node of the test bed runs, from the official
# Go modules, into a cache directory keyed by version: kubelet and kube-proxy
# (k8s.io/kubernetes, the same wrapper module as the control plane) and a
# kubectl of the same version, containerd
# 2.x with its runc shim and ctr, crictl, CoreDNS (cluster DNS, run as a pod)
# and KWOK (simulated nodes for benchmarks beyond what kubelets fit).
# runc and the CNI plugins come from Debian (scripts/bootstrap.sh).
# Idempotent: a cache hit does nothing. Only the Go module proxy is contacted.
#
#   testbed/nodes/build.sh OUT_DIR K8S_VERSION CONTAINERD_VERSION CRICTL_VERSION COREDNS_VERSION KWOK_VERSION
set -euo pipefail
out=$1 k8s_version=$2 containerd_version=$3 crictl_version=$4 coredns_version=$5 kwok_version=$6
here=$(cd "$(dirname "$0")" && pwd)
binaries=(kubelet kube-proxy kubectl containerd containerd-shim-runc-v2 ctr crictl coredns kwok)

# shellcheck source=../kube/go.sh
source "$here/../kube/go.sh"
start_build "$out"

kube_wrapper_module "$work/kube" "$k8s_version"
cat >"$work/kube/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
(
  cd "$work/kube"
  go mod tidy
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w$(kube_version_flags "$k8s_version")" -o "$out/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
)

# These modules carry no replace directives: each builds as released (go.sh).
build_module() { go_module_build "$work/$(basename "$1")" "$1" "$2" "$out/" '' "${@:3}"; }
build_module github.com/containerd/containerd/v2 "$containerd_version" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
build_module sigs.k8s.io/cri-tools "$crictl_version" sigs.k8s.io/cri-tools/cmd/crictl
build_module github.com/coredns/coredns "$coredns_version" github.com/coredns/coredns
build_module sigs.k8s.io/kwok "$kwok_version" sigs.k8s.io/kwok/cmd/kwok

for b in "${binaries[@]}"; do [[ -x $out/$b ]] || { echo "missing $out/$b" >&2; exit 1; }; done
touch "$out/.complete"
