"""The test bed: a real Kubernetes control plane and a real Slurm on this machine.

Everything here runs real binaries: kube-apiserver, kube-controller-manager,
kube-scheduler and etcd built from the official Go modules, and Debian's Slurm
in a debootstrapped root filesystem. Nothing is emulated.

The workshop beside the product: it may import `sunk`, which never imports it
(docs/design.md, "Product and workshop").
"""
