//go:build tools

// Package tools pins the Kubernetes commands the test bed builds, so that
// `go mod tidy` resolves their whole dependency graph.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
