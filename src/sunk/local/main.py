"""`sunk local nodes` and `sunk local logs`: the runtime as one foreground process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sunk.local.logs import find_log
from sunk.local.node import NodeConfig
from sunk.local.runtime import ControlPlaneIdentities, LocalRuntime, RuntimeConfig, cleanup
from sunk.local.runtime import running_elsewhere as _running_elsewhere

RUNTIME_DIR = "nodes"  # the runtime's state directory inside the bed's


def runtime_dir(bed_state: Path) -> Path:
    return bed_state / RUNTIME_DIR


def parse_labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"label {pair!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def node_configs(
    count: int, prefix: str, cpu: str, memory: str, pods: int, gpus: int, labels: dict[str, str]
) -> list[NodeConfig]:
    return [
        NodeConfig(f"{prefix}{i}", cpu=cpu, memory=memory, pods=pods, gpus=gpus, labels=labels)
        for i in range(1, count + 1)
    ]


def running_elsewhere(bed_state: Path) -> bool:
    return _running_elsewhere(runtime_dir(bed_state))


def clean(bed_state: Path) -> list[str]:
    if running_elsewhere(bed_state):
        raise RuntimeError(f"a local runtime runs on {runtime_dir(bed_state)}; stop it first")
    return cleanup(runtime_dir(bed_state))


def run_nodes(
    bed_state: Path,
    nodes: list[NodeConfig],
    *,
    keep_nodes: bool,
    log: Callable[[str], None],
) -> None:
    """Run the nodes until SIGINT/SIGTERM; then stop everything they started."""
    from sunk.testbed.kube import KubeControlPlane
    from sunk.testbed.procs import Supervisor
    from sunk.testbed.slurm import SlurmAccess, ensure_rootfs

    control_plane = KubeControlPlane(bed_state, Supervisor(bed_state))
    access = control_plane.access()
    if access is None:
        raise RuntimeError(f"no running control plane in {bed_state}: run `sunk local up` first")
    slurm_access = bed_state / "slurm" / "access.json"
    if slurm_access.exists():
        rootfs = SlurmAccess.from_json(slurm_access.read_text()).rootfs
    else:
        rootfs = ensure_rootfs()
    config = RuntimeConfig(
        state_dir=runtime_dir(bed_state), rootfs=rootfs, nodes=nodes, default_storage_class=True
    )
    runtime = LocalRuntime(config, ControlPlaneIdentities(control_plane, access.admin_kubeconfig))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        started = time.monotonic()
        await runtime.start()
        try:
            log(
                f"{len(nodes)} nodes up in {time.monotonic() - started:.1f}s: "
                f"{', '.join(n.name for n in nodes)}; pod network {runtime.subnet.network}, "
                f"gateway {runtime.gateway}"
            )
            await stop.wait()
            log("stopping")
        finally:
            await runtime.stop(delete_nodes=not keep_nodes)
            log("stopped; nothing left running")

    asyncio.run(main())


def print_logs(
    bed_state: Path,
    pod: str,
    namespace: str,
    container: str | None,
    previous: bool,
    follow: bool,
    warn: Callable[[str], None],
) -> None:
    found = find_log(runtime_dir(bed_state) / "pods", namespace, pod, container, previous)
    if found.defaulted_from:
        warn(f'Defaulted container "{found.container}" out of: {", ".join(found.defaulted_from)}')
    with found.path.open("rb") as handle:
        while True:
            chunk = handle.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                continue
            if not follow:
                return
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(0.2)


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
