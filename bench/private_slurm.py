"""A private Slurm for the benchmarks that need Slurm alone (no Kubernetes):
its state under /tmp, its daemons supervised, everything gone afterwards."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sunk_testbed.procs import Supervisor
from sunk_testbed.slurm_cluster import SlurmAccess, SlurmCluster


@contextmanager
def private_slurm(
    rootfs: Path, *, prefix: str, **cluster_options: Any
) -> Iterator[tuple[SlurmCluster, SlurmAccess]]:
    """A started `SlurmCluster` on `rootfs` (options as SlurmCluster takes them)
    and how to reach it; stopped and removed on the way out."""
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    supervisor = Supervisor(state)
    cluster = SlurmCluster(state, supervisor, rootfs, **cluster_options)
    try:
        yield cluster, cluster.start()
    finally:
        cluster.stop()
        supervisor.stop_all()
        shutil.rmtree(state, ignore_errors=True)
