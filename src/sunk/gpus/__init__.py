"""sunk's GPU device plugin (`sunk gpu-plugin`), one process on each node.

It serves the kubelet two extended resources: `nvidia.com/gpu`, one device per
GPU found (ID: its index), handed to a pod only when sunk's scheduler wrote on
the pod the GPUs Slurm allocated to its job on that node (the pod status
condition `sunk.dev/SlurmGPUs`); and `sunk.dev/node-gpus`, one device that
gives the node's slurmd pod (a NodeSet's) every GPU, so Slurm sees them all
and confines each job to its own with cgroups.

`devices` (pure: the GPUs found in a directory), `choice` (pure: which pod an
allocation is for, and whether it is allowed), `plugin` (the kubelet's gRPC
services, their registration through the kubelet's plugin watcher, the
rescan loop, and the narrow port to the pods bound to the node), `run` (the
wiring). `proto` is generated from the kubelet's protos. `cdi` (pure: CDI
specs read, checked and resolved to a container's edits), `inventory` (a
node's NVIDIA device nodes, driver libraries and tools, and the CDI spec
for them) and `nvml` (pure: gres.conf lines from what NVML says of each
GPU) are what the CDI path is built on. See docs/gpus.md.
"""
