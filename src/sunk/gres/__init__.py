"""Slurm's gres.conf from the GPUs found on each node, kept current.

`plan` (pure) turns the NodeSets' slurmd pods and their Nodes' GPU lists
(`sunk.dev/gpus`, written by sunk's GPU plugin) into one `NodeName=` line per
Slurm GPU node, naming its device files; `controller` (in `sunk operator`,
under its Lease) watches Nodes, the NodeSets' pods and the slurm chart's gres
ConfigMap and writes it. slurmctld reads it from its configuration directory
and the chart's reconfigure sidecar applies a change (`scontrol reconfigure`):
each slurmd reads its own lines again. See "gres.conf from each node's GPUs"
in docs/gpus.md.
"""
