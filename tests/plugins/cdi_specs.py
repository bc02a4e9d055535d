"""CDI specs shaped like those NVIDIA's toolkit writes, for the tests that read them."""

# The shape `nvidia-ctk cdi generate` writes (trimmed): per-GPU device nodes,
# the control nodes, libraries and a hook in common.
NVIDIA_CTK_SPEC = """
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
"""
