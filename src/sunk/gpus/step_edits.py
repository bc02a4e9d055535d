"""What sunk's container steps get of the node's CDI edits for its GPUs.

The slurmd pod receives every GPU as the CDI device `nvidia.com/gpu=all`
(containerd applies the node's spec: device nodes, driver files, hooks). A
container step runs in its own root, made by sunk's SPANK plugin
(images/slurm/containers/spank_containers.c), which must give it the same
edits for exactly the GPUs Slurm allocated to the step. The plugin is C and
reads no YAML, so the GPU plugin resolves the node's specs here and hands
the result to the slurmd pod (`ENV`, written by the pod's start to the file
the SPANK plugin reads), one edit per line:

    gpu PATH        a GPU's device node (each device's own nodes)
    node PATH       a device node every GPU process opens (the common ones)
    mount PATH      a driver file, at its path in the container
    env NAME=VALUE

The SPANK plugin gives a step the `gpu` nodes its device cgroup lets it use,
and the rest only with at least one of them. Paths are the container's (the
slurmd container holds each at that path); hooks are not carried: see
docs/gpus.md. Pure, but for `read_specs`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from sunk.gpus.cdi import ContainerEdits, Spec, SpecError, parse_spec

log = logging.getLogger(__name__)

ENV = "SUNK_GPU_EDITS"
# CDI's own: a spec of any other suffix is not read.
SPEC_SUFFIXES = (".json", ".yaml")
# The device every per-GPU edit is part of (nvidia-ctk's): not a GPU of its own.
ALL = "all"


def step_edits(specs: Iterable[Spec], kind: str) -> str:
    """The edits of every device of `kind` in `specs`, one per line, each once.

    Edits a device carries besides its device nodes (mounts, environment)
    are given with the common ones: a step holding any GPU gets them."""
    gpu: dict[str, None] = {}
    node: dict[str, None] = {}
    mount: dict[str, None] = {}
    env: dict[str, None] = {}
    for spec in specs:
        if spec.kind != kind:
            continue
        edits = [spec.edits]
        for device in spec.devices:
            if device.name == ALL:
                continue
            gpu.update(dict.fromkeys(n.path for n in device.edits.device_nodes))
            edits.append(ContainerEdits(mounts=device.edits.mounts, env=device.edits.env))
        for each in edits:
            node.update(dict.fromkeys(n.path for n in each.device_nodes))
            mount.update(dict.fromkeys(m.container_path for m in each.mounts))
            env.update(dict.fromkeys(each.env))
    lines = [
        *(("gpu", p) for p in gpu),
        *(("node", p) for p in node if p not in gpu),
        *(("mount", p) for p in mount),
        *(("env", e) for e in env),
    ]
    for word, value in lines:
        if "\n" in value or "\0" in value:
            raise SpecError(f"{kind}: {word} {value!r}: a container step takes no line break")
    return "".join(f"{word} {value}\n" for word, value in lines)


def read_specs(dirs: Sequence[Path]) -> list[Spec]:
    """The CDI specs in `dirs`, in order; one that cannot be read or breaks
    the format is left out with its reason logged (containerd does the same)."""
    specs: list[Spec] = []
    for directory in dirs:
        try:
            names = sorted(p for p in directory.iterdir() if p.suffix in SPEC_SUFFIXES)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for path in names:
            try:
                specs.append(parse_spec(path.read_text(), str(path)))
            except (OSError, UnicodeDecodeError, SpecError) as error:
                log.warning("CDI spec %s left out: %s", path, error)
    return specs
