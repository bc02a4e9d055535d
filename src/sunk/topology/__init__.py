"""Slurm's network topology from Kubernetes node labels, kept current.

`build` (pure) turns node labels into a tree (topology/tree) or blocks
(topology/block) and renders topology.yaml (Slurm 25.05+) or topology.conf
(24.11); `plan` (pure) decides, from the settings the slurm chart writes and
the slurmd pods on labelled nodes, what the topology ConfigMap must hold;
`controller` (in `sunk operator`, under its Lease) watches Nodes, the
NodeSets' pods and that ConfigMap and writes it. slurmctld reads it from its
configuration directory; the chart's reconfigure sidecar applies a change
(`scontrol reconfigure`). See "Topology" in docs/training.md.
"""
